"""ToolEnv end to end with scripted actions: rewards, done, info, and tools that fail in every way."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from components.envs.base import BaseTool, StepOutcome, ToolEnv, ToolResult, run_tool
from components.envs.parsing import format_tool_call
from components.tasks.calc import make_env
from components.tasks.calc.calculator import CalculatorTool
from components.tasks.calc.prompts import SYSTEM_PROMPT
from components.tasks.calc.reward import parse_answer, score

ROW = {
    "id": "r1",
    "question": "Tom has 5 boxes of 12 apples and buys 37 more. How many apples?",
    "answer": "97",
}


def calc(expr: Any) -> str:
    return format_tool_call("calculator", {"expression": expr})


def test_episode_valid_call_then_error_then_answer():
    env = make_env(ROW, malformed_penalty=0.1)
    first = env.reset(ROW)
    assert first == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": ROW["question"]},
    ]
    assert env.tools == [CalculatorTool().schema()]

    out = env.step(calc("5 * 12") + "<|im_end|>")
    assert isinstance(out, StepOutcome)
    assert out.messages == [{"role": "tool", "name": "calculator", "content": "60"}]
    assert (out.reward, out.done) == (0.0, False)
    assert out.info["n_calls"] == 1 and out.info["n_valid_calls"] == 1
    assert out.info["format_error"] is False and out.info["correct"] is False and out.info["answer"] is None

    out = env.step('<tool_call>\n{"name": "calculator", "arguments": {"expression": "60 + 37"}\n</tool_call>')
    assert out.done is False
    assert out.reward == pytest.approx(-0.1)
    assert out.info["format_error"] is True and out.info["n_calls"] == 1 and out.info["n_valid_calls"] == 0
    (msg,) = out.messages
    assert msg["role"] == "tool" and msg["content"].startswith("error: tool call is not valid JSON")

    out = env.step(calc("60 / 0"))  # a well-formed call whose execution fails: feedback, not a format error
    assert out.messages[0]["content"] == "error: division by zero"
    assert out.reward == 0.0 and out.info["format_error"] is False and out.info["n_tool_errors"] == 1

    out = env.step("<answer>97</answer>")
    assert out.done is True and out.messages == []
    assert out.reward == 1.0
    assert out.info["correct"] is True and out.info["answer"] == "97" and out.info["format_error"] is False
    assert out.info["n_calls"] == 0
    # the whole conversation is kept for inspection
    assert [m["role"] for m in env.history] == ["system", "user"] + ["assistant", "tool"] * 3 + ["assistant"]


@pytest.mark.parametrize(
    "final, reward, correct, answer, format_error",
    [
        ("<answer>96</answer>", 0.0, False, "96", False),
        ("<answer> 97.0 </answer>", 1.0, True, "97", False),
        ("I think it is 97", 0.0, False, None, True),
        ("<answer>ninety-seven</answer>", 0.0, False, None, True),
        ("", 0.0, False, None, True),
    ],
)
def test_final_answers(final, reward, correct, answer, format_error):
    env = make_env()
    env.reset(ROW)
    out = env.step(final)
    assert out.done and out.reward == reward
    assert (out.info["correct"], out.info["answer"], out.info["format_error"]) == (
        correct,
        answer,
        format_error,
    )


def test_several_calls_one_step_keep_order():
    env = make_env()
    env.reset(ROW)
    out = env.step(calc("5 * 12") + calc("x") + format_tool_call("search", {"q": "apples"}) + calc("60 + 37"))
    assert [m["content"] for m in out.messages] == [
        "60",
        "error: name 'x' is not allowed; use only numbers, + - * / // % ** and parentheses",
        "error: unknown tool 'search'; available tools: ['calculator']",
        "97",
    ]
    assert out.info["n_calls"] == 4 and out.info["n_valid_calls"] == 3 and out.info["format_error"] is True
    assert out.messages[2]["name"] == "search"


@pytest.mark.parametrize(
    "action",
    [
        calc("__import__('os').system('echo pwned')"),
        calc("9**9**9"),
        calc("99999999999999999999 * 9"),
        calc("1" * 1_000_000),
        calc(["5 * 12"]),
        "<tool_call>" + "[" * 100_000 + "</tool_call>",
        "<tool_call>" * 50_000,
        format_tool_call("calculator", {"expression": "\ud800"}),
        '<tool_call>\n{"name": "\\ud800", "arguments": {}}\n</tool_call>',
    ],
)
def test_hostile_actions_give_feedback_fast(action):
    env = make_env()
    env.reset(ROW)
    start = time.perf_counter()
    out = env.step(action)
    assert time.perf_counter() - start < 2.0
    assert out.done is False and out.messages
    for m in out.messages:
        assert m["content"].startswith("error: ")
        assert len(m["content"]) < 1200
        m["content"].encode("utf-8")  # no lone surrogates reach the tokenizer
        m["name"].encode("utf-8")
    json.dumps(out.messages)


class SlowTool(BaseTool):
    name = "slow"
    description = "sleeps"
    parameters = {"type": "object", "properties": {}}

    def execute(self, args):
        time.sleep(3)
        return ToolResult("late")


class BoomTool(BaseTool):
    name = "boom"
    description = "raises"
    parameters = {"type": "object", "properties": {}}

    def execute(self, args):
        raise RuntimeError("kaboom " * 1000)


class LoudTool(BaseTool):
    name = "loud"
    description = "prints a lot and gives a process reward"
    parameters = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}, "required": ["n"]}

    def execute(self, args):
        return ToolResult("z" * args["n"], reward=0.25)


class WrongTypeTool(BaseTool):
    name = "wrong"
    description = "returns an int"
    parameters = {"type": "object", "properties": {}}

    def execute(self, args):
        return 42


class NanRewardTool(BaseTool):
    name = "nan"
    description = "returns a NaN reward"
    parameters = {"type": "object", "properties": {}}

    def execute(self, args):
        return ToolResult("ok", reward=float("nan"))


def make_toy_env(**kw) -> ToolEnv:
    tools = [SlowTool(), BoomTool(), LoudTool(), WrongTypeTool(), NanRewardTool()]
    return ToolEnv(tools, score, "sys", answer_fn=parse_answer, tool_timeout_s=0.2, max_output_chars=50, **kw)


def test_tool_timeout_exception_size_and_type_are_contained():
    env = make_toy_env()
    env.reset({"question": "q", "answer": "1"})
    start = time.perf_counter()
    out = env.step(
        format_tool_call("slow", {})
        + format_tool_call("boom", {})
        + format_tool_call("loud", {"n": 10_000})
        + format_tool_call("wrong", {})
        + format_tool_call("nan", {})
        + format_tool_call("loud", {"n": 3})
    )
    assert time.perf_counter() - start < 1.5
    texts = [m["content"] for m in out.messages]
    assert texts[0] == "error: slow timed out after 0.2 s"
    assert texts[1].startswith("error: boom failed: RuntimeError: kaboom") and len(texts[1]) < 300
    assert texts[2] == "z" * 50 + "... [output cut: 9950 more chars]"
    assert texts[3] == "error: wrong returned int, not a ToolResult"
    assert texts[4] == "error: nan gave a non-finite reward nan"
    assert texts[5] == "zzz"
    assert out.reward == pytest.approx(0.5)  # two process rewards of 0.25
    assert out.info["n_tool_errors"] == 4 and out.info["format_error"] is False


def test_schema_validation_happens_before_execute():
    env = make_toy_env(malformed_penalty=0.5)
    env.reset({"question": "q", "answer": "1"})
    out = env.step(format_tool_call("loud", {"n": -1}))
    assert out.messages[0]["content"].startswith("error: invalid arguments for loud")
    assert out.reward == -0.5 and out.info["n_valid_calls"] == 0


def test_run_tool_directly():
    res = run_tool(LoudTool(), {"n": 2}, timeout_s=1.0, max_output_chars=10)
    assert res == ToolResult("zz", 0.25, False)


def test_misuse_raises():
    env = make_env()
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("<answer>1</answer>")
    with pytest.raises(KeyError, match="no 'answer' column"):
        env.reset({"question": "q"})
    env.reset(ROW)
    env.step("<answer>1</answer>")
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("<answer>1</answer>")
    env.reset(ROW)  # a new episode works
    assert env.step("<answer>97</answer>").reward == 1.0


def test_constructor_rejects_bad_settings():
    with pytest.raises(ValueError, match="unique"):
        ToolEnv([CalculatorTool(), CalculatorTool()], score, "s", answer_fn=parse_answer)
    with pytest.raises(ValueError, match="malformed_penalty"):
        ToolEnv([CalculatorTool()], score, "s", answer_fn=parse_answer, malformed_penalty=-1)


def test_reward_fn_failure_is_reported_not_raised():
    def bad_reward(text, truth):
        raise ZeroDivisionError("bug")

    env = ToolEnv([CalculatorTool()], bad_reward, "s", answer_fn=parse_answer)
    env.reset(ROW)
    out = env.step("<answer>97</answer>")
    assert out.done and out.reward == 0.0 and out.info["reward_error"] == "ZeroDivisionError: bug"
