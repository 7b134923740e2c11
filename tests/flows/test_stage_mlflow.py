"""flows._stage.ensure_experiment: every stage finds (or creates) its MLflow experiment, also when
another process creates it at the same moment."""

from __future__ import annotations

import pytest

import mlflow
from flows._stage import ensure_experiment


@pytest.fixture
def store(tmp_path):
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    yield tmp_path
    mlflow.set_tracking_uri(previous)


def test_creates_the_experiment_once_with_its_artifact_location(store):
    location = (store / "artifacts").as_uri()
    first = ensure_experiment("calc", location)
    assert ensure_experiment("calc", location) == first
    assert mlflow.get_experiment(first).artifact_location == location
    assert first != "0"


def test_the_loser_of_a_creation_race_gets_the_winners_experiment(store, monkeypatch):
    winner = mlflow.create_experiment("calc")  # created by "another process" ...
    real = mlflow.get_experiment_by_name
    calls = []

    def not_yet_there(name):  # ... just after this process looked for it
        calls.append(name)
        return None if len(calls) == 1 else real(name)

    monkeypatch.setattr(mlflow, "get_experiment_by_name", not_yet_there)
    assert ensure_experiment("calc") == winner
    assert len(calls) == 2  # looked, lost the create, looked again


def test_other_store_errors_are_not_swallowed(store, monkeypatch):
    def broken(*args, **kwargs):
        raise mlflow.exceptions.MlflowException("disk full", error_code="INTERNAL_ERROR")

    monkeypatch.setattr(mlflow, "create_experiment", broken)
    with pytest.raises(mlflow.exceptions.MlflowException, match="disk full"):
        ensure_experiment("calc")


# --- what a train run logs -------------------------------------------------------------------------
def _train_run(store, monkeypatch, algo, rl_seed=1, env=None):
    from components.config import load_params
    from flows import REPO
    from flows.train import train_mlflow_run

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow.get_tracking_uri())
    for var in ("DVC_EXP_NAME", "DVC_EXP_BASELINE_REV", "DVC_STAGE"):
        monkeypatch.delenv(var, raising=False)
    for var, value in (env or {}).items():
        monkeypatch.setenv(var, value)
    params = load_params(REPO / "params.yaml")
    sft_seed, params = params.seed, params.model_copy(update={"seed": rl_seed})
    with train_mlflow_run(params, algo, rl_seed, sft_seed, run_id=None) as run:
        run_id = run.info.run_id
    return params, mlflow.get_run(run_id).data


def test_train_runs_log_the_algorithm_under_shared_keys_and_no_other_algorithm(store, monkeypatch):
    params, ppo = _train_run(store, monkeypatch, "ppo")
    _, grpo = _train_run(store, monkeypatch, "grpo")
    block = params.algorithms["ppo"]
    assert ppo.params["algo.name"] == "ppo" and grpo.params["algo.name"] == "grpo"
    assert ppo.params["algo.preset"] == block.preset
    assert ppo.params["algo.estimator"] == "gae" and grpo.params["algo.estimator"] == "grpo"
    assert ppo.params["algo.critic"] == "token" and grpo.params["algo.critic"] == "null"  # none
    for key in ("policy_loss", "loss_agg"):
        assert ppo.params[f"algo.{key}"] not in ("", "None", "null")  # the preset's part, filled in
    assert float(ppo.params["algo.lr"]) == block.lr
    assert float(ppo.params["algo.clip_low"]) == block.clip_low
    assert float(ppo.params["algo.clip_high"]) == block.clip_high
    assert int(ppo.params["algo.samples_per_prompt"]) == block.samples_per_prompt
    assert ppo.params["algo.rl_seed"] == "1"
    # the same keys in every algorithm's run, so MLflow's Compare lines them up
    algo_keys = {k for k in ppo.params if k.startswith("algo.")}
    assert algo_keys == {k for k in grpo.params if k.startswith("algo.")}
    assert not [k for k in ppo.params if k.startswith("algorithms.")]
    # the shared sections as they are; seed is the run's RL seed, the SFT model's is a tag
    assert ppo.params["train.iterations"] == str(params.train.iterations)
    assert ppo.params["rollout.max_steps"] == str(params.rollout.max_steps)
    assert ppo.params["seed"] == "1" and ppo.params["task"] == params.task
    assert ppo.tags["steprl.algo"] == "ppo" and ppo.tags["steprl.sft_seed"] == "0"


def test_runs_are_tagged_with_the_git_commit_and_the_dvc_experiment(store, monkeypatch):
    import subprocess

    from flows import REPO

    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    env = {"DVC_EXP_NAME": "lusty-bole", "DVC_EXP_BASELINE_REV": head, "DVC_STAGE": "train@ppo-1"}
    _, data = _train_run(store, monkeypatch, "ppo", env=env)
    assert data.tags["git.commit"] == data.tags.get("mlflow.source.git.commit", head)
    assert data.tags["dvc.exp_name"] == "lusty-bole"
    assert data.tags["dvc.exp_baseline_rev"] == head
    assert data.tags["dvc.stage"] == "train@ppo-1"
    _, plain = _train_run(store, monkeypatch, "ppo")  # plain `dvc repro` or by hand: no experiment tags
    assert not [t for t in plain.tags if t.startswith("dvc.")]


def _metric_rows(store, run_id: str) -> list[tuple[str, int]]:
    """(key, step) of every metric value the run's sqlite store holds, one row per logged value."""
    import sqlite3

    con = sqlite3.connect(store / "mlflow.db")
    try:
        return con.execute("select key, step from metrics where run_uuid = ?", (run_id,)).fetchall()
    finally:
        con.close()


def test_a_train_run_resumed_three_times_logs_the_sft_validation_once(store, monkeypatch):
    """flows.train logs the SFT policy's validation at step -1 with log_metrics_once: a run killed
    (kill -9) after it and resumed three times, each resume continuing the same MLflow run, holds
    each of its 48 keys at step -1 exactly once (the old check looked for step -1 in
    timing_s/iteration, which is never logged there, and so logged the 48 keys again each time).
    A key a killed run had not logged at a step is logged on resume; another step is another point.
    (One test: a fresh sqlite store's tables take seconds to create.)"""
    from components.config import load_params
    from flows import REPO
    from flows._stage import log_metrics_once
    from flows.train import train_mlflow_run

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow.get_tracking_uri())
    params = load_params(REPO / "params.yaml")
    initial = {f"val/t0.4/key{i}": i / 48 for i in range(48)}  # what validate_sft returned
    with train_mlflow_run(params, "ppo", 0, 0, run_id=None) as run:
        run_id = run.info.run_id
        assert log_metrics_once(initial, step=-1) == initial
        mlflow.log_metrics({"timing_s/iteration": 1.0, "val/accuracy": 0.5}, step=0)
    for _ in range(3):  # each resume: the same run, the SFT validation read back from val_initial.json
        with train_mlflow_run(params, "ppo", 0, 0, run_id=run_id) as again:
            assert again.info.run_id == run_id
            assert log_metrics_once(initial, step=-1) == {}
    rows = _metric_rows(store, run_id)
    assert sorted(rows) == sorted({*rows}), "a (key, step) logged twice"
    assert len([r for r in rows if r[1] == -1]) == 48 and len(rows) == 50

    with mlflow.start_run() as other:  # killed after one key of two at step -1
        mlflow.log_metrics({"a": 1.0}, step=-1)
        assert log_metrics_once({"a": 1.0, "b": 2.0}, step=-1) == {"b": 2.0}
        assert log_metrics_once({"a": 1.0}, step=0) == {"a": 1.0}
    assert sorted(_metric_rows(store, other.info.run_id)) == [("a", -1), ("a", 0), ("b", -1)]
