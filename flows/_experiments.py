"""DVC experiments from code: a run's `-S` overrides, checked before anything runs, and one
`dvc exp run` that never touches the user's workspace (docs/service.md, "What a run starts from")."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from components.config import ConfigError, Params, load_params

Baseline = Literal["head", "workspace"]
# The pipeline flow's typed parameters and the params.yaml key each one sets (only when given).
PARAM_KEYS = {
    "task": "task",
    "seed": "seed",
    "algorithms": "compare.algorithms",
    "iterations": "train.iterations",
    "model_path": "model.path",
}
RUNS_DIR = Path(".dvc") / "tmp" / "steprl-runs"
# The git remote a run pushes its experiment to (`dvc exp push`, outputs to the DVC default remote);
# unset or empty: no push. `make worker` sets it (PUSH=origin). See docs/scale-out.md.
PUSH_ENV = "STEPRL_PUSH"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class ExperimentError(RuntimeError):
    """`dvc exp run` (or the git around it) failed; the message carries the last lines of its output."""


@dataclass
class ExperimentResult:
    name: str  # as `dvc exp show` lists it
    ref: str  # refs/exps/<baseline>/<name>
    rev: str  # the experiment commit
    baseline_rev: str  # the commit it was run from
    log: str = field(repr=False, default="")  # everything dvc printed


def hydra_value(value: Any, *, key: str = "value") -> str:
    """``value`` in Hydra override syntax, so that DVC writes exactly it into params.yaml (strings are
    always quoted: '1e-3' stays a string, 'null' the text "null")."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    if isinstance(value, (int, float)) and math.isfinite(value):
        return repr(value)
    if isinstance(value, str) and "${" not in value:  # DVC's OmegaConf would interpolate ${...}
        # Hydra quoted strings: escape quotes, double the backslashes before a quote or the end
        out = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
        return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, out) + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v, key=key) for v in value) + "]"
    raise ConfigError(
        f"{key}: {value!r} cannot be a params override (a finite number, a string without '${{', ...)"
    )


def build_overrides(*, overrides: Sequence[str] = (), **named: Any) -> list[str]:
    """The `-S` list of one run: the named parameters that are set (PARAM_KEYS), then ``overrides``
    (check_overrides checks them). A key set twice is an error naming it."""
    if unknown := sorted(set(named) - set(PARAM_KEYS)):
        raise ConfigError(f"unknown run parameter(s) {unknown}; valid: {sorted(PARAM_KEYS)}")
    if isinstance(overrides, str):
        raise ConfigError(f"overrides must be a list of key=value strings, got the string {overrides!r}")
    given = [
        (f"parameter {k!r}", f"{PARAM_KEYS[k]}={hydra_value(v, key=k)}")
        for k, v in named.items()
        if v is not None
    ]
    seen: dict[str, str] = {}
    for what, o in given + [(f"override {o!r}", o) for o in overrides]:
        if not isinstance(o, str) or "=" not in o:
            raise ConfigError(f"override {o!r}: expected key=value (e.g. sft.lr=0.001)")
        key = o.split("=", 1)[0].strip().lstrip("+")
        if key in seen:
            raise ConfigError(f"{what}: {key} is already set by {seen[key]}")
        seen[key] = what
    return [o.strip() for _, o in given] + [o.strip() for o in overrides]


def check_overrides(params_text: str, overrides: Sequence[str], source: str = "params.yaml") -> Params:
    """The typed params a run with ``overrides`` will see, or ConfigError naming the bad override/key.
    Applies them with DVC's own code (what `dvc exp run -S` does) to a copy of ``params_text``."""
    from dvc.exceptions import InvalidArgumentError
    from dvc.utils.hydra import apply_overrides

    with tempfile.TemporaryDirectory(prefix="steprl-params-") as tmp:
        path = Path(tmp) / "params.yaml"
        path.write_text(params_text)
        for o in overrides:
            try:
                apply_overrides(path, [o])
            except InvalidArgumentError as err:  # Hydra's message, or of two, one that says more
                msg = str(getattr(err.__cause__, "message", None) or err.__cause__ or err)
                if msg.startswith("Could not override"):
                    msg = f"params.yaml has no key {o.split('=', 1)[0]!r}"
                elif msg.startswith("Error merging override"):
                    msg = "a sweep (several values)? give one value per run (quote a string with commas)"
                raise ConfigError(f"override {o!r}: {' '.join(msg.split())}") from None
        try:
            return load_params(path)
        except ConfigError as err:
            label = source + (f" with overrides {list(overrides)}" if overrides else "")
            raise ConfigError(str(err).replace(str(path), label)) from None


def plan_run(
    repo: Path, baseline: Baseline = "head", overrides: Sequence[str] = (), **named: Any
) -> tuple[str, list[str], Params]:
    """(baseline commit, `-S` list, typed params) of a run, or ConfigError naming the bad key: the one
    check of `make serve`'s default overrides and of every flow run, before anything runs."""
    import dvc.api

    run_overrides, rev = build_overrides(overrides=overrides, **named), head_rev(repo)
    if baseline == "workspace":
        text = (repo / "params.yaml").read_text()
    else:
        text = dvc.api.read("params.yaml", repo=str(repo), rev=rev)
    return rev, run_overrides, check_overrides(text, run_overrides, f"params.yaml ({baseline})")


def check_experiment_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name or name.endswith(".lock"):
        raise ConfigError(
            f"experiment_name {name!r}: use 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if proc.returncode:
        raise ExperimentError(
            f"git {' '.join(args)} failed in {repo}: {(proc.stderr or proc.stdout).strip()}"
        )
    return proc.stdout.strip()


def head_rev(repo: Path) -> str:
    with contextlib.suppress(ExperimentError):
        return _git(repo, "rev-parse", "--verify", "HEAD^{commit}")
    raise ExperimentError(f"{repo} has no commit yet: DVC experiments need one (git commit first)")


def experiment_ref(repo: Path, rev: str, name: str) -> tuple[str, str] | None:
    """(ref, commit) of experiment ``name`` of baseline ``rev`` where DVC keeps it (ExpRefInfo), or None."""
    from dvc.repo.experiments.refs import ExpRefInfo

    ref = str(ExpRefInfo(rev, name))
    with contextlib.suppress(ExperimentError):
        return ref, _git(repo, "rev-parse", "--verify", "--quiet", ref)
    return None


def read_metrics(repo: Path, rev: str, since: str) -> dict[str, float]:
    """The numeric metrics (dvc.yaml `metrics`) that changed from ``since`` to ``rev``, as
    {"<file stem>.<key>": value}, from `dvc metrics diff --json`: a run of one stage does not report
    the baseline's metrics of stages it did not run."""
    cmd = [sys.executable, "-m", "dvc", "metrics", "diff", "--json", since, rev]
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ExperimentError(f"dvc metrics diff failed in {repo}: {proc.stderr.strip()[-2000:]}")
    return {
        f"{Path(path).stem}.{key}": float(change["new"])
        for path, changes in (json.loads(proc.stdout or "{}") or {}).items()
        for key, change in changes.items()
        if type(change.get("new")) in (int, float)
    }


def _stream(
    cmd: list[str], cwd: Path, env: dict[str, str], on_line: Callable[[str], None]
) -> tuple[int, str]:
    """Run ``cmd`` in its own process group, handing each output line to ``on_line`` (of a progress
    bar: its last state). Returns (exit code, output). The group is killed once the command exits
    (what it left might hold the output open) and when ``on_line`` or a signal interrupts: Prefect's
    SIGTERM handler raises in this (the main) thread, also while it waits for a line."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    threading.Thread(target=lambda: (proc.wait(), _kill_group(proc)), daemon=True).start()
    out: list[str] = []
    try:
        for raw in proc.stdout:  # bytes: text mode would make a line of each '\r' of a progress bar
            parts = [p.rstrip() for p in raw.decode(errors="replace").rstrip("\n").split("\r") if p.strip()]
            out.append(line := parts[-1] if parts else "")
            if line:
                on_line(line)
        return proc.wait(), "\n".join(out)
    finally:
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM the process group of ``proc``, SIGKILL what is left after ``grace`` seconds (an
    interrupted `dvc exp run` and its stage take about 8 s to wind down on 2 busy cores)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        end = time.monotonic() + wait
        with contextlib.suppress(ProcessLookupError):  # the group is gone
            os.killpg(proc.pid, sig)
            while time.monotonic() < end:
                proc.poll()  # reap the leader, or the group never looks empty
                os.killpg(proc.pid, 0)
                time.sleep(0.1)


@contextlib.contextmanager
def _head_clone(repo: Path, rev: str) -> Iterator[Path]:
    """A private clone of ``repo`` at ``rev`` with the repo's local DVC config and its DVC cache."""
    from dvc.repo import Repo

    run_dir = repo / RUNS_DIR / uuid.uuid4().hex[:12]
    try:
        _git(repo, "clone", "--quiet", "--shared", "--no-checkout", str(repo), str(run_dir))
        _git(run_dir, "checkout", "--quiet", "--detach", rev)
        if (repo / ".dvc" / "config.local").is_file():
            shutil.copy2(repo / ".dvc" / "config.local", run_dir / ".dvc" / "config.local")
        with Repo(str(repo)) as ours, Repo(str(run_dir)) as clone, clone.config.edit("local") as conf:
            conf.setdefault("cache", {})["dir"] = ours.cache.local_cache_dir
        yield run_dir
    finally:
        _remove_tree(run_dir)


def _left(path: Path) -> frozenset[str]:
    """What of ``path`` a removal left: its entries' paths, relative."""
    found = set()
    for root, dirs, files in os.walk(path):
        found.update(os.path.relpath(os.path.join(root, n), path) for n in (*dirs, *files))
    return frozenset(found)


def _remove_tree(path: Path, stalled: int = 4, most: int = 240, pause: float = 0.25) -> None:
    """Remove ``path``, retrying while a straggler (a detached git or dvc helper whose cwd is the
    clone) still writes into it: as long as each attempt finds something new left, however slow the
    straggler; it gives up when ``stalled`` attempts in a row leave the same entries (nothing writes:
    something else holds them) or after ``most`` attempts (a writer that never stops), and warns
    with the path."""
    before: frozenset[str] | None = None
    same = 0
    for _ in range(most):
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            return
        now = _left(path)
        same = same + 1 if now == before else 0
        if same >= stalled:
            break
        before = now
        time.sleep(pause)
    print(f"steprl: could not remove the run's clone {path}; delete it by hand", file=sys.stderr)


def run_experiment(
    repo: Path,
    overrides: Sequence[str],
    name: str,
    *,
    baseline: Baseline = "head",
    targets: Sequence[str] = (),
    env: dict[str, str] | None = None,
    on_line: Callable[[str], None] = print,
) -> ExperimentResult:
    """Run `dvc exp run -n <name> -S ... [targets]` from ``baseline`` without touching the workspace:
    "head" in a private clone whose experiment ref is then fetched into the repo, "workspace" as
    DVC's own `--temp` run. ``env``: the stages' environment. Raises ExperimentError (with the last
    lines of dvc's output) when dvc fails; the partial experiment is not kept."""
    repo, rev, temp = Path(repo).resolve(), head_rev(repo), ["--temp"] if baseline == "workspace" else []
    cmd = [sys.executable, "-m", "dvc", "--wait-for-lock", "exp", "run", "-n", name, *temp]
    cmd += [arg for o in overrides for arg in ("-S", o)] + list(targets)
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the stages' python

    def say(line: str) -> None:  # a head run's "applied to your workspace" is the clone's
        if "applied to your workspace" not in line:
            on_line(line)

    with contextlib.ExitStack() as stack:
        cwd = repo if temp else stack.enter_context(_head_clone(repo, rev))
        code, log = _stream(cmd, cwd, {**env, "PYTHONPATH": str(cwd)}, say)
        if code == 0 and not temp and (exp := experiment_ref(cwd, rev, name)):  # bring it into the repo
            _git(repo, "fetch", "--no-tags", str(cwd), f"{exp[0]}:{exp[0]}")
    if code != 0:
        tail = "\n".join(log.splitlines()[-30:])
        raise ExperimentError(f"dvc exp run failed (exit code {code}); last lines:\n{tail}")
    if not (exp := experiment_ref(repo, rev, name)):
        raise ExperimentError(
            f"dvc exp run finished but experiment {name!r} does not exist; output:\n{log[-3000:]}"
        )
    return ExperimentResult(name=name, ref=exp[0], rev=exp[1], baseline_rev=rev, log=log)


def push_remote(repo: Path, env: dict[str, str] | None = None) -> str | None:
    """The git remote the runs of ``repo`` push their experiments to (``STEPRL_PUSH`` in ``env``, by
    default os.environ), None when unset. ConfigError naming the setting when that git remote or a
    default DVC remote (`dvc remote add -d`, `make remote`) is missing: checked before a run starts."""
    from dvc.repo import Repo

    remote = (os.environ if env is None else env).get(PUSH_ENV, "").strip()
    if not remote:
        return None
    if remote not in _git(repo, "remote").split():
        raise ConfigError(f"{PUSH_ENV}={remote!r}: {repo} has no git remote of that name (`git remote -v`)")
    with Repo(str(repo)) as dvc_repo:
        if not dvc_repo.config["core"].get("remote"):
            raise ConfigError(
                f"{PUSH_ENV}={remote!r}: {repo} has no default DVC remote for the outputs; add one with"
                " `make remote DVC_REMOTE=<dir or s3://...>` (or unset PUSH)"
            )
    return remote


def push_experiment(repo: Path, remote: str, ref: str) -> str:
    """`dvc exp push <remote> <ref>`: the experiment's git ref to git remote ``remote`` and its cached
    outputs to the default DVC remote. Returns dvc's output; ExperimentError when it fails."""
    cmd = [sys.executable, "-m", "dvc", "exp", "push", remote, ref]
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ExperimentError(
            f"dvc exp push {remote} failed in {repo}: {(proc.stderr or proc.stdout).strip()[-2000:]}"
        )
    return (proc.stdout + proc.stderr).strip()
