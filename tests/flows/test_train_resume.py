"""Killing `train` mid-iteration and rerunning it resumes at the first unfinished task.

Finished iterations are not recomputed, the unfinished iteration's finished tasks are Prefect cache
hits, MLflow gets every iteration's metrics and the SFT validation's (step -1) exactly once, and the resumed run ends where an
uninterrupted run ends (same rollouts in the last iteration).
"""

from __future__ import annotations

import sqlite3

import polars as pl
import pytest

from tests.flows.workspace import kill_when_written, run, sft_workspace

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

ALGO, SEED = "ppo", 0
NAME = f"{ALGO}-s{SEED}"  # the run's name: runs/<NAME>/, MLflow run <NAME>
TRAIN = {
    "train": {
        "iterations": 3,
        "trajectories_per_iteration": 8,
        "mini_batch_size": 24,  # every step row in one optimizer step (old_logprobs: detached)
        "micro_batch_size": 4,
        "val_samples": 4,
        "val_every": 10,
    }
}


def _prepared(root):
    return sft_workspace(root, TRAIN)


def _train(ws, **kw):
    return run(
        ["python", "-m", "flows.train", "--algo", ALGO, "--rl-seed", str(SEED)], ws, timeout=1200, **kw
    )


def test_kill_mid_iteration_then_resume(tmp_path):
    ws = _prepared(tmp_path / "a")
    target = ws / "runs" / NAME / "iter_0001" / "batch.parquet"
    train = ["python", "-m", "flows.train", "--algo", ALGO, "--rl-seed", str(SEED)]
    assert kill_when_written(train, ws, target, poll=0.2), "train never reached iteration 1"
    first = ws / "runs" / NAME / "iter_0000" / "rollouts.parquet"
    before = first.stat().st_mtime_ns

    out = _train(ws)
    log = out.stdout + out.stderr
    assert f"{NAME}: resuming after iteration 0" in log
    assert first.stat().st_mtime_ns == before, "a finished iteration was recomputed"
    for name in ("rollout", "score", "advantage"):
        assert any(line for line in log.splitlines() if f"Task run '{name}-" in line and "Cached" in line), (
            name
        )
    for k in range(3):
        assert (ws / "runs" / NAME / f"iter_{k:04d}" / "done.json").is_file()

    con = sqlite3.connect(ws / "mlflow" / "mlflow.db")
    runs = con.execute("select run_uuid from runs where name = ?", (NAME,)).fetchall()
    assert len(runs) == 1, "the resumed run must continue the same MLflow run"
    steps = [
        s
        for (s,) in con.execute(
            "select step from metrics where run_uuid = ? and key = 'timing_s/iteration' order by step",
            runs[0],
        )
    ]
    assert steps == [0, 1, 2], steps
    twice = con.execute(
        "select key, step, count(*) from metrics where run_uuid = ? group by key, step having count(*) > 1",
        runs[0],
    ).fetchall()
    assert twice == [], f"logged more than once: {twice[:5]}"  # the SFT validation's step -1 too
    assert con.execute("select count(*) from metrics where run_uuid = ? and step = -1", runs[0]).fetchone()[0]

    # The same run without the crash ends with the same last iteration.
    ref = _prepared(tmp_path / "b")
    _train(ref)
    last = f"runs/{NAME}/iter_0002/rollouts.parquet"
    a = pl.read_parquet(ws / last).sort("traj_id", "step")
    b = pl.read_parquet(ref / last).sort("traj_id", "step")
    assert a["response_ids"].to_list() == b["response_ids"].to_list()
