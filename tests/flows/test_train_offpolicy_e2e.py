"""The train stage with an off-policy correction from a fresh workspace: prepare, base_model, sft, then
one GRPO iteration with ``train.old_logprobs: recompute`` and ``algorithms.grpo.correction: tis`` on the
hf rollout engine. The iteration trains, and its metrics.json and its MLflow run carry the
rollout/trainer mismatch (``actor/mismatch/*``)."""

from __future__ import annotations

import json
import math
import sqlite3

import pytest

from tests.flows.workspace import TINY, run, sft_workspace

pytestmark = pytest.mark.slow

MISMATCH = ("actor/mismatch/kl", "actor/mismatch/max_abs_log_ratio", "actor/mismatch/capped_frac")


def test_one_grpo_iteration_with_recompute_and_tis_logs_the_mismatch(tmp_path):
    algorithms = {**TINY["algorithms"], "grpo": {**TINY["algorithms"]["grpo"], "correction": "tis"}}
    ws = sft_workspace(
        tmp_path / "ws",
        {
            "rollout": {**TINY["rollout"], "engine": "hf"},
            "train": {**TINY["train"], "iterations": 1, "old_logprobs": "recompute"},
            "algorithms": algorithms,
        },
    )
    run(["python", "-m", "flows.train", "--algo", "grpo", "--rl-seed", "0"], ws, timeout=1200)

    metrics = json.loads((ws / "runs" / "grpo-s0" / "iter_0000" / "metrics.json").read_text())
    assert metrics["actor/skipped"] == 0.0  # it trained
    for key in MISMATCH:
        assert math.isfinite(metrics[key]) and metrics[key] >= 0.0, key
    # fp32 sampler and trainer: the weights of the same policy agree to rounding, nothing is capped
    assert metrics["actor/mismatch/kl"] < 1e-6 and metrics["actor/mismatch/capped_frac"] == 0.0
    con = sqlite3.connect(ws / "mlflow/mlflow.db")
    (run_id,) = con.execute("select run_uuid from runs where name = 'grpo-s0'").fetchone()
    logged = {k for (k,) in con.execute("select key from metrics where run_uuid = ? and step = 0", (run_id,))}
    assert set(MISMATCH) <= logged
    params = dict(con.execute("select key, value from params where run_uuid = ?", (run_id,)).fetchall())
    assert params["algo.correction"] == "tis" and float(params["algo.correction_cap"]) == 2.0
