"""TextArena's Mastermind as a verifiers environment (components/tasks/verifiers/envs/mastermind.py)
through the verifiers task: offline, its solver's demonstrations, its rubric by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.tasks.verifiers.envs.mastermind import _score
from components.tasks.verifiers.params import VerifiersParams
from components.tasks.verifiers.recipe import demonstrations, initial_messages, make_env, make_splits


@pytest.fixture(scope="module")
def tables():
    import nltk

    def no_download(*args, **kwargs):  # the word games' nltk.download: Mastermind must not need it
        raise AssertionError(f"nltk.download{args} called")

    saved, nltk.download = nltk.download, no_download
    try:
        p = VerifiersParams()
        yield make_splits(p, seed=0, n_train=8, n_val=2, n_test=2, root=Path("."))
    finally:
        nltk.download = saved


def test_pegs_by_hand():
    assert _score((1, 2, 3), (3, 2, 5)) == (1, 1)
    assert _score((1, 2, 3), (1, 2, 3)) == (3, 0)
    assert _score((4, 5, 1), (2, 3, 5)) == (0, 1)


def test_the_solver_cracks_every_game_in_at_most_four_guesses(tables):
    for split in ("train", "val", "test"):
        for row in tables[split].iter_rows(named=True):
            # solved (1, weight 1) + progress of the last guess (1.0, weight 0.2)
            assert float(row["answer"]) == pytest.approx(1.2)
            assert 1 <= row["n_calls"] <= 4
            demo = demonstrations(row)[0]
            assert [m["role"] for m in demo][::2] == ["assistant"] * row["n_calls"]
    secrets = {json.loads(r["task"])["info"]["seed"] for r in tables["train"].iter_rows(named=True)}
    assert len(secrets) == 8  # distinct seeded games


def test_a_demonstration_replays_through_the_environment(tables):
    row = tables["test"].row(0, named=True)
    env = make_env()
    assert env.reset(row) == initial_messages(row)
    assert "3 digits long, each digit from 1 to 5" in initial_messages(row)[1]["content"]
    demo = demonstrations(row)[0]
    for i, message in enumerate(demo):
        if message["role"] != "assistant":
            continue
        out = env.step(message["content"])
        assert out.messages == demo[i + 1 : i + 1 + len(out.messages)]
    assert out.done and out.info["correct"] and out.reward == pytest.approx(1.2)
    numbers = json.loads(out.info["task_metrics"])
    assert numbers["reward/solved"] == 1.0 and numbers["metric/guesses"] == row["n_calls"]


def test_wrong_guesses_and_the_turn_limit(tables):
    row = tables["test"].row(0, named=True)
    env = make_env()
    env.reset(row)
    code = [m["content"] for m in demonstrations(row)[0] if m["role"] == "assistant"][-1]
    digits = [int(d) for d in code.strip("[]").split()]
    wrong = [d for d in range(1, 6) if d not in digits]
    guess = f"[{digits[1]} {digits[0]} {wrong[0]}]"  # two digits swapped, one absent
    out = env.step(guess)
    assert not out.done and "0 black peg(s), 2 white peg(s)" in out.messages[0]["content"]
    out = env.step("no brackets here")  # TextArena's invalid move: feedback, the game goes on
    assert not out.done and "invalid move" in out.messages[0]["content"].lower()


def test_the_mastermind_profile_is_valid_when_applied():
    import yaml

    from components.config import load_params

    repo = Path(__file__).resolve().parents[3]
    raw = yaml.safe_load((repo / "params.yaml").read_text())
    p = load_params(repo / "params.yaml", overrides=raw["profiles"]["mastermind"])
    assert p.task == "verifiers" and p.task_params.env.endswith("envs.mastermind")
    assert p.rollout.max_steps >= p.task_params.turns_needed() == p.task_params.max_turns == 8
    assert p.sft.rows < p.prepare.n_train and p.compare.algorithms == ["grpo", "ppo", "steppo", "gigpo"]
