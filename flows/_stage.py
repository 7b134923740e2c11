"""What every stage flow shares: its command line, one-line errors, its MLflow run, and the record of
where its time went (timing/<stage>.json, read by benchmarks/stage_time.py)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import torch

from components.config import ConfigError, Params, flatten, load_params
from components.determinism import DeterminismSettings, make_deterministic
from components.io import write_json
from components.precision import resolve_rollout_dtype, resolve_train_dtype
from components.train.distributed import free_port
from components.train.rank_watch import RankFailed
from components.train.torchrun import NodeError
from flows import REPO, TIMING_DIR


class StageError(Exception):
    """A user-facing failure: bad data, a missing model, an incomplete checkpoint."""


# What a stage that ran out of GPU memory past the pre-flight (flows._gpu) tells the user to change.
OOM_HINT = (
    "lower train.micro_batch_size (sft.micro_batch_size for SFT) or rollout.gpu_memory_utilization, "
    "or use a smaller model.path"
)


# Where this process's stage spent its time: part -> seconds, filled by :func:`timed` (e.g. the rollout
# engine's start) and written by stage_main to timing/<stage>.json when the stage succeeds.
STAGE_PARTS: dict[str, float] = {}


@contextlib.contextmanager
def timed(part: str, parts: dict[str, float] | None = None) -> Iterator[None]:
    """Add the wall time of the block to ``parts[part]`` (default: this stage's :data:`STAGE_PARTS`)."""
    parts = STAGE_PARTS if parts is None else parts
    t0 = time.perf_counter()
    try:
        yield
    finally:
        parts[part] = parts.get(part, 0.0) + time.perf_counter() - t0


def process_age() -> float:
    """Seconds since this process was created (interpreter start and imports, when called first)."""
    return time.time() - psutil.Process().create_time()


def stage_name(
    run: Callable[..., Any], args: dict[str, Any], extra_args: tuple[tuple[str, dict], ...]
) -> str:
    """``python -m flows.train --algo grpo --rl-seed 0`` -> ``train-grpo-0``, ``flows.evaluate --model sft``
    -> ``evaluate-sft``: the last name of the stage's module and the values of its own arguments."""
    module = run.__module__
    if module == "__main__":  # run by ``python -m flows.<stage>``: the module's own name is in its spec
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        module = spec.name if spec else Path(sys.argv[0]).stem
    dests = [kw.get("dest", name.lstrip("-").replace("-", "_")) for name, kw in extra_args]
    return "-".join([module.rsplit(".", 1)[-1], *(str(args[d]) for d in dests)])


def write_stage_timing(name: str, process_start: float, run_s: float) -> Path:
    """timing/<name>.json: the process start (interpreter start to :func:`stage_main`), the parts timed
    with :func:`timed`, the rest of the run (``other``) and the total. Not a DVC output: the figures
    change with every run and must not change a cache key."""
    parts = {k: round(v, 2) for k, v in STAGE_PARTS.items()}
    return write_json(
        {
            "stage": name,
            "finished": datetime.now(UTC).isoformat(timespec="seconds"),
            "process_start": round(process_start, 2),
            "parts": parts,
            "other": round(run_s - sum(STAGE_PARTS.values()), 2),
            "total": round(process_start + run_s, 2),
        },
        TIMING_DIR / f"{name}.json",
    )


def stage_main(run: Callable[..., Any], *extra_args: tuple[str, dict]) -> None:
    """Run a stage from the command line; bad input ends it with ONE clear error line.

    Before ``run``, the process is made deterministic (:func:`make_stage_deterministic`: every random
    source seeded with ``params.seed``, a fixed thread count), so a rerun with the same inputs gives
    the same outputs. ``run`` checks its inputs (params, model path, source data) BEFORE it enters its
    Prefect flow, raising ConfigError or StageError, so a bad input stops the stage before any work.
    When it succeeds, where the time went is written to timing/<stage>.json (:func:`write_stage_timing`).
    """
    process_start = process_age()
    parser = argparse.ArgumentParser(prog=f"python -m {run.__module__}")
    parser.add_argument("--params", default="params.yaml", help="params file (default params.yaml)")
    for name, kw in extra_args:
        parser.add_argument(name, **kw)
    args = vars(parser.parse_args())
    try:
        t0 = time.perf_counter()
        params = read_params(args["params"])  # a bad file: one error line before Prefect's server code
        pick_temporary_server_port()  # before the seeding below
        make_stage_deterministic(params)
        run(**args)
        write_stage_timing(stage_name(run, args, extra_args), process_start, time.perf_counter() - t0)
    except (ConfigError, StageError) as err:
        for line in str(err).splitlines() or [type(err).__name__]:  # one line per problem
            print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
    except (RankFailed, NodeError) as err:  # a rank died, or torchrun's ranks do not fit or agree
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except torch.OutOfMemoryError as err:  # what the pre-flight (flows._gpu) could not foresee
        what = (str(err).splitlines() or ["CUDA out of memory"])[0][:160]
        print(f"error: out of GPU memory ({what}): {OOM_HINT}", file=sys.stderr)
        sys.exit(2)


def pick_temporary_server_port() -> int | None:
    """The port of this stage's temporary Prefect server (a stage run without a Prefect API, as by
    plain ``dvc repro``), chosen by the OS now. Prefect would draw it later with Python's global
    ``random``, which :func:`make_stage_deterministic` seeds: two stages of one seed running at once
    then drew the same port, the second found the first's server answering there, took it for its
    own, and failed when the first stage ended and stopped it ("Connection refused"). None (nothing
    done) when a Prefect API is configured."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the instance Prefect's clients start (one per process)
    if server.port is None:
        server.port = free_port()
    return server.port


def read_params(path: str) -> Params:
    return load_params(path)


_DETERMINISM: DeterminismSettings | None = None  # what stage_main set; tagged on the stage's MLflow run


def make_stage_deterministic(params: Params, threads: int | None = None) -> DeterminismSettings:
    """Seed random/numpy/torch with ``params.seed``, deterministic torch algorithms and a fixed thread
    count (``threads``; None: ``OMP_NUM_THREADS`` if set, else at most 2: components.determinism),
    before the stage does anything. The thread count can change float results: it is tagged on the MLflow run.

    ``params`` is the stage's validated params file (:func:`read_params`, which stage_main calls once
    before this). Stages that need their own streams still derive them from params.seed (e.g.
    per-iteration seeds).
    """
    global _DETERMINISM
    settings = _DETERMINISM = make_deterministic(params.seed, threads=threads)
    print(
        f"determinism: seed {settings.seed}, {settings.threads} torch thread(s), deterministic algorithms",
        flush=True,
    )
    return settings


def tracking_uri(params: Params) -> str:
    if params.mlflow.tracking_uri:
        return params.mlflow.tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    (REPO / "mlflow").mkdir(exist_ok=True)
    return f"sqlite:///{REPO / 'mlflow' / 'mlflow.db'}"


def artifact_root(uri: str) -> str | None:
    """Where a new experiment of a sqlite store keeps its artifacts: ``artifacts/`` beside the database
    file (mlflow/artifacts for the default mlflow/mlflow.db, also when a stage runs in a DVC
    experiment's temporary copy of the repo with MLFLOW_TRACKING_URI naming this repo's store); None
    (the server decides) for a tracking server."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri.removeprefix("sqlite:///")).parent / "artifacts").as_uri()


def ensure_experiment(name: str, artifact_location: str | None = None) -> str:
    """The id of the MLflow experiment ``name`` at the current tracking URI, created if missing.

    Safe when several processes create it at once: the loser of the race reads the winner's id.
    (``mlflow.set_experiment(name)`` alone is not: in MLflow 3.x its loser keeps the Default
    experiment active and logs its run there.)"""
    from mlflow.exceptions import MlflowException

    import mlflow

    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return mlflow.create_experiment(name, artifact_location=artifact_location)
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    return mlflow.get_experiment_by_name(name).experiment_id


# "1" (make worker): this process shares no disk with the MLflow server, so a run's artifacts must go
# through it (an experiment root mlflow-artifacts:/, as `make serve POOL=...` creates them).
SERVED_ARTIFACTS_ENV = "STEPRL_SERVED_ARTIFACTS"


def check_served_artifacts(experiment: str, location: str) -> None:
    """ConfigError naming the settings when experiment ``experiment`` keeps its artifacts at a
    ``file:`` location: a worker without a shared disk would write them to its own disk, unseen."""
    if location.startswith("file:") or ":" not in location:
        raise ConfigError(
            f"{SERVED_ARTIFACTS_ENV}=1: MLflow experiment {experiment!r} keeps its artifacts at {location}, "
            "a path on the server's disk; log to a new experiment (-S mlflow.experiment=<name>) made by "
            "`make serve POOL=...` (mlflow-artifacts:/), or SERVED_ARTIFACTS=0 if this worker shares that disk"
        )


@contextlib.contextmanager
def mlflow_run(
    params: Params,
    run_name: str,
    sections: list[str],
    tags: dict | None = None,
    run_id: str | None = None,
    extra_params: dict[str, Any] | None = None,
) -> Iterator[Any]:
    """An MLflow run in the task's experiment, with the params of ``sections`` logged flat (plus
    ``extra_params``, which win over a section's key of the same name).

    ``run_id`` resumes that run (a train stage restarted after a crash); its params are not relogged.
    A section may be a dotted path (``algorithms.grpo``). The run is tagged with where it came from
    (:func:`provenance_tags`: ``git.commit``, and ``dvc.exp_name`` ... under `dvc exp run`)."""
    import mlflow

    uri = tracking_uri(params)
    mlflow.set_tracking_uri(uri)
    name = params.mlflow.experiment or params.task
    location = artifact_root(uri)
    experiment_id = ensure_experiment(name, location)
    if os.environ.get(SERVED_ARTIFACTS_ENV) == "1":
        check_served_artifacts(name, mlflow.get_experiment(experiment_id).artifact_location)
    mlflow.set_experiment(experiment_id=experiment_id)
    dumped = params.model_dump()
    flat = {"task": params.task, "seed": params.seed}
    for s in sections:
        node = dumped
        for part in s.split("."):
            node = node[part]
        flat.update(flatten(node, f"{s}."))
    # the precision this machine runs (params may say auto), under keys every run has
    flat["precision.train"] = resolve_train_dtype(params.deepspeed.dtype)
    flat["precision.rollout"] = resolve_rollout_dtype(params.rollout.dtype)
    flat.update(extra_params or {})
    if run_id is not None:
        try:
            if mlflow.get_run(run_id).info.lifecycle_stage == "deleted":
                run_id = None
        except Exception:
            run_id = None
    kwargs = {"run_id": run_id} if run_id else {"run_name": run_name}
    if _DETERMINISM is not None:
        tags = {"steprl.torch_threads": str(_DETERMINISM.threads), **(tags or {})}
    tags = {"steprl.stage": run_name, **provenance_tags(), **(tags or {})}
    with mlflow.start_run(**kwargs, tags=tags) as run:
        commit = run.data.tags.get("mlflow.source.git.commit") or _git_commit()
        if commit:
            mlflow.set_tag("git.commit", commit)
        if not run_id:
            mlflow.log_params({k: ("null" if v is None else v) for k, v in flat.items()})
        print(f"MLflow: run '{run_name}' ({run.info.run_id}) in experiment '{name}' at {uri}", flush=True)
        yield run
        print(f"MLflow: open the UI with `make mlflow-ui` and look at experiment '{name}'", flush=True)


def log_metrics_once(metrics: dict[str, float], step: int) -> dict[str, float]:
    """Log ``metrics`` at ``step`` to the active MLflow run, only the keys the run has no value of at
    that step yet: a stage rerun after a kill continues its MLflow run (``mlflow_run(run_id=...)``)
    and must not log a step twice, nor leave out a key a killed run had not logged. Returns what it
    logged."""
    import mlflow

    run_id = mlflow.active_run().info.run_id
    history = mlflow.tracking.MlflowClient().get_metric_history
    new = {k: v for k, v in metrics.items() if all(m.step != step for m in history(run_id, k))}
    if new:
        mlflow.log_metrics(new, step=step)
    return new


# What `dvc repro` / `dvc exp run` tell a stage through its environment (dvc/env.py; set by
# dvc/stage/run.py and dvc/repo/experiments/queue/base.py): the MLflow tag each one becomes.
DVC_ENV_TAGS = {
    "DVC_EXP_NAME": "dvc.exp_name",
    "DVC_EXP_BASELINE_REV": "dvc.exp_baseline_rev",
    "DVC_STAGE": "dvc.stage",
}


def provenance_tags(environ: dict[str, str] | None = None) -> dict[str, str]:
    """MLflow tags naming the DVC experiment and stage this process runs in (only those DVC set):
    under `dvc exp run` the experiment's name and the git revision it started from, under any
    `dvc repro` the stage (e.g. ``train@grpo-0``)."""
    env = os.environ if environ is None else environ
    return {tag: env[var] for var, tag in DVC_ENV_TAGS.items() if env.get(var)}


def _git_commit() -> str | None:
    """The repo's HEAD commit (None outside a git checkout); MLflow's own
    ``mlflow.source.git.commit`` is preferred when MLflow found the entry point's repo."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def repo_path(p: str | Path) -> Path:
    p = Path(p)
    return p if p.is_absolute() else REPO / p
