"""Registries: lookup, unknown names listing the valid ones, duplicates, task autoloading; every
registry of the project is the one Registry type."""

from __future__ import annotations

import pytest

import components.tasks.calc  # noqa: F401  (registers the calculator tool)
from components.envs import ToolEnv, get_env, get_task, get_tool
from components.registry import Registry, UnknownNameError
from components.tasks.recipe import TaskRecipe


def test_register_and_get():
    reg = Registry("widget")

    @reg.register("a")
    class A:
        pass

    reg.register("b", 42)
    assert reg.get("a") is A and reg.get("b") == 42 and reg.names() == ["a", "b"]
    assert "a" in reg and "z" not in reg


def test_unknown_name_lists_valid_names():
    reg = Registry("widget")
    reg.register("alpha", 1)
    reg.register("beta", 2)
    with pytest.raises(UnknownNameError) as err:
        reg.get("gamma")
    assert str(err.value) == "unknown widget 'gamma'; valid: ['alpha', 'beta']"
    assert isinstance(err.value, KeyError)


def test_duplicate_registration():
    reg = Registry("widget")
    reg.register("a", 1)
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.register("a", 2)
    reg.register("a", 2, replace=True)
    assert reg.get("a") == 2
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register("", 3)


def test_task_calc_is_autoloaded_with_everything_a_pipeline_needs():
    recipe = get_task("calc")
    assert isinstance(recipe, TaskRecipe) and recipe.name == "calc"
    splits = recipe.prepare({"max_calls": 2, "max_operand": 20}, seed=0, n_train=6, n_val=2, n_test=2)
    row = splits["train"].row(0, named=True)
    assert recipe.initial_messages(row)[1] == {"role": "user", "content": row["question"]}
    expert = recipe.expert_messages(row)
    env = recipe.make_env(row)
    assert env.reset(row) == recipe.initial_messages(row)
    assert recipe.tools() == env.tools
    assert recipe.reward(expert[-1]["content"], row["answer"]) == 1.0


def test_task_prepare_from_file():
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "gsm8k_sample.parquet"
    recipe = get_task("calc")
    splits = recipe.prepare({"source_path": str(path)}, seed=0, n_train=10, n_val=1, n_test=1)
    assert [splits[k].height for k in ("train", "val", "test")] == [6, 1, 1]
    # a relative path is from `root`; a missing file names the params key
    rel = recipe.prepare({"source_path": path.name}, seed=0, n_train=10, n_val=1, n_test=1, root=path.parent)
    assert rel["train"].equals(splits["train"])
    with pytest.raises(ValueError, match=r"tasks\.calc\.source_path: 'nope\.jsonl' does not exist"):
        recipe.prepare({"source_path": "nope.jsonl"}, seed=0, n_train=10, n_val=1, n_test=1, root=path.parent)


@pytest.mark.parametrize("name", ["nope", "../etc", "calc.calculator", "recipe"])
def test_unknown_task(name):
    with pytest.raises(UnknownNameError, match=r"unknown task .*; valid: \[.*'calc'.*\]") as err:
        get_task(name)
    assert "'recipe'" not in str(err.value).split("valid:")[1]  # modules that are not task folders


def test_every_registry_is_the_one_type():
    from components.algos import ADVANTAGE_ESTIMATORS, AGG_MODES, KL_ESTIMATORS, POLICY_LOSSES, PRESETS
    from components.envs import ENVS, TASKS, TOOLS

    for reg in (ADVANTAGE_ESTIMATORS, AGG_MODES, KL_ESTIMATORS, POLICY_LOSSES, PRESETS, ENVS, TASKS, TOOLS):
        assert isinstance(reg, Registry)
        with pytest.raises(UnknownNameError, match=rf"unknown {reg.kind} 'zzz'; valid: \["):
            reg.get("zzz")
    assert AGG_MODES.names() == sorted(
        [
            "token-mean",
            "seq-mean-token-mean",
            "seq-mean-token-sum",
            "seq-mean-token-sum-norm",
            "traj-mean-token-mean",
        ]
    )
    assert "grpo" in ADVANTAGE_ESTIMATORS and ADVANTAGE_ESTIMATORS["grpo"].needs_groups
    assert "nope" not in PRESETS and 3 not in PRESETS


def test_env_and_tool_registries():
    assert get_env("tool") is ToolEnv
    assert get_tool("calculator")().name == "calculator"
    with pytest.raises(UnknownNameError, match=r"unknown tool 'abacus'; valid: \[.*'calculator'.*\]"):
        get_tool("abacus")
