"""DVC experiments from code: build and check `-S` overrides, run one experiment, read what it recorded.

What it does:
- turns typed run parameters (seed, model path, ...) and free `key=value` overrides into DVC's
  `-S` list (Hydra override syntax, the syntax `dvc exp run -S` takes), and checks the list BEFORE
  anything runs: DVC's own override code is applied to a copy of the baseline's params.yaml and the
  result is validated by the typed params (components/config.py), so a bad key or value fails with
  the key named;
- runs `dvc exp run` so that it can never collide with a user's own `dvc exp run` in the workspace:
  * baseline "head": in a private clone of the committed HEAD under `.dvc/tmp/steprl-runs/` (own git
    refs, own DVC lock, own outputs; the DVC cache is shared, as DVC's own temp runs share it), then
    the experiment's ref is fetched into the repo, so it shows in `dvc exp show` like any other;
  * baseline "workspace": DVC's own `dvc exp run --temp` (the workspace as it is, uncommitted changes
    to tracked files included, run in a temporary copy);
- reads the metrics files the experiment committed.

What it does not do: Prefect or MLflow (flows/pipeline.py wraps this), queue experiments, or move
outputs into the workspace (that is `dvc exp apply <name>`).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
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
PARAM_KEYS: dict[str, str] = {
    "task": "task",
    "seed": "seed",
    "algorithms": "compare.algorithms",
    "iterations": "train.iterations",
    "model_path": "model.path",
}

RUNS_DIR = Path(".dvc") / "tmp" / "steprl-runs"
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class ExperimentError(RuntimeError):
    """`dvc exp run` (or the git around it) failed; the message carries the last lines of its output."""


@dataclass
class ExperimentResult:
    name: str  # experiment name, as `dvc exp show` lists it
    ref: str  # git ref of the experiment commit, refs/exps/<baseline>/<name>
    rev: str  # the experiment commit
    baseline_rev: str  # the commit it was run from
    log: str = field(repr=False, default="")  # everything dvc printed


# ----------------------------------------------------------------------------------------------
# overrides


def hydra_value(value: Any, *, key: str = "value") -> str:
    """One value in Hydra override syntax, so that DVC writes exactly ``value`` into params.yaml.

    Strings are always quoted (``'1e-3'`` stays a string, ``null`` stays the text "null").
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(f"{key}: {value!r} is not a finite number")
        return repr(value)
    if isinstance(value, str):
        if "${" in value:  # OmegaConf would resolve it while DVC applies the override
            raise ConfigError(
                f"{key}: {value!r} contains '${{', which DVC's override parser would interpolate"
            )
        # Hydra quoted strings: escape quotes, and double the backslashes that precede a quote or the end.
        out = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
        out = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, out)
        return f"'{out}'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v, key=key) for v in value) + "]"
    raise ConfigError(f"{key}: cannot pass a {type(value).__name__} as a params override")


def _parse_one(override: str):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType, ValueType
    from hydra.errors import HydraException

    if isinstance(override, str):
        override = override.strip()
    if not isinstance(override, str) or "=" not in override:
        raise ConfigError(f"override {override!r}: expected key=value (e.g. sft.lr=0.001)")
    key = override.split("=", 1)[0]
    if ":" in key:
        raise ConfigError(f"override {override!r}: only params.yaml keys can be set (no '<file>:' prefix)")
    try:
        parsed = OverridesParser.create().parse_override(override)
    except HydraException as err:
        raise ConfigError(f"override {override!r}: not a valid key=value: {err}") from None
    if parsed.type == OverrideType.DEL:
        raise ConfigError(f"override {override!r}: deleting keys is not supported")
    if not _KEY.match(parsed.key_or_group):
        raise ConfigError(f"override {override!r}: {parsed.key_or_group!r} is not a dotted params key")
    if parsed.value_type != ValueType.ELEMENT:
        raise ConfigError(
            f"override {override!r}: is a sweep (several values); give one value per run "
            "(quote a string that contains commas)"
        )
    return parsed


def build_overrides(*, overrides: Sequence[str] = (), **named: Any) -> list[str]:
    """The `-S` list for one run: the named parameters that are set (see PARAM_KEYS), then ``overrides``.

    A key set twice (by a named parameter and an override, or by two overrides) is an error naming it.
    """
    unknown = sorted(set(named) - set(PARAM_KEYS))
    if unknown:
        raise ConfigError(f"unknown run parameter(s) {unknown}; valid: {sorted(PARAM_KEYS)}")
    out: list[str] = []
    seen: dict[str, str] = {}
    for name, value in named.items():
        if value is None:
            continue
        key = PARAM_KEYS[name]
        out.append(f"{key}={hydra_value(value, key=name)}")
        seen[key] = f"parameter {name!r}"
    if isinstance(overrides, str):
        raise ConfigError(f"overrides must be a list of key=value strings, got the string {overrides!r}")
    for o in overrides:
        key = _parse_one(o).key_or_group
        if key in seen:
            raise ConfigError(f"override {o!r}: {key} is already set by {seen[key]}")
        seen[key] = f"override {o!r}"
        out.append(o.strip())
    return out


def check_overrides(params_text: str, overrides: Sequence[str], source: str = "params.yaml") -> Params:
    """The typed params a run with ``overrides`` will see, or ConfigError naming the bad override/key.

    Applies the overrides with DVC's own code (what `dvc exp run -S` does) to a copy of ``params_text``.
    """
    from dvc.exceptions import InvalidArgumentError
    from dvc.utils.hydra import apply_overrides

    with tempfile.TemporaryDirectory(prefix="steprl-params-") as tmp:
        path = Path(tmp) / "params.yaml"
        path.write_text(params_text)
        for o in overrides:
            _parse_one(o)
            o = o.strip()
            try:
                apply_overrides(path, [o])
            except InvalidArgumentError as err:
                cause = err.__cause__
                msg = getattr(cause, "message", None) or str(cause or err)
                if msg.startswith("Could not override"):
                    msg = f"params.yaml has no key {_parse_one(o).key_or_group!r}"
                raise ConfigError(f"override {o!r}: {' '.join(msg.split())}") from None
        try:
            return load_params(path)
        except ConfigError as err:
            label = source + (f" with overrides {list(overrides)}" if overrides else "")
            raise ConfigError(str(err).replace(str(path), label)) from None


def check_experiment_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name or name.endswith(".lock"):
        raise ConfigError(
            f"experiment_name {name!r}: use 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


# ----------------------------------------------------------------------------------------------
# git / dvc helpers


def _git(repo: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ExperimentError(
            f"git {' '.join(args)} failed in {repo}: {proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc.stdout.strip()


def head_rev(repo: Path) -> str:
    rev = _git(repo, "rev-parse", "--verify", "--quiet", "HEAD^{commit}", check=False)
    if not rev:
        raise ExperimentError(f"{repo} has no commit yet: DVC experiments need one (git commit first)")
    return rev


def experiment_ref(baseline_rev: str, name: str) -> str:
    """Where DVC keeps an experiment: refs/exps/<first 2 hex>/<other 38 hex>/<name>."""
    return f"refs/exps/{baseline_rev[:2]}/{baseline_rev[2:]}/{name}"


def ref_exists(repo: Path, ref: str) -> bool:
    return bool(_git(repo, "rev-parse", "--verify", "--quiet", ref, check=False))


def _read_at(repo: Path, baseline: Baseline, rev: str, path: str) -> str | None:
    """A file of the workspace, or as committed at ``rev`` (dvc.api.read); None if it is not there."""
    import dvc.api
    from dvc.exceptions import PathMissingError

    if baseline == "workspace":
        return (repo / path).read_text() if (repo / path).is_file() else None
    try:
        return dvc.api.read(path, repo=str(repo), rev=rev)
    except PathMissingError:
        return None


def params_at(repo: Path, baseline: Baseline, rev: str) -> str:
    text = _read_at(repo, baseline, rev, "params.yaml")
    if text is None:
        raise ExperimentError(
            f"params.yaml is not committed at {rev[:8]}; commit it or use baseline='workspace'"
        )
    return text


def check_targets(repo: Path, baseline: Baseline, rev: str, targets: Sequence[str]) -> list[str]:
    """``targets`` must name stages of dvc.yaml (``name`` or ``name@item``); ConfigError lists the valid ones."""
    import yaml

    if not targets:
        return []
    text = _read_at(repo, baseline, rev, "dvc.yaml")
    stages = sorted(((yaml.safe_load(text) or {}).get("stages") or {}) if text else {})
    for t in targets:
        if not isinstance(t, str) or t.split("@", 1)[0] not in stages:
            raise ConfigError(f"targets: {t!r} is not a stage of dvc.yaml; stages: {', '.join(stages)}")
    return list(targets)


def dirty_files(repo: Path) -> list[str]:
    """Tracked files with uncommitted changes (what a workspace-baseline run would include)."""
    out = _git(repo, "status", "--porcelain", "--untracked-files=no")
    return [line[3:] for line in out.splitlines() if line.strip()]


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
        if isinstance(change.get("new"), (int, float)) and not isinstance(change.get("new"), bool)
    }


def _cache_dir(repo: Path) -> str:
    from dvc.repo import Repo

    with contextlib.closing(Repo(str(repo))) as r:
        return str(r.cache.local_cache_dir)


def _stream(
    cmd: list[str], cwd: Path, env: dict[str, str], on_line: Callable[[str], None]
) -> tuple[int, str]:
    """Run ``cmd`` in its own process group and hand each output line to ``on_line`` (in this thread).

    Returns (exit code, output) once the command exits; whatever it left running in its group is
    then killed (also when ``on_line`` or a signal interrupts the wait), so nothing outlives the run.
    """
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    pending: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(proc.stdout, pending), daemon=True)
    reader.start()
    lines: list[str] = []

    def drain(timeout: float) -> None:
        try:
            line = pending.get(timeout=timeout)
            while True:
                lines.append(line)
                if line:
                    on_line(line)
                line = pending.get_nowait()
        except queue.Empty:
            pass

    try:
        while proc.poll() is None:
            drain(0.2)
        reader.join(timeout=5.0)  # a leftover process may hold the pipe open: do not wait for it
        drain(0)
        return proc.returncode, "\n".join(lines)
    finally:
        _kill_group(proc)


def _read_lines(stream, out: queue.Queue) -> None:
    with contextlib.suppress(ValueError, OSError):
        for raw in stream:  # bytes: text mode would turn every '\r' of a progress bar into a line
            text = raw.decode("utf-8", errors="replace").rstrip("\n")
            parts = [p.rstrip() for p in text.split("\r") if p.strip()]
            out.put(parts[-1] if parts else "")  # a progress bar's last state


def _kill_group(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM the process group of ``proc``, SIGKILL what is left after ``grace`` seconds.

    (An interrupted `dvc exp run` and its stage take about 8 s to wind down on 2 busy cores.)"""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        end = time.monotonic() + wait
        while time.monotonic() < end:
            proc.poll()  # reap the leader, or the group never looks empty
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
    proc.poll()


def _remove_stale_runs(repo: Path) -> None:
    """Delete clones left by runs whose process died without cleaning up (e.g. SIGKILL)."""
    root = repo / RUNS_DIR
    for d in root.glob("*") if root.is_dir() else []:
        try:
            pid = int((d / ".steprl-owner").read_text().split()[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (OSError, ValueError, IndexError):
            continue


def _share_cache(repo: Path, run_dir: Path) -> None:
    """The clone's local DVC config: the repo's own (remotes, ...) with cache.dir = the repo's cache."""
    from configobj import ConfigObj

    local = repo / ".dvc" / "config.local"
    if local.is_file():
        shutil.copy2(local, run_dir / ".dvc" / "config.local")
    conf = ConfigObj(str(run_dir / ".dvc" / "config.local"))
    conf.setdefault("cache", {})["dir"] = _cache_dir(repo)
    conf.write()


@contextlib.contextmanager
def _head_clone(repo: Path, rev: str, name: str) -> Iterator[Path]:
    """A private clone of ``repo`` at ``rev`` that shares the repo's DVC cache; removed afterwards."""
    _remove_stale_runs(repo)
    run_dir = repo / RUNS_DIR / f"{name}-{uuid.uuid4().hex[:8]}"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        _git(repo, "clone", "--quiet", "--shared", "--no-checkout", str(repo), str(run_dir))
        (run_dir / ".steprl-owner").write_text(f"{os.getpid()}\n")
        _git(run_dir, "checkout", "--quiet", "--detach", rev)
        _share_cache(repo, run_dir)
        yield run_dir
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


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
    """Run `dvc exp run -n <name> -S ... [targets]` from ``baseline`` without touching the workspace.

    ``env`` is the environment of the run (the stage commands inherit it). Raises ExperimentError
    (with the last lines of dvc's output) when dvc fails; the partial experiment is not kept.
    """
    repo = Path(repo).resolve()
    check_experiment_name(name)
    if baseline not in ("head", "workspace"):
        raise ConfigError(f"baseline {baseline!r}: use 'head' or 'workspace'")
    rev = head_rev(repo)
    ref = experiment_ref(rev, name)
    if ref_exists(repo, ref):
        raise ConfigError(
            f"experiment_name {name!r}: an experiment of that name already exists for {rev[:7]}"
        )
    dvc = [sys.executable, "-m", "dvc", "--wait-for-lock", "exp", "run", "-n", name]
    for o in overrides:
        dvc += ["-S", o]
    dvc += list(targets)
    env = dict(os.environ if env is None else env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    bin_dir = str(Path(sys.executable).parent)
    if not env.get("PATH", "").startswith(bin_dir):
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")

    if baseline == "workspace":
        env["PYTHONPATH"] = str(repo)
        code, log = _stream(dvc[:6] + ["--temp"] + dvc[6:], repo, env, on_line)
    else:
        with _head_clone(repo, rev, name) as run_dir:
            env["PYTHONPATH"] = str(run_dir)  # the clone's code, not an editable install's
            # dvc's "applied to your workspace" means the clone's; the user's workspace is untouched
            quiet = lambda line: None if "applied to your workspace" in line else on_line(line)  # noqa: E731
            code, log = _stream(dvc, run_dir, env, quiet)
            if code == 0:
                fetched = subprocess.run(
                    ["git", "fetch", "--quiet", "--no-tags", str(run_dir), f"{ref}:{ref}"],
                    cwd=repo,
                    capture_output=True,
                    text=True,
                )
                if fetched.returncode != 0:
                    raise ExperimentError(
                        f"could not bring experiment {name!r} back: {fetched.stderr.strip()}"
                    )
    if code != 0:
        tail = "\n".join(log.splitlines()[-30:])
        raise ExperimentError(f"dvc exp run failed (exit code {code}); last lines:\n{tail}")
    if not ref_exists(repo, ref):
        raise ExperimentError(f"dvc exp run finished but {ref} does not exist; output:\n{log[-3000:]}")
    return ExperimentResult(name=name, ref=ref, rev=_git(repo, "rev-parse", ref), baseline_rev=rev, log=log)
