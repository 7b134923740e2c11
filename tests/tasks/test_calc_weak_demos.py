"""Weaker demonstrations of the calc task: short problems answered from mental arithmetic, no tool call."""

from __future__ import annotations

import json
import random

import pytest

from components.tasks.calc import demonstrations, make_env
from components.tasks.calc.generator import generate_problem, generate_splits, weak_messages

KW = dict(n_train=300, n_val=20, n_test=30, min_calls=1, max_calls=3, max_operand=99)


def test_weak_demo_by_hand():
    rng = random.Random(0)
    short, long = generate_problem(rng, 2, 99), generate_problem(rng, 3, 99)
    (weak,) = weak_messages(short, 2)
    lines = weak["content"].split("\n")
    assert weak["role"] == "assistant" and "tool_calls" not in weak and len(lines) == 3
    a, op, b, eq, r1 = lines[0].split()
    assert (
        eq == "="
        and int(r1)
        == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b), "/": int(a) // int(b)}[op]
    )
    assert lines[0].startswith(short.question.split()[2] + " ")  # the first number of the question
    assert lines[1].startswith(r1 + " ") and lines[2] == f"<answer>{short.answer}</answer>"
    assert weak_messages(long, 2) is None
    assert weak_messages(short, 0) is None


def test_weak_demos_only_in_train_only_for_short_problems_and_counted():
    out = generate_splits(seed=3, weak_max_calls=2, weak_per_question=1.5, **KW)
    for split in ("val", "test"):
        assert out[split]["weak"].null_count() == out[split].height
    copies = []
    for row in out["train"].iter_rows(named=True):
        assert (row["weak"] is not None) == (row["n_calls"] <= 2), row
        if row["weak"] is not None:
            copies.append(len(json.loads(row["weak"])))
    assert set(copies) == {1, 2} and 1.35 < sum(copies) / len(copies) < 1.65


def test_problems_do_not_depend_on_weak_params():
    plain = generate_splits(seed=3, **KW)
    weak = generate_splits(seed=3, weak_max_calls=3, weak_per_question=2.0, **KW)
    for name in ("train", "val", "test"):
        assert plain[name].drop("weak").equals(weak[name].drop("weak"))
    assert plain["train"]["weak"].null_count() == plain["train"].height
    assert weak["train"]["weak"].null_count() == 0  # every problem has at most 3 calls


def test_weak_demo_answers_right_in_the_env_without_a_tool_call():
    out = generate_splits(seed=5, weak_max_calls=2, weak_per_question=1.0, **KW)
    rows = out["train"].filter(out["train"]["weak"].is_not_null()).head(20).to_dicts()
    assert len(rows) == 20
    for row in rows:
        demos = demonstrations(row)
        assert demos[0] == json.loads(row["expert"]) and len(demos) == 2
        env = make_env(row)
        env.reset(row)
        step = env.step(demos[1][-1]["content"])
        assert step.done and step.reward == 1.0 and step.info.get("n_calls", 0) == 0


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(weak_max_calls=-1), "weak_max_calls"),
        (dict(weak_max_calls=1, weak_per_question=-1.0), "weak_per_question"),
    ],
)
def test_bad_weak_params_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        generate_splits(seed=0, **KW, **kw)


def test_bad_weak_column_is_named():
    row = {
        "id": "r1",
        "expert": json.dumps([{"role": "assistant", "content": "<answer>1</answer>"}]),
        "weak": json.dumps({"not": "a list"}),
    }
    with pytest.raises(ValueError, match="r1.*'weak'"):
        demonstrations(row)
