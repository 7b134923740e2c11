"""The toy plug-in task on its own: its expert scores 1 in its env, its params section and its
episode_metrics hook (the pipeline run is tests/flows/test_task_plugin.py)."""

from __future__ import annotations

import pytest

from components.envs import get_task
from tests.tasks import toy_task


def test_expert_replayed_through_the_env_scores_one():
    recipe = get_task("toy")
    assert recipe is toy_task.RECIPE
    splits = recipe.prepare({"word_len": 2, "copies": 2}, seed=1, n_train=6, n_val=2, n_test=2)
    row = splits["test"].row(0, named=True)
    env = recipe.make_env(row)
    assert env.reset(row) == recipe.initial_messages(row)
    expert = recipe.expert_messages(row)
    call = expert[0]["tool_calls"][0]["function"]
    text = f'<tool_call>\n{{"name": "{call["name"]}", "arguments": {{"text": "{call["arguments"]["text"]}"}}}}\n</tool_call>'
    out = env.step(text)
    assert not out.done and out.messages[0]["content"] == row["answer"]
    final = env.step(expert[-1]["content"])
    assert final.done and final.reward == 1.0
    assert len(recipe.demonstrations(row)) == 3


def test_episode_metrics_hook_and_params_errors():
    steps = [
        {
            "traj_id": "a",
            "group_id": "g",
            "step": 0,
            "n_calls": 1,
            "correct": False,
            "done": False,
            "truncated": False,
            "format_error": False,
        },
        {
            "traj_id": "a",
            "group_id": "g",
            "step": 1,
            "n_calls": 0,
            "correct": True,
            "done": True,
            "truncated": False,
            "format_error": False,
        },
        {
            "traj_id": "b",
            "group_id": "g",
            "step": 0,
            "n_calls": 0,
            "correct": False,
            "done": True,
            "truncated": False,
            "format_error": False,
        },
    ]
    assert get_task("toy").task_metrics(steps) == {"shout_rate": 0.5}
    assert get_task("toy").task_metrics([]) == {}
    with pytest.raises(ValueError, match=r"tasks\.toy\.word_len=1 has fewer than 20 distinct words"):
        get_task("toy").prepare({"word_len": 1}, seed=0, n_train=10, n_val=5, n_test=5)
