"""benchmarks/babyai_sides.py: where the observation puts the goal object, and the probe's p(left)
read at the side token of every turn the bot makes (a rigged model that says left only right after
"turn" shows it reads that position and no other)."""

from __future__ import annotations

import json
import types

import pytest
import torch

from benchmarks.babyai_sides import goal_case, side_probe
from components.envs import get_task
from components.model.tiny import build_tiny_model
from components.model.tokenizer import build_tokenizer
from components.tasks.babyai.generator import make_splits
from components.tasks.babyai.params import BabyAIParams


@pytest.mark.parametrize(
    ("observation", "case"),
    [
        ("goal: go to the blue key\na grey ball 2 steps right\na blue key 3 steps left", "beside left"),
        ("goal: go to a red box\na red box 1 step right\na wall 2 steps forward", "beside right"),
        ("goal: go to a red box\na red box 2 steps forward and 1 step left", "in view"),
        ("goal: go to the blue key\na blue ball 1 step left\na wall 3 steps left", "hidden"),
        ("goal: go to the blue key\na blue key 2 steps forward", "in view"),
        ("no goal line here", "hidden"),
    ],
)
def test_goal_case(observation, case):
    assert goal_case(observation) == case


class SaysLeftAfterTurn(torch.nn.Module):
    """Logits that favour " left" where the last input token is "turn" and " right" everywhere else."""

    def __init__(self, model, turn: int, left: int):
        super().__init__()
        self.model, self.turn, self.left = model, turn, left

    def forward(self, ids):
        logits = torch.zeros(ids.shape[0], ids.shape[1], self.model.config.vocab_size)
        after_turn = ids == self.turn
        logits[..., self.left] = torch.where(after_turn, 5.0, -5.0)
        return types.SimpleNamespace(logits=logits)

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()


def test_the_probe_reads_the_side_token_of_every_turn(tmp_path):
    rows = make_splits(BabyAIParams(), seed=3, n_train=1, n_val=12, n_test=1, data_dir=tmp_path)[
        "val"
    ].to_dicts()
    spec = get_task("babyai")
    corpus = [m["content"] for r in rows for m in spec.initial_messages(r) + json.loads(r["expert"])]
    tok = build_tokenizer(corpus, vocab_size=400)
    base = build_tiny_model(tok, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                            head_dim=16, max_position_embeddings=1024, seed=0)  # fmt: skip
    ids = {w: tok.encode(w, add_special_tokens=False) for w in ("turn", " left", " right")}
    assert all(len(v) == 1 for v in ids.values())
    model = SaysLeftAfterTurn(base, ids["turn"][0], ids[" left"][0])
    out = side_probe(model, tok, rows, spec, window=2, max_len=1024)
    turns = [
        (goal_case(obs["content"]), "left" if "left" in act["content"] else "right")
        for r in rows
        for obs, act in zip(
            [m for m in spec.initial_messages(r) + json.loads(r["expert"]) if m["role"] == "user"],
            [m for m in json.loads(r["expert"]) if m["role"] == "assistant"],
        )
        if "turn" in act["content"]
    ]
    assert turns and sum(g["n"] for g in out["groups"].values()) == len(turns)
    for key, g in out["groups"].items():
        case, side = key.split(" / bot ")
        assert g["n"] == turns.count((case, side))
        assert g["chooses_left"] == 1.0 and g["p_left"] > 0.99
    beside = [t for t in turns if t[0].startswith("beside")]
    assert out["beside_n"] == len(beside)
    assert out["beside_accuracy"] == pytest.approx(sum(s == "left" for _, s in beside) / len(beside))
