"""End to end: the README's main command (`make repro`: `python -m flows.repro`, which runs `dvc repro`
against one Prefect server it starts) of every stage on a tiny config, with real Prefect, vLLM,
DeepSpeed, MLflow. Plain `dvc repro` (each stage then starting a temporary Prefect server of its own,
several seconds a stage) is what test_second_repro_reruns_nothing and the stage tests run."""

from __future__ import annotations

import json
import re
import sqlite3
import sys

import polars as pl
import pytest
import yaml

from tests.flows.workspace import make_workspace, run, watch_listeners

# A hang guard, not a time bound: the module's first run took about 7 minutes alone on 2 cores (8 as
# plain `dvc repro`), 15 beside one CPU-bound job, and ran past 25 (the default guard) beside two.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3600)]

ALGOS, SEEDS = ("grpo", "steppo"), (0, 1)  # compare.algorithms x compare.seeds of tests/flows/workspace.py
RUNS = [f"{a}-s{s}" for a in ALGOS for s in SEEDS]
LISTENERS: dict = {}  # what watch_listeners saw during the first `dvc repro`


@pytest.fixture(scope="module")
def repro(tmp_path_factory):
    ws = make_workspace(tmp_path_factory.mktemp("e2e"))
    with watch_listeners() as seen:
        first = run([sys.executable, "-m", "flows.repro"], ws, timeout=3300)
    LISTENERS.update(seen)
    return ws, first


def test_running_stages_listen_on_loopback_only(repro):
    """Every listening socket of every process of the run (stages, their Prefect servers, vLLM's), polled
    while the stages ran: loopback only. The poll must have seen sft and train running."""
    assert {"flows.sft", "flows.train"} <= LISTENERS["stages"], LISTENERS["stages"]
    assert LISTENERS["listening"], "nothing listened at all: the poll saw no server"
    wide = [(who, ip, port) for who, ip, port in LISTENERS["listening"] if ip not in ("127.0.0.1", "::1")]
    assert wide == [], f"listening beyond loopback: {wide}"


def test_every_stage_produces_its_outputs(repro):
    ws, _ = repro
    for split in ("train", "val", "test"):
        assert pl.read_parquet(ws / f"data/processed/calc/{split}.parquet").height > 0
    for model in ("base", "sft", *(f"{name}/final" for name in RUNS)):
        assert (ws / "models" / model / "steprl_complete.json").is_file(), model
    test_ids = (
        pl.read_parquet(ws / "data/processed/calc/test.parquet")["id"].head(8).cast(pl.String).to_list()
    )
    # the SFT policy's val metrics are the same in every run (one SFT checkpoint, greedy; cached)
    initial_metrics = [json.loads((ws / "runs" / name / "val_initial.json").read_text()) for name in RUNS]
    assert all(m == initial_metrics[0] for m in initial_metrics), initial_metrics
    for name in RUNS:
        algo, seed = name.rsplit("-s", 1)
        tr = json.loads((ws / f"metrics/train_{name}.json").read_text())
        assert tr["iterations"] == 2 and tr["generated_tokens"] > 0
        assert (tr["algo"], tr["rl_seed"], tr["run"]) == (algo, int(seed), name)
        curve = pl.read_csv(ws / f"plots/train_{name}.csv")
        assert curve["iteration"].to_list() == [-1, 0, 1]  # -1: the SFT policy on val, before any update
        initial = json.loads((ws / "runs" / name / "val_initial.json").read_text())["val/accuracy"]
        assert curve["val_accuracy"][0] == initial and curve["score_mean"][0] is None
        sampled = json.loads((ws / "runs" / name / "val_initial.json").read_text())["val/t0.4/accuracy"]
        assert curve["val_t0.4_accuracy"][0] == sampled  # train.val_temperatures' protocol, for the chart
        assert json.loads((ws / "runs" / name / "fingerprint.json").read_text())["depends_on"]["seed"] == int(
            seed
        )
        problems = pl.read_parquet(ws / f"metrics/problems_{name}.parquet")
        assert problems["id"].to_list() == test_ids and set(problems["correct"]) <= {0, 1}
        ev = json.loads((ws / f"metrics/eval_{name}.json").read_text())
        assert problems["correct"].mean() == pytest.approx(ev["accuracy"])
        assert problems["sampled_correct"].mean() == pytest.approx(ev["sampled_accuracy"])
        # the synchronous run records when its phases ran (benchmarks/timeline.py): none overlaps
        spans = [
            json.loads((ws / "runs" / name / f"iter_{k:04d}" / "metrics.json").read_text()) for k in (0, 1)
        ]
        for m in spans:
            assert m["timeline/rollout_start"] < m["timeline/rollout_end"] <= m["timeline/update_start"]
            assert m["timeline/update_start"] < m["timeline/update_end"]
        assert spans[0]["timeline/update_end"] <= spans[1]["timeline/rollout_start"]
        for k in (0, 1):
            it = ws / "runs" / name / f"iter_{k:04d}"
            assert (it / "done.json").is_file()
            batch = pl.read_parquet(it / "batch.parquet")
            assert {"advantages", "returns", "old_logprobs", "reward", "group_id"} <= set(batch.columns)
            lens = batch.select(pl.col("advantages").list.len(), pl.col("response_ids").list.len())
            assert (lens["advantages"] == lens["response_ids"]).all()
            # RL prompts are the train rows after the first sft.rows (32): problems SFT did not learn from
            rows = {int(g.rsplit("-", 1)[1]) for g in batch["group_id"].unique()}
            assert rows and min(rows) >= 32, sorted(rows)
    # The RL seed drives what RL draws: the two seeds of an algorithm sample different prompts.
    for algo in ALGOS:
        groups = [
            set(pl.read_parquet(ws / f"runs/{algo}-s{s}/iter_0000/rollouts.parquet")["group_id"])
            for s in SEEDS
        ]
        assert groups[0] != groups[1], algo
    sft_problems = pl.read_parquet(ws / "metrics/problems_sft.parquet")
    assert sft_problems["id"].to_list() == test_ids and (sft_problems["n_sampled"] == 2).all()
    report = (ws / "reports/compare.md").read_text()
    interval = r"[+-]?\d\.\d{3} \[-?\d\.\d{3}, -?\d\.\d{3}\]"
    assert (  # the headline protocol (compare.headline: sampled at T=0.4) first, then greedy
        "| algorithm | seeds | accuracy (sampled at T=0.4, 2 per problem) [95% CI] | t0.4 vs SFT [95% CI] "
        "| accuracy (greedy) [95% CI] | greedy vs SFT [95% CI] |" in report
    )
    for algo in ALGOS:  # mean over seeds [interval], difference to SFT [interval] (T=0.4, then greedy)
        assert re.search(
            rf"^\| {algo} \| 0, 1 \| {interval} \| {interval} \| {interval} \| {interval} \|", report, re.M
        ), algo
        assert re.search(
            rf"^- \*\*{algo}\*\* \(2 seeds\): .*greedy: accuracy .* against SFT (significantly|no significant)",
            report,
            re.M,
        ), algo
    for name in ["sft", *RUNS]:  # one row per run with its own values
        assert re.search(rf"^\| {name} \| ", report, re.M), name
    assert re.search(rf"^\| grpo - steppo \| {interval} \| {interval} \|", report, re.M)
    assert (ws / "reports/compare.png").stat().st_size > 1000
    ev = json.loads((ws / "metrics/eval_sft.json").read_text())
    assert ev["n_episodes"] == 8
    for key in ("accuracy", "mean_turns", "valid_tool_call_rate", "format_error_rate"):
        assert 0 <= ev[key] <= (3 if key == "mean_turns" else 1), (key, ev[key])
    assert ev["mean_turns"] >= 1
    # evaluate.samples (default 2) sampled episodes per row besides the greedy one
    assert ev["samples_per_prompt"] == 2 and 0 <= ev["sampled_accuracy"] <= ev["pass_at_k"] <= 1, ev
    assert "**Headline protocol: sampled at T=0.4, 2 per problem.**" in report
    assert "is mean@k" in report and "sampled at T=1, 2 per problem" in report
    sft = json.loads((ws / "metrics/sft.json").read_text())
    assert sft["steps"] == 4 and sft["loss"] > 0


def test_critic_warmup_runs_once_and_critic_runs_start_from_it(repro):
    """The critic_warmup stage fitted a critic (real vLLM rollout, DeepSpeed fit) that every steppo run
    (a critic-based algorithm, any seed) starts from; grpo runs have no critic and do not hash it."""
    ws, first = repro
    assert first.stdout.count("Running stage 'critic_warmup'") == 1
    warm = json.loads((ws / "metrics/critic_warmup.json").read_text())
    assert warm["episodes"] == 8 and warm["steps_run"] == 4 and warm["best_step"] in (0, 2, 4)
    assert -1.0 <= warm["held_out_ev_token"] <= 1.0 and -1.0 <= warm["held_out_ev_step"] <= 1.0
    curve = pl.read_csv(ws / "plots/critic_warmup.csv")
    assert curve["step"].to_list() == [0, 2, 4]
    assert (ws / "models/critic/steprl_complete.json").is_file()
    digests = {
        name: json.loads((ws / "runs" / name / "fingerprint.json").read_text())["depends_on"]["critic_sha256"]
        for name in RUNS
    }
    assert digests["grpo-s0"] is None and digests["grpo-s1"] is None
    assert digests["steppo-s0"] == digests["steppo-s1"] is not None
    for name in ("steppo-s0", "steppo-s1"):  # the critic's explained variance on each iteration's batch
        assert pl.read_csv(ws / f"plots/train_{name}.csv")["vf_explained_var"].drop_nulls().len() == 2


def test_mlflow_has_sft_and_evaluate_runs(repro):
    ws, _ = repro
    con = sqlite3.connect(ws / "mlflow/mlflow.db")
    names = {r[0] for r in con.execute("select name from runs where status = 'FINISHED'")}
    assert {"sft", "evaluate-sft", *RUNS, "compare"} <= names
    assert not {
        n for n in names if n.startswith("evaluate-") and n != "evaluate-sft"
    }  # RL runs evaluate in-run
    for name in RUNS:
        algo, seed = name.rsplit("-s", 1)
        (run_id,) = con.execute("select run_uuid from runs where name = ?", (name,)).fetchone()
        tags = dict(con.execute("select key, value from tags where run_uuid = ?", (run_id,)).fetchall())
        assert (tags["steprl.algo"], tags["steprl.rl_seed"]) == (algo, seed), tags
        (logged_seed,) = con.execute(
            "select value from params where run_uuid = ? and key = 'seed'", (run_id,)
        ).fetchone()
        assert logged_seed == seed
        steps = [
            s
            for (s,) in con.execute(
                "select step from metrics where run_uuid = ? and key = 'timing_s/iteration' order by step",
                (run_id,),
            )
        ]
        assert steps == [0, 1], (name, steps)
        keys = {k for (k,) in con.execute("select distinct key from metrics where run_uuid = ?", (run_id,))}
        assert {
            "critic/score/mean",
            "actor/pg_loss",
            "actor/entropy",
            "actor/grad_norm",
            "val/accuracy",
            "timing_s/rollout",
            "perf/tokens_per_s",
            "tool_calls/valid_rate",
            "eval/accuracy",  # the final policy on the test split, evaluated at the end of the stage
            "eval/sampled_accuracy",
        } <= keys, keys
        ev = json.loads((ws / f"metrics/eval_{name}.json").read_text())
        (logged,) = con.execute(
            "select value from metrics where run_uuid = ? and key = 'eval/accuracy'", (run_id,)
        ).fetchone()
        assert logged == pytest.approx(ev["accuracy"])
        if algo != "grpo":
            assert {"critic/vf_loss", "critic/vf_explained_var"} <= keys
    (n_loss,) = con.execute("select count(*) from metrics where key = 'sft/loss'").fetchone()
    assert n_loss == 4
    (exp,) = con.execute(
        "select name from experiments where experiment_id = "
        "(select experiment_id from runs where name = 'sft')"
    ).fetchone()
    assert exp == "calc"


def test_second_repro_reruns_nothing(repro):
    ws, _ = repro
    again = run(["dvc", "repro"], ws)
    assert "Running stage" not in again.stdout, again.stdout
    assert "didn't change" in again.stdout or "is cached" in again.stdout or "up to date" in again.stdout


def test_sft_param_change_reruns_only_sft_and_after(repro):
    ws, _ = repro
    original = (ws / "params.yaml").read_text()
    params = yaml.safe_load(original)
    params["sft"]["lr"] = 0.002
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        # What would run, without running it: the changed stage, then (as its outputs will change)
        # everything downstream of it -- and nothing upstream.
        out = run(["dvc", "repro", "--dry", "--force-downstream"], ws).stdout
        ran = set(re.findall(r"Running stage '([^']+)'", out))
        downstream = {f"train@{a}-{s}" for a in ALGOS for s in SEEDS}
        assert ran == {"sft", "critic_warmup", "evaluate_sft", "compare"} | downstream, out
        direct = set(re.findall(r"Running stage '([^']+)'", run(["dvc", "repro", "--dry"], ws).stdout))
        assert direct == {"sft"}, direct
    finally:  # the module's other tests (in any order) see the workspace dvc repro left
        (ws / "params.yaml").write_text(original)
