"""The train stage with in-flight weight updates (``rollout.staleness: 1``,
``rollout.inflight_updates: true``) on vLLM from a fresh workspace: three GRPO iterations with
``correction: tis``. Each update's weights are pushed into the engine as soon as they exist, so a
rollout may go on under a newer version than the one it was due to: every step row's version lies
between the rollout's behaviour version max(0, k - 1) and k, the batch's staleness is never above 1,
each iteration logs the pushes that landed in its generation, and a run killed while the update and
the next rollout run together resumes after its last finished iteration and ends with a final model
(not bit-identical to the uninterrupted run's: where a push lands depends on timing).

That a push lands between two decode steps of a running generation, each token then being one
version's sample, is tests/rollout/test_vllm_inflight.py."""

from __future__ import annotations

import json
import shutil
import sqlite3

import polars as pl
import pytest

from tests.flows.workspace import kill_when_written, one_grpo_run, run, sft_workspace

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

NAME, ITERATIONS = "grpo-s0", 3
TRAIN = ["python", "-m", "flows.train", "--algo", "grpo", "--rl-seed", "0"]


def _prepared(root):
    return sft_workspace(root, one_grpo_run(ITERATIONS, {"staleness": 1, "inflight_updates": True}, "tis"))


def _check_iterations(ws) -> list[dict]:
    metrics = []
    for k in range(ITERATIONS):
        d = ws / "runs" / NAME / f"iter_{k:04d}"
        m = json.loads((d / "metrics.json").read_text())
        versions = pl.read_parquet(d / "rollouts.parquet")["policy_version"].to_list()
        assert versions and all(max(0, k - 1) <= v <= k for v in versions), (k, sorted(set(versions)))
        assert m["rollout/staleness_max"] <= min(k, 1)
        assert m["rollout/policy_version_min"] == min(versions)
        assert m["rollout/inflight_pushes"] >= 0
        metrics.append(m)
    assert (ws / "models" / NAME / "final" / "model.safetensors").is_file()
    return metrics


def test_inflight_updates_keep_every_step_within_the_staleness_bound_and_resume(tmp_path):
    ws = _prepared(tmp_path / "a")
    killed = tmp_path / "b"
    shutil.copytree(ws, killed, symlinks=True)

    out = run(TRAIN, ws, timeout=1200)
    metrics = _check_iterations(ws)
    print({k: (m["rollout/staleness_mean"], m["rollout/inflight_pushes"]) for k, m in enumerate(metrics)})
    for k in range(ITERATIONS - 1):  # rollout k+1 is generated while update k runs
        nxt, cur = metrics[k + 1], metrics[k]
        assert nxt["timeline/rollout_start"] < cur["timeline/update_end"], k
    assert "Traceback" not in out.stderr
    con = sqlite3.connect(ws / "mlflow" / "mlflow.db")
    (run_id,) = con.execute("select run_uuid from runs where name = ?", (NAME,)).fetchone()
    params = dict(con.execute("select key, value from params where run_uuid = ?", (run_id,)).fetchall())
    assert params["rollout.inflight_updates"] == "True"
    pushes = con.execute(
        "select count(*) from metrics where run_uuid = ? and key = 'rollout/inflight_pushes'", (run_id,)
    ).fetchone()
    assert pushes == (ITERATIONS,)

    target = killed / "runs" / NAME / "iter_0001" / "batch.parquet"  # update 1 starts on it
    assert kill_when_written(TRAIN, killed, target), "train never reached update 1"
    out = run(TRAIN, killed, timeout=1200)
    assert f"{NAME}: resuming after iteration 0" in out.stdout + out.stderr
    _check_iterations(killed)
