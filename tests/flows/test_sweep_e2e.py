"""A sweep from docs/sweeps.md, end to end on a tiny config: two experiments queued with DVC's own queue
(a comma-separated -S), run with `flows.repro -- dvc exp run --run-all` (real Prefect, vLLM, DeepSpeed,
MLflow), then `flows.sweep` lists them from MLflow. Slow (two pipelines): `pytest -m slow`."""

from __future__ import annotations

import sqlite3

import pytest

from tests.flows.workspace import make_workspace, run

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_queued_sweep_runs_and_is_listed(tmp_path):
    ws = make_workspace(
        tmp_path, {"compare": {"algorithms": ["grpo"], "seeds": [0]}, "critic_warmup": {"episodes": 0}}
    )
    queued = run(["dvc", "exp", "run", "--queue", "-S", "train.kl_coef=0,0.05"], ws)
    assert queued.stdout.count("Queued experiment") == 2, queued.stdout
    out = run(
        ["python", "-m", "flows.repro", "--", "dvc", "exp", "run", "--run-all"], ws, timeout=3000
    ).stdout
    assert out.count("Running stage 'train@grpo-0'") == 2, out[-3000:]
    # the second experiment reuses the first one's SFT from DVC's run cache
    assert "Stage 'sft' is cached - skipping run" in out, out[-3000:]
    # both experiments' train runs are in this workspace's MLflow store (not their temporary copies')
    con = sqlite3.connect(ws / "mlflow/mlflow.db")
    exp_names = {
        v for (v,) in con.execute("select t.value from tags t join runs r on r.run_uuid = t.run_uuid "
                                  "where t.key = 'dvc.exp_name' and r.name = 'grpo-s0'")
    }  # fmt: skip
    assert len(exp_names) == 2, exp_names
    listed = run(["python", "-m", "flows.sweep"], ws).stdout
    assert "2 train runs in 2 DVC experiments. Settings that differ: `train.kl_coef`" in listed, listed
    for name in exp_names:
        assert f"| {name} | grpo |" in listed
    assert (ws / "reports/sweep.png").stat().st_size > 1000
