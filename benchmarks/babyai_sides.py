"""Does a babyai model tell left from right? Its choice of side after "turn", teacher-forced on the
bot's demonstrations, by what the observation says of the goal object.

    python benchmarks/babyai_sides.py [--models sft,base] [--split val] [--levels 150] [--out sides.json]

Run after `make repro PROFILE=babyai` has built models/sft (any model directory under models/, or a
path, works). For each level of ``--split`` (its first ``--levels`` rows) it encodes the expert
demonstration as SFT does (one example per turn, the profile's ``rollout.context_window``), and at
every turn where the bot turns it reads the model's next-token distribution after
``<action>turn``: p(left) / (p(left) + p(right)). The turns are grouped by what the observation says
of the goal object: beside the agent ("a red ball 2 steps left", the side decides the right
action), in view elsewhere, or out of view (the bot's turn then follows its own memory of the
room); and by the bot's side. A model that reads the observation puts p(left) high where the bot
turns left and low where it turns right, at least where the goal is beside it; one that has learnt
only the marginal shows the same p(left) in every row. Also printed: the cosine of the input
embeddings of " left" and " right" (the embedded default ties them to the output layer).
docs/tasks/babyai.md, "Left and right", has the figures of 2026-11-28 and -29.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict

import polars as pl
import torch

from components.config import load_params
from components.envs import get_task
from components.model.sft_data import IGNORE_INDEX, encode_turns
from components.model.tiny import load_hf
from flows import REPO, processed

GOAL = re.compile(r"goal: go to (?:a|the) (\w+ \w+)")


def goal_case(observation: str) -> str:
    """Where the observation puts the goal object: 'beside left' / 'beside right', 'in view', 'hidden'."""
    lines = observation.split("\n")
    goal = GOAL.match(lines[0])
    if goal is None:
        return "hidden"
    mine = [ln for ln in lines[1:] if ln.startswith(f"a {goal.group(1)} ")]
    for ln in mine:
        beside = re.fullmatch(rf"a {goal.group(1)} \d+ steps? (left|right)", ln)
        if beside:
            return f"beside {beside.group(1)}"
    return "in view" if mine else "hidden"


def side_probe(model, tok, rows: list[dict], spec, window: int, max_len: int) -> dict:
    """p(left) after ``<action>turn`` per (goal case, bot's side) over the expert demonstrations of ``rows``."""
    left, right = (tok.encode(w, add_special_tokens=False) for w in (" left", " right"))
    if len(left) != 1 or len(right) != 1:
        raise ValueError(f"' left' / ' right' are not single tokens of this tokenizer ({left}, {right})")
    left, right = left[0], right[0]
    p_left: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in rows:
        messages = spec.initial_messages(row) + spec.demonstrations(row)[0]
        actions = [m["content"] for m in messages if m["role"] == "assistant"]
        observations = [m["content"] for m in messages if m["role"] == "user"]
        for i, example in enumerate(
            encode_turns(tok, messages, spec.tools(), max_len, context_window=window)
        ):
            side = re.search(r"turn (left|right)", actions[i])
            if example is None or side is None:
                continue
            ids, labels = example
            response = [j for j, label in enumerate(labels) if label != IGNORE_INDEX]
            at = next(j for j in response if labels[j] in (left, right))  # the side token's position
            with torch.no_grad():
                probs = model(torch.tensor([ids[:at]])).logits[0, -1].softmax(-1)
            p_left[(goal_case(observations[i]), side.group(1))].append(
                (probs[left] / (probs[left] + probs[right])).item()
            )
    emb = model.get_input_embeddings().weight
    groups = {
        f"{case} / bot {side}": {
            "n": len(v),
            "p_left": statistics.mean(v),
            "chooses_left": sum(p > 0.5 for p in v) / len(v),
        }
        for (case, side), v in sorted(p_left.items())
    }
    beside = [
        (p > 0.5) == (side == "left")
        for (case, side), v in p_left.items()
        if case.startswith("beside")
        for p in v
    ]
    return {
        "groups": groups,
        "beside_accuracy": sum(beside) / len(beside) if beside else None,
        "beside_n": len(beside),
        "cos_left_right": torch.nn.functional.cosine_similarity(emb[left], emb[right], dim=0).item(),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="sft,base")
    ap.add_argument("--split", default="val", choices=["train", "val", "test"])
    ap.add_argument("--levels", type=int, default=150)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    params = load_params(
        REPO / "params.yaml", overrides=dict(load_params(REPO / "params.yaml").profiles["babyai"])
    )
    spec = get_task(params.task)
    rows = pl.read_parquet(processed(params.task) / f"{args.split}.parquet").to_dicts()[: args.levels]
    out = {}
    for name in args.models.split(","):
        model, tok = load_hf(REPO / "models" / name if "/" not in name else name)
        res = side_probe(model.eval(), tok, rows, spec, params.rollout.context_window, params.sft.max_len)
        out[name] = res
        print(
            f"\n{name}: cos(E[left], E[right]) {res['cos_left_right']:.3f}; side right where the goal is beside: "
            f"{res['beside_accuracy']:.3f} of {res['beside_n']} turns"
        )
        print(f"  {'goal / bot turns':28s} {'turns':>5s} {'p(left)':>8s} {'chooses left':>12s}")
        for k, g in res["groups"].items():
            print(f"  {k:28s} {g['n']:5d} {g['p_left']:8.3f} {g['chooses_left']:12.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
