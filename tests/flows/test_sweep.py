"""`python -m flows.sweep` on a real MLflow store with hand-made runs of two DVC experiments."""

from __future__ import annotations

import pytest

import flows.sweep as sweep
import mlflow


@pytest.fixture
def store(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    exp = mlflow.create_experiment("sokoban", artifact_location=(tmp_path / "artifacts").as_uri())
    # two DVC experiments differing in train.kl_coef; grpo seeds 0 and 1 in each; a run outside any
    # DVC experiment (plain dvc repro) and a non-train run are not part of the sweep
    for exp_name, kl, finals in (("exp-a", "0.0", (0.5, 0.7)), ("exp-b", "0.05", (0.6, 0.6))):
        for seed, final in enumerate(finals):
            tags = {"dvc.exp_name": exp_name, "steprl.algo": "grpo", "steprl.rl_seed": str(seed)}
            with mlflow.start_run(experiment_id=exp, run_name=f"grpo-s{seed}", tags=tags):
                mlflow.log_params(
                    {
                        "train.kl_coef": kl,
                        "train.iterations": "10",
                        "seed": str(seed),
                        "algo.rl_seed": str(seed),
                    }
                )
                for step, value in ((-1, 0.4), (4, final - 0.1), (9, final)):
                    mlflow.log_metric("val/accuracy", value, step=step)
                mlflow.log_metrics({"eval/accuracy": final + 0.01, "eval/sampled_accuracy": final - 0.05})
    with mlflow.start_run(experiment_id=exp, run_name="grpo-s0", tags={"steprl.algo": "grpo"}):
        mlflow.log_params({"train.kl_coef": "0.1"})
    with mlflow.start_run(experiment_id=exp, run_name="sft", tags={"dvc.exp_name": "exp-a"}):
        pass
    monkeypatch.setattr(sweep, "REPO", tmp_path)
    return uri


def test_collect_and_table(store):
    runs = sweep.collect("sokoban")
    assert [(r.exp_name, r.run_name) for r in runs] == [
        ("exp-a", "grpo-s0"),
        ("exp-a", "grpo-s1"),
        ("exp-b", "grpo-s0"),
        ("exp-b", "grpo-s1"),
    ]
    assert runs[0].val == [(-1, 0.4), (4, pytest.approx(0.4)), (9, 0.5)]
    assert sweep.varying(runs) == ["train.kl_coef"]  # seeds are identity, iterations never differ
    text = sweep.table(runs)
    row = next(line for line in text.splitlines() if line.startswith("| exp-a | grpo |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # kl, seeds, val curve (means over seeds), test greedy mean, sampled mean, greedy per seed
    assert cells[2:] == ["0.0", "0, 1", "-1: 0.40, 4: 0.50, 9: 0.60", "0.610", "0.550", "0.510, 0.710"]
    assert [r.exp_name for r in sweep.collect("sokoban", ["exp-b"])] == ["exp-b", "exp-b"]


def test_main_writes_the_report_and_the_chart(store, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    assert sweep.main(["--experiment", "sokoban"]) == 0
    assert "| exp-b | grpo | 0.05 |" in (tmp_path / "reports" / "sweep.md").read_text()
    assert (tmp_path / "reports" / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert sweep.main(["--experiment", "sokoban", "--exp", "nothing"]) == 1


def test_protocol_columns_when_runs_logged_them(store, monkeypatch):
    """Runs that logged eval/<protocol>/accuracy and loop_rate get a column each (means over seeds),
    protocols with the no-op escape included."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    exp = mlflow.get_experiment_by_name("sokoban").experiment_id
    for seed, loop in ((0, 0.2), (1, 0.4)):
        tags = {"dvc.exp_name": "exp-c", "steprl.algo": "ppo", "steprl.rl_seed": str(seed)}
        with mlflow.start_run(experiment_id=exp, run_name=f"ppo-s{seed}", tags=tags):
            mlflow.log_metrics(
                {
                    "eval/accuracy": 0.5,
                    "eval/t0.4/accuracy": 0.6,
                    "eval/greedy/loop_rate": loop,
                    "eval/greedy_escape/accuracy": 0.7,
                }
            )
    text = sweep.table(sweep.collect("sokoban", ["exp-c"]))
    header = next(line for line in text.splitlines() if line.startswith("| DVC experiment"))
    head = [c.strip() for c in header.strip("|").split("|")]
    assert head[-3:] == ["test greedy loop rate", "test greedy_escape accuracy", "test t0.4 accuracy"]
    row = next(line for line in text.splitlines() if line.startswith("| exp-c | ppo |"))
    assert [c.strip() for c in row.strip("|").split("|")][-3:] == ["0.300", "0.700", "0.600"]
