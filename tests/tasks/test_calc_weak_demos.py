"""Weaker demonstrations of the calc task: mental arithmetic instead of the calculator, same answers."""

from __future__ import annotations

import json

import pytest

from components.envs.parsing import format_tool_call
from components.tasks.calc import demonstrations, make_env
from components.tasks.calc.generator import Problem, generate_splits, weak_messages

KW = dict(n_train=300, n_val=20, n_test=30, min_calls=1, max_calls=3, max_operand=99)


def _calls(messages: list[dict]) -> list[str]:
    return [m["tool_calls"][0]["function"]["arguments"]["expression"] for m in messages if m.get("tool_calls")]


def _problem(start: int, ops: list[tuple[str, int]]) -> Problem:
    value, steps = start, []
    for op, n in ops:
        result = {"add": value + n, "sub": value - n, "mul": value * n, "div": value // n}[op]
        steps.append((op, value, n, result))
        value = result
    return Problem("q", str(value), [], len(ops), start, tuple(steps))


def test_weak_demo_by_hand():
    # 12 + 5 = 17 in the head, then 17 * 3 with the calculator
    p = _problem(12, [("add", 5), ("mul", 3)])
    weak = weak_messages(p, {"add", "sub"})
    assert _calls(weak) == ["17 * 3"]
    assert weak[1] == {"role": "tool", "name": "calculator", "content": "51"}
    assert weak[-1]["content"] == "<answer>51</answer>"
    # 12 * 3 with the calculator, then + 5 in the head: the answer is not the last tool result
    p = _problem(12, [("mul", 3), ("add", 5)])
    weak = weak_messages(p, {"add"})
    assert _calls(weak) == ["12 * 3"] and weak[-1]["content"] == "<answer>41</answer>"
    # every op in the head: a tool-free answer
    assert weak_messages(_problem(7, [("add", 1), ("sub", 2)]), {"add", "sub"}) == [
        {"role": "assistant", "content": "<answer>6</answer>"}]
    # nothing to do in the head: no weak demonstration
    assert weak_messages(_problem(7, [("mul", 2), ("div", 7)]), {"add", "sub"}) is None


def test_weak_demos_only_in_train_and_counted():
    out = generate_splits(seed=3, weak_ops=("add", "sub"), weak_per_question=1.5, **KW)
    assert out["val"]["weak"].null_count() == out["val"].height
    assert out["test"]["weak"].null_count() == out["test"].height
    copies = [len(json.loads(w)) for w in out["train"]["weak"].drop_nulls()]
    assert set(copies) <= {1, 2} and 1.3 < sum(copies) / len(copies) < 1.7
    # questions without an add/sub have no weak demonstration, all others have at least one
    for row in out["train"].iter_rows(named=True):
        has_easy = any(c.split()[1] in "+-" for c in _calls(json.loads(row["expert"])))
        assert (row["weak"] is not None) == has_easy


def test_problems_do_not_depend_on_weak_params():
    plain = generate_splits(seed=3, **KW)
    weak = generate_splits(seed=3, weak_ops=("add",), weak_per_question=2.0, **KW)
    for name in ("train", "val", "test"):
        assert plain[name].drop("weak").equals(weak[name].drop("weak"))
    assert plain["train"]["weak"].null_count() == plain["train"].height


def test_weak_demo_plays_in_the_env_to_full_reward():
    out = generate_splits(seed=5, weak_ops=("add", "sub"), weak_per_question=1.0, **KW)
    played = 0
    for row in out["train"].filter(out["train"]["weak"].is_not_null()).head(20).iter_rows(named=True):
        demos = demonstrations(row)
        assert demos[0] == json.loads(row["expert"]) and len(demos) == 2
        weak = demos[1]
        env = make_env(row)
        env.reset(row)
        for call, result in zip(weak[:-1:2], weak[1:-1:2]):
            fn = call["tool_calls"][0]["function"]
            step = env.step(format_tool_call(fn["name"], fn["arguments"]))
            assert step.messages == [result]
        final = env.step(weak[-1]["content"])
        assert final.done and final.reward == 1.0
        assert len(_calls(weak)) < row["n_calls"]
        played += 1
    assert played == 20


@pytest.mark.parametrize("kw, match", [
    (dict(weak_ops=("pow",)), "unknown operations"),
    (dict(weak_ops=("add",), weak_per_question=-1.0), "weak_per_question"),
])
def test_bad_weak_params_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        generate_splits(seed=0, **KW, **kw)


def test_bad_weak_column_is_named():
    row = {"id": "r1", "expert": json.dumps([{"role": "assistant", "content": "<answer>1</answer>"}]),
           "weak": json.dumps({"not": "a list"})}
    with pytest.raises(ValueError, match="r1.*'weak'"):
        demonstrations(row)
