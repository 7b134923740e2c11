"""The deployments of flow `pipeline`: served from this process, or on a Prefect work pool for workers on
other machines (docs/scale-out.md).

    python -m flows.pool serve                     # pipeline/steprl (the Procfile of `make serve`)
    python -m flows.pool deploy --pool steprl      # make deploy POOL=steprl (make serve POOL=... runs it)

`serve` serves pipeline/steprl with Prefect's `flow.serve` (flow runs are subprocesses of it).
`deploy` registers pipeline/on-<pool> on process work pool <pool> (created if missing) with Prefect's own API.
A worker (`make worker POOL=<pool>`, i.e. `prefect worker start`) runs each flow run in its own clone:
the deployment's pull step enters the directory in the worker's STEPRL_REPO, and the worker's
PYTHONPATH imports that clone's `flows.pipeline`. Schedules made in the UI survive a re-deploy.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

from components.config import ConfigError

# The worker's clone: `make worker` exports it (its own directory); the pull step reads it at run time.
REPO_ENV = "STEPRL_REPO"
PULL_STEP = {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $" + REPO_ENV + " }}"}}
_POOL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def deployment_name(pool: str) -> str:
    """The name of the pool's deployment of flow `pipeline` (`pipeline/steprl` is the served one)."""
    return f"on-{check_pool(pool)}"


def check_pool(pool: str) -> str:
    """``pool`` if it is a usable work-pool name (it also names the deployment), else ConfigError."""
    if not isinstance(pool, str) or not _POOL.match(pool):
        raise ConfigError(
            f"POOL {pool!r}: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return pool


def kept_schedules(full_name: str) -> list[Any]:
    """The schedules deployment ``full_name`` (flow/deployment) has now, e.g. made in the UI, as
    creation objects: a re-deploy passes them back instead of replacing them by none. [] if none."""
    from prefect import get_client
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            found = client.read_deployment_by_name(full_name).schedules
        except ObjectNotFound:
            return []
    return [
        DeploymentScheduleCreate(schedule=s.schedule, active=s.active, parameters=s.parameters) for s in found
    ]


def ensure_pool(pool: str) -> None:
    """Create process work pool ``pool`` (`prefect work-pool create <pool> --type process`) unless it
    exists; ConfigError naming POOL when one of that name has another type."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            found = client.read_work_pool(pool)
        except ObjectNotFound:
            template = ProcessWorker.get_default_base_job_template()
            client.create_work_pool(WorkPoolCreate(name=pool, type="process", base_job_template=template))
            return
    if found.type != "process":
        raise ConfigError(
            f"POOL {pool!r}: that work pool has type {found.type!r}; steprl's workers need 'process'"
        )


def build_deployment(pool: str, overrides: list[str] | None = None) -> Any:
    """The RunnerDeployment of flow `pipeline` for ``pool``: module entrypoint flows.pipeline.pipeline,
    the clone-entering pull step, the deployment's current schedules, default ``overrides``."""
    from prefect.deployments.runner import EntrypointType
    from prefect.runner.storage import LocalStorage

    from flows import REPO
    from flows.pipeline import pipeline

    class WorkerClone(LocalStorage):  # the pull step of the worker's own clone, not this directory
        def to_pull_step(self) -> dict[str, Any]:
            return PULL_STEP

    name = deployment_name(pool)
    dep = pipeline.to_deployment(
        name=name,
        parameters={"overrides": overrides} if overrides else None,
        schedules=kept_schedules(f"pipeline/{name}") or None,
        tags=["steprl", f"pool:{pool}"],
        description=f"The steprl pipeline as a DVC experiment, run by the workers of pool {pool!r} "
        "(make worker POOL=...), each in its own clone.",
        entrypoint_type=EntrypointType.MODULE_PATH,
        work_pool_name=pool,
    )
    dep.storage = WorkerClone(str(REPO))
    return dep


def deploy(pool: str, overrides: list[str] | None = None) -> str:
    """Create the pool if needed and register (or update) pipeline/on-<pool> on it; returns its id."""
    ensure_pool(check_pool(pool))
    return str(build_deployment(pool, overrides).apply(work_pool_name=pool))


def serve(overrides: list[str] | None = None) -> None:
    """Serve pipeline/steprl from this process (blocks; flow runs are subprocesses) with the Procfile's
    settings: STEPRL_SCHEDULE_CRON or _INTERVAL (seconds), STEPRL_OVERRIDES (a JSON list). Without a
    schedule it keeps the deployment's schedules (made in the UI), which `serve` would replace by none.
    With STEPRL_WORK_POOL (make serve POOL=...) it first registers pipeline/on-<pool> on that work pool
    (:func:`deploy`), for the workers of other clones."""
    import warnings
    from datetime import timedelta

    from prefect.deployments.runner import EntrypointType

    from flows.pipeline import pipeline

    # Prefect's SIGTERM handler calls the async Runner.stop without awaiting it; keep its warning out
    warnings.filterwarnings("ignore", "coroutine 'Runner.astop' was never awaited")
    cron, interval = os.environ.get("STEPRL_SCHEDULE_CRON"), os.environ.get("STEPRL_SCHEDULE_INTERVAL")
    if overrides is None:
        overrides = json.loads(os.environ.get("STEPRL_OVERRIDES") or "[]")
    if pool := os.environ.get("STEPRL_WORK_POOL"):
        deploy(pool, overrides)
        print(f"deployment pipeline/{deployment_name(pool)} on work pool {pool!r}: `make worker POOL={pool}`")
    kept = [] if cron or interval else kept_schedules("pipeline/steprl")
    pipeline.serve(
        name="steprl",
        cron=cron or None,
        interval=timedelta(seconds=float(interval)) if interval else None,
        schedules=kept or None,
        parameters={"overrides": overrides} if overrides else None,
        limit=1,  # one run at a time, the next ones wait
        tags=["steprl"],
        description="The steprl pipeline as a DVC experiment (dvc exp run), logged to MLflow.",
        entrypoint_type=EntrypointType.MODULE_PATH,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.pool", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    dep = sub.add_parser(
        "deploy", help="register pipeline/on-<pool> on work pool <pool> (needs PREFECT_API_URL)"
    )
    dep.add_argument("--pool", required=True, help="the process work pool (created if missing)")
    dep.add_argument("-S", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    sub.add_parser("serve", help="serve the deployment pipeline/steprl (needs PREFECT_API_URL)")
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve()
        return 0
    try:
        if args.overrides:
            from flows import REPO
            from flows._experiments import plan_run

            plan_run(REPO, overrides=args.overrides)
        ident = deploy(args.pool, args.overrides or json.loads(os.environ.get("STEPRL_OVERRIDES") or "[]"))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"deployment pipeline/{deployment_name(args.pool)} ({ident}) on work pool {args.pool!r}")
    print(f"start a worker in each clone: make worker POOL={args.pool}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
