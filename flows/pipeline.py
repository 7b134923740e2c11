"""Flow `pipeline`: the whole DVC pipeline as one DVC experiment; the flow the Prefect UI schedules.

A run checks its parameters against the typed params BEFORE anything runs (a bad key fails the run
with the key named), opens a parent MLflow run, runs `dvc exp run -n <name> -S ...` without touching
the user's workspace (flows/_experiments.py: a private clone of HEAD by default), streams dvc's output
to the Prefect logs, and records the experiment (name, git ref, metrics) on the parent MLflow run.
Stage runs (sft, evaluate-sft, grpo-s0, ...) are logged as its children, so one scheduled run is one row in the
MLflow UI, one flow run in the Prefect UI and one row in `dvc exp show`.

Run it:
    python -m flows.pipeline run -S seed=1 -S sft.steps=50      # once, here
    python -m flows.pipeline serve --cron "0 3 * * *"           # served deployment (see flows/serve.py)

The stage processes get PREFECT_API_URL and MLFLOW_TRACKING_URI from this process, so under
`make serve` they report to the Prefect server and log through the MLflow tracking server.
"""

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Annotated, Any, Literal

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from pydantic import Field

from components.config import ConfigError
from flows import REPO
from flows._experiments import (
    ExperimentResult,
    build_overrides,
    check_experiment_name,
    check_overrides,
    check_targets,
    dirty_files,
    experiment_ref,
    head_rev,
    params_at,
    read_metrics,
    ref_exists,
    run_experiment,
)
from flows._stage import flatten, tracking_uri

DEPLOYMENT = "steprl"  # served as pipeline/steprl


@task(name="check-parameters", cache_policy=NO_CACHE)
def plan_run(
    overrides: list[str], baseline: str, experiment_name: str | None, targets: list[str] | None = None
) -> dict[str, Any]:
    """Resolve and validate everything a run needs; raises ConfigError naming the bad key."""
    rev = head_rev(REPO)
    params = check_overrides(params_at(REPO, baseline, rev), overrides, source=f"params.yaml ({baseline})")
    targets = check_targets(REPO, baseline, rev, targets or [])
    name = check_experiment_name(experiment_name or _default_name())
    if ref_exists(REPO, experiment_ref(rev, name)):
        if experiment_name:
            raise ConfigError(
                f"experiment_name {name!r}: an experiment of that name already exists for {rev[:7]}"
            )
        name = f"{name}-{int(time.time()) % 100000}"
    dirty = dirty_files(REPO) if baseline == "workspace" else []
    log = get_run_logger()
    log.info(
        "experiment %r from %s (%s), overrides: %s", name, baseline, rev[:7], " ".join(overrides) or "none"
    )
    if dirty:
        log.warning("baseline 'workspace' includes uncommitted changes to: %s", ", ".join(dirty))
    return {
        "name": name,
        "baseline": baseline,
        "baseline_rev": rev,
        "overrides": overrides,
        "params": params.model_dump(mode="json"),
        "mlflow_uri": tracking_uri(params),
        "mlflow_experiment": params.mlflow.experiment or params.task,
        "dirty": dirty,
        "targets": targets,
    }


@task(name="dvc-exp-run", cache_policy=NO_CACHE)
def dvc_exp_run(plan: dict[str, Any], env: dict[str, str]) -> ExperimentResult:
    """`dvc exp run` with the plan's overrides; every output line goes to the Prefect log."""
    log = get_run_logger()
    return run_experiment(
        REPO,
        plan["overrides"],
        plan["name"],
        baseline=plan["baseline"],
        targets=plan["targets"],
        env=env,
        on_line=log.info,
    )


@flow(name="pipeline", persist_result=True)
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
    run_overrides = build_overrides(
        task=task,
        algorithms=algorithms,
        seed=seed,
        iterations=iterations,
        model_path=model_path,
        overrides=overrides,
    )
    plan = plan_run(run_overrides, baseline, experiment_name, targets)
    with parent_mlflow_run(plan) as run_id:
        result = dvc_exp_run(plan, stage_env(plan, run_id))
        metrics = record_experiment(run_id, plan, result)
    return {
        "experiment": result.name,
        "ref": result.ref,
        "rev": result.rev,
        "baseline_rev": result.baseline_rev,
        "overrides": run_overrides,
        "mlflow_run_id": run_id,
        "metrics": metrics,
    }


# ----------------------------------------------------------------------------------------------
# MLflow: one parent run per pipeline run; stage runs become its children


def _default_name() -> str:
    from prefect.runtime import flow_run

    name = flow_run.get_name()
    return name if name else time.strftime("run-%Y%m%d-%H%M%S")


def _artifact_location(uri: str) -> str | None:
    """Artifacts of experiments created here go to mlflow/artifacts, as for runs logged without a server."""
    local = uri.startswith("sqlite:") or any(h in uri for h in ("//127.0.0.1", "//localhost"))
    return (REPO / "mlflow" / "artifacts").as_uri() if local else None


@contextlib.contextmanager
def parent_mlflow_run(plan: dict[str, Any]) -> Iterator[str]:
    from prefect.runtime import deployment, flow_run

    import mlflow

    mlflow.set_tracking_uri(plan["mlflow_uri"])
    name = plan["mlflow_experiment"]
    if mlflow.get_experiment_by_name(name) is None:
        (REPO / "mlflow").mkdir(exist_ok=True)
        with contextlib.suppress(Exception):  # created concurrently by another run
            mlflow.create_experiment(name, artifact_location=_artifact_location(plan["mlflow_uri"]))
    experiment = mlflow.set_experiment(name)
    tags = {
        "steprl.stage": "pipeline",
        "steprl.dvc_exp": plan["name"],
        "steprl.baseline": plan["baseline"],
        "steprl.baseline_rev": plan["baseline_rev"],
        "steprl.overrides": " ".join(plan["overrides"]) or "(none)",
        "steprl.targets": " ".join(plan["targets"]) or "(all)",
        "prefect.flow_run_id": str(flow_run.get_id() or ""),
        "prefect.flow_run_name": str(flow_run.get_name() or ""),
        "prefect.deployment": str(deployment.get_name() or ""),
    }
    if plan["dirty"]:
        tags["steprl.uncommitted"] = ", ".join(plan["dirty"])[:5000]
    with mlflow.start_run(
        experiment_id=experiment.experiment_id, run_name=f"pipeline {plan['name']}", tags=tags
    ) as run:
        flat = flatten(plan["params"])
        items = [
            (k, "null" if v is None else json.dumps(v) if isinstance(v, (list, dict)) else v)
            for k, v in flat.items()
        ]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per call
            mlflow.log_params(dict(items[i : i + 100]))
        get_run_logger().info(
            "MLflow: run %s in experiment %r at %s", run.info.run_id, name, plan["mlflow_uri"]
        )
        try:
            yield run.info.run_id
        except BaseException as err:  # the run ends FAILED; keep why next to it
            with contextlib.suppress(Exception):
                mlflow.log_text(f"{type(err).__name__}: {err}\n", "error.txt")
            raise


def stage_env(plan: dict[str, Any], run_id: str) -> dict[str, str]:
    """Environment of `dvc exp run`: same Prefect server, same MLflow store, stage runs as children."""
    from prefect.runtime import flow_run
    from prefect.settings import PREFECT_API_URL

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT__")}  # runner internals
    api = PREFECT_API_URL.value()
    if api and "ephemeral" not in api:
        env["PREFECT_API_URL"] = api
    env["PREFECT_HOME"] = os.environ.get("PREFECT_HOME", str(REPO / ".prefect"))
    env["MLFLOW_TRACKING_URI"] = plan["mlflow_uri"]
    env["MLFLOW_RUN_CONTEXT"] = json.dumps(
        {
            "mlflow.parentRunId": run_id,
            "steprl.dvc_exp": plan["name"],
            "prefect.flow_run_id": str(flow_run.get_id() or ""),
        }
    )
    return env


def record_experiment(run_id: str, plan: dict[str, Any], result: ExperimentResult) -> dict[str, float]:
    """Tag the parent run with the experiment's ref, log the metrics it changed and dvc's output."""
    import mlflow

    client = mlflow.MlflowClient(plan["mlflow_uri"])
    client.set_tag(run_id, "steprl.dvc_ref", result.ref)
    client.set_tag(run_id, "steprl.dvc_rev", result.rev)
    metrics = read_metrics(REPO, result.rev, since=result.baseline_rev)
    if metrics:
        mlflow.log_metrics(metrics)
    mlflow.log_text(result.log, "dvc_exp_run.log")
    get_run_logger().info(
        "DVC experiment %r (%s): `dvc exp show`, `dvc exp apply %s`", result.name, result.rev[:7], result.name
    )
    return metrics


# ----------------------------------------------------------------------------------------------
# command line


def serve_pipeline(
    name: str = DEPLOYMENT,
    cron: str | None = None,
    interval: float | None = None,
    overrides: list[str] | None = None,
    limit: int | None = 1,
) -> None:
    """Serve the deployment pipeline/<name> from this process (blocks; flow runs are subprocesses)."""
    import warnings

    from prefect import get_client
    from prefect.deployments.runner import EntrypointType

    # Prefect's SIGTERM handler calls the async Runner.stop without awaiting it (the schedules are
    # still paused on the way out); keep its warning out of the `make serve` output.
    warnings.filterwarnings("ignore", "coroutine 'Runner.astop' was never awaited")
    parameters = {"overrides": list(overrides)} if overrides else None
    with get_client(sync_client=True) as client:  # started next to the server: wait until it answers
        deadline = time.monotonic() + 240
        while client.api_healthcheck() is not None:
            if time.monotonic() > deadline:
                raise ConfigError(f"the Prefect API at {client.api_url} did not answer within 240 s")
            time.sleep(0.5)
    if overrides:
        check_overrides(params_at(REPO, "head", head_rev(REPO)), build_overrides(overrides=overrides))
    # No schedule flag: keep the schedules the deployment already has (set in the UI), which
    # `serve` would otherwise replace by none. A flag replaces them.
    schedules = None if cron or interval else existing_schedules(name)
    pipeline.serve(
        name=name,
        cron=cron,
        interval=timedelta(seconds=interval) if interval else None,
        schedules=schedules,
        parameters=parameters,
        limit=limit,
        tags=["steprl"],
        description="The steprl pipeline as a DVC experiment (dvc exp run), logged to MLflow.",
        entrypoint_type=EntrypointType.MODULE_PATH,
    )


def existing_schedules(name: str = DEPLOYMENT) -> list | None:
    """The schedules of deployment pipeline/<name> on the Prefect server (None if it has none or is new)."""
    from prefect import get_client
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            dep = client.read_deployment_by_name(f"pipeline/{name}")
        except ObjectNotFound:
            return None
    kept = [
        DeploymentScheduleCreate(schedule=s.schedule, active=s.active, parameters=s.parameters or {})
        for s in dep.schedules or []
    ]
    return kept or None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flows.pipeline", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the pipeline once as a DVC experiment")
    run.add_argument("-S", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    run.add_argument("-n", "--name", dest="experiment_name", default=None)
    run.add_argument("--baseline", choices=["head", "workspace"], default="head")
    run.add_argument("targets", nargs="*", help="DVC stages (default: the whole pipeline)")
    # `make serve` (the Procfile) passes its flags through the environment; flags here win.
    env = os.environ.get
    srv = sub.add_parser("serve", help="serve the deployment pipeline/<name> (needs PREFECT_API_URL)")
    srv.add_argument("--name", default=env("STEPRL_DEPLOYMENT") or DEPLOYMENT)
    srv.add_argument("--cron", default=env("STEPRL_SCHEDULE_CRON") or None, help='e.g. "0 3 * * *"')
    srv.add_argument("--interval", type=float, default=env("STEPRL_SCHEDULE_INTERVAL") or None)
    srv.add_argument(
        "-S",
        "--set",
        dest="overrides",
        action="append",
        default=json.loads(env("STEPRL_OVERRIDES") or "[]"),
        metavar="KEY=VALUE",
        help="default overrides of scheduled runs (editable in the UI)",
    )
    srv.add_argument("--limit", type=int, default=int(env("STEPRL_LIMIT") or 1), help="most runs at once")
    args = vars(parser.parse_args(argv))
    command = args.pop("command")
    try:
        if command == "serve":
            serve_pipeline(**args)
        else:
            args["targets"] = args["targets"] or None
            print(json.dumps(pipeline(**args), indent=2))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    # Import ourselves as flows.pipeline so the served flow pickles by its module path, not __main__.
    from flows.pipeline import main as _main

    _main()
