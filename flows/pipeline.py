"""Flow `pipeline`: the whole DVC pipeline as one DVC experiment (`dvc exp run`, flows/_experiments.py)
logged to one MLflow run with the stage runs nested under it; the flow `make serve` deploys.

    python -m flows.pipeline run -S seed=1 -S sft.steps=50 [stage ...]    # once, here

Its deployments (served by `make serve`, or on a work pool) are flows/pool.py's.
"""

import argparse
import json
import os
import sys
import time
from typing import Annotated, Any, Literal

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import deployment, flow_run
from pydantic import Field

from components.config import ConfigError, Params, flatten
from flows import REPO
from flows._experiments import (
    ExperimentResult,
    check_experiment_name,
    experiment_ref,
    plan_run,
    push_experiment,
    push_remote,
    read_metrics,
    run_experiment,
)
from flows._stage import mlflow_run, tracking_uri

# `dvc exp run` as a task of the flow run: a SIGTERM (Ctrl-C of `make serve`) is logged as its crash
dvc_exp_run = task(run_experiment, name="dvc-exp-run", cache_policy=NO_CACHE)


@flow(name="pipeline", persist_result=True, log_prints=True)
def pipeline(
    task: str | None = None,
    algorithms: list[str] | None = None,
    seed: Annotated[int | None, Field(ge=0)] = None,
    iterations: Annotated[int | None, Field(ge=1)] = None,
    model_path: str | None = None,
    overrides: list[str] = [],  # noqa: B006 (Prefect shows the default in the form; never mutated)
    experiment_name: str | None = None,
    targets: list[str] | None = None,
    baseline: Literal["head", "workspace"] = "head",
) -> dict[str, Any]:
    """Run the steprl pipeline as a DVC experiment and log it to MLflow.

    Args:
        task: Task recipe (params.yaml `task`, a registered task name). Empty = keep params.yaml's value.
        algorithms: RL algorithms to train and compare (params.yaml `compare.algorithms`,
            e.g. ["grpo", "ppo"]). Empty = keep params.yaml's value.
        seed: Global seed (params.yaml `seed`). Empty = keep params.yaml's value.
        iterations: RL iterations per algorithm (params.yaml `train.iterations`). Empty = keep.
        model_path: A local Hugging Face model directory to start from (params.yaml `model.path`).
            Empty = keep params.yaml's value (the embedded tiny model by default).
        overrides: Any other params.yaml keys, one `key=value` per item, as for `dvc exp run -S`
            (e.g. "sft.steps=50", "rollout.engine=hf"). Checked before anything runs.
        experiment_name: Name of the DVC experiment (letters, digits, . _ -). Empty = the flow run's name.
        targets: DVC stages to run (e.g. ["base_model"]). Empty = the whole pipeline.
        baseline: What the run starts from: "head" = the last git commit (uncommitted edits in the
            workspace are ignored), "workspace" = the workspace as it is (DVC's `--temp` run).
    """
    import mlflow

    named = dict(task=task, algorithms=algorithms, seed=seed, iterations=iterations, model_path=model_path)
    rev, run_overrides, params = plan_run(REPO, baseline, overrides, **named)
    remote = push_remote(REPO)  # STEPRL_PUSH (make worker): checked before anything runs
    targets = targets or []
    name = _experiment_name(rev, experiment_name)
    print(f"experiment {name!r} from {baseline} ({rev[:7]}), overrides: {' '.join(run_overrides) or 'none'}")
    tags = _run_tags(name, baseline, rev, run_overrides, targets)
    flat = flatten(params.model_dump(mode="json"))
    with mlflow_run(params, f"pipeline {name}", [], tags=tags, extra_params=flat) as run:
        env = _stage_env(params, run.info.run_id, name, tags["prefect.flow_run_id"])
        try:
            log = get_run_logger().info
            result = dvc_exp_run(
                REPO, run_overrides, name, baseline=baseline, targets=targets, env=env, on_line=log
            )
        except BaseException as err:  # the run ends FAILED; keep why next to it
            mlflow.log_text(f"{type(err).__name__}: {err}\n", "error.txt")
            raise
        metrics = _log_experiment(result, since=rev, remote=remote)
        if remote:
            print(f"pushed experiment {name!r} to git remote {remote!r} and the default DVC remote")
    print(f"DVC experiment {name!r} ({result.rev[:7]}): `dvc exp show`, `dvc exp apply {name}`")
    return {
        "experiment": name,
        "ref": result.ref,
        "rev": result.rev,
        "baseline_rev": rev,
        "overrides": run_overrides,
        "mlflow_run_id": run.info.run_id,
        "metrics": metrics,
        "pushed_to": remote,
    }


def _experiment_name(rev: str, asked: str | None) -> str:
    """The DVC experiment's name: ``asked`` (an error if taken for ``rev``), else the flow run's name
    (or a time stamp) made unique for ``rev``."""
    name = check_experiment_name(asked or flow_run.get_name() or time.strftime("run-%Y%m%d-%H%M%S"))
    if experiment_ref(REPO, rev, name):
        if asked:
            raise ConfigError(f"experiment_name {name!r}: an experiment of that name exists for {rev[:7]}")
        name = f"{name}-{int(time.time()) % 100000}"
    return name


def _run_tags(name: str, baseline: str, rev: str, overrides: list[str], targets: list[str]) -> dict[str, str]:
    """The pipeline MLflow run's tags: the experiment, what it started from, the Prefect flow run."""
    return {
        "steprl.stage": "pipeline",
        "steprl.dvc_exp": name,
        "steprl.baseline": baseline,
        "steprl.baseline_rev": rev,
        "steprl.overrides": " ".join(overrides) or "(none)",
        "steprl.targets": " ".join(targets) or "(all)",
        "prefect.flow_run_id": str(flow_run.get_id() or ""),
        "prefect.flow_run_name": str(flow_run.get_name() or ""),
        "prefect.deployment": str(deployment.get_name() or ""),
    }


def _stage_env(params: Params, run_id: str, name: str, flow_run_id: str) -> dict[str, str]:
    """The stages' environment, without the runner's internals; MLflow tags every run they start with
    MLFLOW_RUN_CONTEXT, which makes them children of run ``run_id``."""
    context = {"mlflow.parentRunId": run_id, "steprl.dvc_exp": name, "prefect.flow_run_id": flow_run_id}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT__")}
    return env | {"MLFLOW_TRACKING_URI": tracking_uri(params), "MLFLOW_RUN_CONTEXT": json.dumps(context)}


def _log_experiment(result: ExperimentResult, *, since: str, remote: str | None) -> dict[str, float]:
    """Log the finished experiment to the active MLflow run (its ref and rev, the metrics it changed
    since ``since``, the `dvc exp run` log) and push it to ``remote`` (the experiment's git ref to the
    git remote, its outputs to the DVC remote); its metrics."""
    import mlflow

    mlflow.set_tags({"steprl.dvc_ref": result.ref, "steprl.dvc_rev": result.rev})
    mlflow.log_metrics(metrics := read_metrics(REPO, result.rev, since=since))
    mlflow.log_text(result.log, "dvc_exp_run.log")
    if remote:
        mlflow.log_text(push_experiment(REPO, remote, result.ref) + "\n", "dvc_exp_push.log")
        mlflow.set_tag("steprl.dvc_pushed_to", remote)
    return metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flows.pipeline", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the pipeline once as a DVC experiment")
    run.add_argument("-S", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    run.add_argument("-n", "--name", dest="experiment_name", default=None)
    run.add_argument("--baseline", choices=["head", "workspace"], default="head")
    run.add_argument("targets", nargs="*", help="DVC stages (default: the whole pipeline)")
    args = vars(parser.parse_args(argv))
    args.pop("command")
    try:
        print(json.dumps(pipeline(**args), indent=2))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    # Import ourselves as flows.pipeline so the flow pickles by its module path, not __main__.
    from flows.pipeline import main as _main

    _main()
