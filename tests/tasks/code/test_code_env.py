"""The code environment on hand-written replies: a right answer, a traceback then a fix, a wrong
print, a malformed call; and the recipe registered under ``code``."""

from __future__ import annotations

import json

import pytest

from components.envs.parsing import format_tool_call
from components.envs.registry import get_task, get_tool
from components.tasks.code import CodeEnv, PythonTool

ROW = {  # an item of reasoning-gym's gcd generator
    "id": "t-0",
    "question": "Find the Greatest Common Divisor (GCD) of these numbers: 84, 36. Give only the GCD as your final answer.",
    "answer": "12",
    "generator": "gcd",
    "metadata": json.dumps({"source_dataset": "gcd", "source_index": 0, "numbers": [84, 36], "result": 12}),
}


@pytest.fixture
def env(sandbox):
    env = CodeEnv(PythonTool(sandbox))
    env.reset(ROW)
    return env


def call(code: str) -> str:
    return format_tool_call("python", {"code": code})


def test_right_answer(env):
    out = env.step(call("import math\nprint(math.gcd(84, 36))"))
    assert not out.done and out.messages[0]["content"] == "12" and out.info["n_tool_errors"] == 0
    out = env.step("<answer>12</answer>")
    assert out.done and out.reward == 1.0 and out.info["correct"]


def test_traceback_then_fix(env):
    out = env.step(call("print(math.gcd(84, 36))"))
    assert (
        out.messages[0]["content"] == "NameError: name 'math' is not defined"
        and out.info["n_tool_errors"] == 1
    )
    out = env.step(call("import math\nprint(math.gcd(84, 36))"))
    assert out.messages[0]["content"] == "12"
    assert env.step("<answer> 12 </answer>").reward == 1.0


def test_wrong_print_then_wrong_answer(env):
    assert env.step(call("print(84 % 36)")).messages[0]["content"] == "12"
    out = env.step("<answer>6</answer>")
    assert out.done and out.reward == 0.0 and not out.info["correct"]


def test_malformed_call_is_feedback(env):
    out = env.step('<tool_call>\n{"name": "python", "arguments": {"cod": "print(1)"}}\n</tool_call>')
    assert out.info["format_error"] and "invalid arguments for python" in out.messages[0]["content"]
    out = env.step("<tool_call>not json</tool_call>")
    assert out.info["format_error"] and "not valid JSON" in out.messages[0]["content"]
    assert env.step("12").info["format_error"]  # no <answer>: not well formed


@pytest.mark.parametrize("column", ["generator", "metadata"])
def test_a_row_without_generator_or_metadata_is_refused(sandbox, column):
    with pytest.raises(KeyError, match=column):
        CodeEnv(PythonTool(sandbox)).reset({k: v for k, v in ROW.items() if k != column})


def test_recipe_registered_with_its_tool(tmp_path):
    recipe = get_task("code")
    assert recipe.name == "code" and get_tool("python") is PythonTool
    assert [t["function"]["name"] for t in recipe.tools()] == ["python"]
    splits = recipe.prepare(
        {"wall_s": 2.0, "workers": 2}, seed=0, n_train=4, n_val=1, n_test=1, data_dir=tmp_path
    )
    assert json.loads((tmp_path / "sandbox.json").read_text())["limits"]["wall_s"] == 2.0
    env = recipe.make_env(data_dir=tmp_path)
    row = splits["test"].row(0, named=True)
    assert env.reset(row) == recipe.initial_messages(row)
    assert env.tool_timeout_s > 2.0
    # the agent loop steps as many episodes at once as the sandbox runs programs
    assert env.concurrent_steps == env._tools["python"].sandbox.workers == 2
    assert recipe.params({}).turns_needed() == 3
