"""A task is a plug-in: the toy task of tests/tasks/toy_task.py, which lives only under tests/, runs
through the real stages prepare -> base_model -> sft -> train (one RL iteration) in a throwaway copy of
the repo, registered by `plugins: [tests.tasks.toy_task]` and configured by its own `tasks.toy`
section. Nothing in components/ or flows/ knows it.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from tests.flows.workspace import run, sft_workspace

# Four stage processes, about 2.5 minutes on 2 cores: a second end-to-end pass beside
# test_pipeline_e2e's, so outside the default run (`make test-all`); the toy task's own pieces are
# tested fast in tests/tasks/test_toy_task.py.
pytestmark = pytest.mark.slow

TOY = {
    "task": "toy",
    "plugins": ["tests.tasks.toy_task"],
    "tasks": {"toy": {"word_len": 3, "copies": 1}},
    "prepare": {"n_train": 40, "n_val": 4, "n_test": 4},
    "sft": {"steps": 3, "batch_size": 8, "micro_batch_size": 8, "warmup_steps": 1, "rows": 24},
    "rollout": {"engine": "hf", "max_steps": 2, "max_response_len": 24},
    "train": {
        "iterations": 1,
        "trajectories_per_iteration": 4,
        "mini_batch_size": 8,
        "micro_batch_size": 4,
        "val_samples": 2,
        "val_every": 1,
    },
    "algorithms": {"grpo": {"preset": "grpo", "samples_per_prompt": 2}},
    "compare": {"algorithms": ["grpo"], "seeds": [0]},
}


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = sft_workspace(tmp_path_factory.mktemp("toy_task"), TOY, timeout=600)
    run(["python", "-m", "flows.train", "--algo", "grpo", "--rl-seed", "0"], root, timeout=900)
    return root


def test_toy_task_runs_prepare_sft_and_one_rl_iteration(ws):
    data = ws / "data/processed/toy"
    train = pl.read_parquet(data / "train.parquet")
    assert train.height == 40 and set(train["copies"]) == {1}  # the toy section reached the task
    assert train["question"][0].startswith("Shout the word: ") and len(train["answer"][0]) == 3
    assert (ws / "models/sft/steprl_complete.json").is_file()
    sft = json.loads((ws / "metrics/sft.json").read_text())
    assert sft  # SFT ran on the toy demonstrations
    rollouts = pl.read_parquet(ws / "runs/grpo-s0/iter_0000/rollouts.parquet")
    assert rollouts["traj_id"].n_unique() == 4 and rollouts["group_id"].n_unique() == 2
    assert set(rollouts["step"]) <= {0, 1}  # rollout.max_steps 2, the toy env's steps
    summary = json.loads((ws / "metrics/train_grpo-s0.json").read_text())
    assert summary["iterations"] == 1
    history = json.loads((ws / "runs/grpo-s0/iter_0000/metrics.json").read_text())
    assert 0.0 <= history["task/shout_rate"] <= 1.0  # the recipe's episode_metrics hook, logged by train
    assert "val/shout_rate" in history
