"""The calc generator: deterministic, disjoint splits, and expert trajectories that replay exactly."""

from __future__ import annotations

import json
import random
import re

import pytest

from components.envs.parsing import format_tool_call
from components.schemas import TaskSchema, validate_table
from components.tasks.calc import make_env
from components.tasks.calc.calculator import calculate
from components.tasks.calc.generator import generate_problem, generate_splits

KW = dict(n_train=150, n_val=20, n_test=30, min_calls=1, max_calls=3, max_operand=99)


@pytest.fixture(scope="module")
def splits():
    return generate_splits(seed=7, **KW)


def test_same_seed_same_frames(splits):
    again = generate_splits(seed=7, **KW)
    for name in ("train", "val", "test"):
        assert splits[name].equals(again[name])


def test_different_seed_different_questions(splits):
    other = generate_splits(seed=8, **KW)
    for name in ("train", "val", "test"):
        assert set(splits[name]["question"]) != set(other[name]["question"])
        assert len(set(splits[name]["question"]) & set(other[name]["question"])) < 5


def test_shapes_schema_and_ids(splits):
    assert list(splits) == ["train", "val", "test"]
    for name, df in splits.items():
        assert df.height == KW[f"n_{name}"]
        assert set(df["split"]) == {name}
        validate_table(df, TaskSchema, name)
        assert df["id"].n_unique() == df.height


def test_splits_are_disjoint(splits):
    questions = [set(df["question"]) for df in splits.values()]
    for i in range(3):
        assert len(questions[i]) == splits[list(splits)[i]].height  # unique inside a split too
        for j in range(i + 1, 3):
            assert not questions[i] & questions[j]


def test_test_split_does_not_depend_on_n_train(splits):
    bigger = generate_splits(seed=7, **{**KW, "n_train": 300})
    assert bigger["test"].equals(splits["test"]) and bigger["val"].equals(splits["val"])


def test_call_counts_and_operands(splits):
    df = splits["train"]
    counts = df["n_calls"].to_list()
    assert min(counts) == 1 and max(counts) == 3  # the whole range is used
    for row in df.iter_rows(named=True):
        expert = json.loads(row["expert"])
        calls = [m for m in expert if m.get("tool_calls")]
        assert len(calls) == row["n_calls"]
        numbers = [int(n) for n in re.findall(r"\d+", row["question"])]
        assert numbers and max(numbers) <= 99
        assert len(numbers) == row["n_calls"] + 1  # one start number + one per calculator call
        assert int(row["answer"]) >= 1
        assert len(row["question"]) < 60 * (row["n_calls"] + 2)


def test_expert_replays_through_the_real_calculator(splits):
    """Every tool result in the expert equals the calculator's output; the final answer equals the truth."""
    for df in splits.values():
        for row in df.iter_rows(named=True):
            expert = json.loads(row["expert"])
            assert expert[-1] == {"role": "assistant", "content": f"<answer>{row['answer']}</answer>"}
            previous = None
            for call, result in zip(expert[:-1:2], expert[1:-1:2]):
                (tc,) = call["tool_calls"]
                expr = tc["function"]["arguments"]["expression"]
                assert tc["function"]["name"] == "calculator" and call["content"] == ""
                assert result["role"] == "tool" and result["name"] == "calculator"
                assert calculate(expr).text == result["content"]
                left = expr.split(" ")[0]
                if previous is not None:
                    assert left == previous  # each call uses the previous result
                previous = result["content"]
            assert previous == row["answer"]


def test_expert_played_in_the_env_earns_full_reward(splits):
    for row in splits["test"].head(10).iter_rows(named=True):
        env = make_env(row)
        env.reset(row)
        expert = json.loads(row["expert"])
        for call, result in zip(expert[:-1:2], expert[1:-1:2]):
            fn = call["tool_calls"][0]["function"]
            out = env.step(format_tool_call(fn["name"], fn["arguments"]))
            assert out.messages == [result] and out.reward == 0.0 and not out.done
        out = env.step(expert[-1]["content"])
        assert out.done and out.reward == 1.0 and out.info["correct"]


def test_longer_chains_and_large_operands_stay_in_range():
    out = generate_splits(seed=1, n_train=200, n_val=1, n_test=1, min_calls=4, max_calls=8, max_operand=10**6)
    for row in out["train"].iter_rows(named=True):
        assert 4 <= row["n_calls"] <= 8
        expert = json.loads(row["expert"])
        for m in expert[1:-1:2]:
            assert 1 <= int(m["content"]) <= 10**12 * 10**6
            assert not calculate(m["content"]).is_error


def test_generate_problem_by_hand():
    p = generate_problem(random.Random(3), n_calls=2, max_operand=9)
    assert p.n_calls == 2 and len(p.expert) == 5
    assert p.question.endswith("have now?")


def test_impossible_request_is_a_clear_error():
    with pytest.raises(ValueError, match="could only generate .* unique"):
        generate_splits(seed=0, n_train=5000, n_val=1, n_test=1, min_calls=1, max_calls=1, max_operand=2)
    with pytest.raises(ValueError, match="min_calls"):
        generate_splits(seed=0, n_train=5, n_val=1, n_test=1, min_calls=3, max_calls=2, max_operand=9)
