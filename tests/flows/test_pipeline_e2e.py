"""End to end: `dvc repro` of every stage on a tiny config, with real Prefect, vLLM, DeepSpeed, MLflow."""

from __future__ import annotations

import json
import re
import sqlite3

import polars as pl
import pytest
import yaml

from tests.flows.workspace import make_workspace, run

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def repro(tmp_path_factory):
    ws = make_workspace(tmp_path_factory.mktemp("e2e"))
    first = run(["dvc", "repro"], ws, timeout=1500)
    return ws, first


def test_every_stage_produces_its_outputs(repro):
    ws, _ = repro
    for split in ("train", "val", "test"):
        assert pl.read_parquet(ws / f"data/processed/calc/{split}.parquet").height > 0
    for model in ("base", "sft", "grpo/final", "ppo/final", "steppo/final"):
        assert (ws / "models" / model / "steprl_complete.json").is_file(), model
    for algo in ("grpo", "ppo", "steppo"):
        tr = json.loads((ws / f"metrics/train_{algo}.json").read_text())
        assert tr["iterations"] == 2 and tr["generated_tokens"] > 0
        curve = pl.read_csv(ws / f"plots/train_{algo}.csv")
        assert curve["iteration"].to_list() == [-1, 0, 1]  # -1: the SFT policy on val, before any update
        initial = json.loads((ws / "runs" / algo / "val_initial.json").read_text())["val/accuracy"]
        assert curve["val_accuracy"][0] == initial and curve["score_mean"][0] is None
        for k in (0, 1):
            it = ws / "runs" / algo / f"iter_{k:04d}"
            assert (it / "done.json").is_file()
            batch = pl.read_parquet(it / "batch.parquet")
            assert {"advantages", "returns", "old_logprobs", "reward", "group_id"} <= set(batch.columns)
            lens = batch.select(pl.col("advantages").list.len(), pl.col("response_ids").list.len())
            assert (lens["advantages"] == lens["response_ids"]).all()
            # RL prompts are the train rows after the first sft.rows (32): problems SFT did not learn from
            rows = {int(g.rsplit("-", 1)[1]) for g in batch["group_id"].unique()}
            assert rows and min(rows) >= 32, sorted(rows)
    report = (ws / "reports/compare.md").read_text()
    for name in ("sft", "grpo", "ppo", "steppo"):
        assert f"| {name} |" in report
    assert (ws / "reports/compare.png").stat().st_size > 1000
    ev = json.loads((ws / "metrics/eval_sft.json").read_text())
    assert ev["n_episodes"] == 8
    for key in ("accuracy", "mean_turns", "valid_tool_call_rate", "format_error_rate"):
        assert 0 <= ev[key] <= (3 if key == "mean_turns" else 1), (key, ev[key])
    assert ev["mean_turns"] >= 1
    # evaluate.samples (default 2) sampled episodes per row besides the greedy one
    assert ev["samples_per_prompt"] == 2 and 0 <= ev["sampled_accuracy"] <= ev["pass_at_k"] <= 1, ev
    assert "sampled accuracy (mean@k)" in report and "k = 2 episodes per problem at temperature 1" in report
    sft = json.loads((ws / "metrics/sft.json").read_text())
    assert sft["steps"] == 4 and sft["loss"] > 0


def test_mlflow_has_sft_and_evaluate_runs(repro):
    ws, _ = repro
    con = sqlite3.connect(ws / "mlflow/mlflow.db")
    names = {r[0] for r in con.execute("select name from runs where status = 'FINISHED'")}
    assert {"sft", "evaluate-sft", "grpo", "ppo", "steppo", "evaluate-grpo", "compare"} <= names
    for algo in ("grpo", "ppo", "steppo"):
        (run_id,) = con.execute("select run_uuid from runs where name = ?", (algo,)).fetchone()
        steps = [s for (s,) in con.execute(
            "select step from metrics where run_uuid = ? and key = 'timing_s/iteration' order by step", (run_id,))]
        assert steps == [0, 1], (algo, steps)
        keys = {k for (k,) in con.execute("select distinct key from metrics where run_uuid = ?", (run_id,))}
        assert {"critic/score/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm", "val/accuracy",
                "timing_s/rollout", "perf/tokens_per_s", "tool_calls/valid_rate"} <= keys, keys
        if algo != "grpo":
            assert {"critic/vf_loss", "critic/vf_explained_var"} <= keys
    (n_loss,) = con.execute("select count(*) from metrics where key = 'sft/loss'").fetchone()
    assert n_loss == 4
    (exp,) = con.execute("select name from experiments where experiment_id = "
                         "(select experiment_id from runs where name = 'sft')").fetchone()
    assert exp == "calc"


def test_second_repro_reruns_nothing(repro):
    ws, _ = repro
    again = run(["dvc", "repro"], ws)
    assert "Running stage" not in again.stdout, again.stdout
    assert "didn't change" in again.stdout or "is cached" in again.stdout or "up to date" in again.stdout


def test_sft_param_change_reruns_only_sft_and_after(repro):
    ws, _ = repro
    params = yaml.safe_load((ws / "params.yaml").read_text())
    params["sft"]["lr"] = 0.002
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    # What would run, without running it: the changed stage, then (as its outputs will change) everything
    # downstream of it -- and nothing upstream.
    out = run(["dvc", "repro", "--dry", "--force-downstream"], ws).stdout
    ran = set(re.findall(r"Running stage '([^']+)'", out))
    downstream = {"train@grpo", "train@ppo", "train@steppo", "evaluate@grpo", "evaluate@ppo", "evaluate@steppo"}
    assert ran == {"sft", "evaluate_sft", "compare"} | downstream, out
    direct = set(re.findall(r"Running stage '([^']+)'", run(["dvc", "repro", "--dry"], ws).stdout))
    assert direct == {"sft"}, direct
