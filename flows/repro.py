"""`make repro`: `dvc repro` with one Prefect server for all its stages.

Without a Prefect API a stage flow starts a temporary Prefect server of its own, which costs every
stage several seconds (tens under load) and, when two runs start at the same instant, can put both on
one port. This command starts one server (`prefect server start`, 127.0.0.1, a free port, no UI, no
background services), runs the command after ``--`` (default: ``dvc repro``) with ``PREFECT_API_URL``
pointing at it, and stops the server however the command ends. The flow runs land in the same
database as always (``.prefect/``), so `make serve`'s UI shows them. With ``PREFECT_API_URL`` already
set (a running `make serve`), the command runs against that server and nothing is started.

    python -m flows.repro                 # dvc repro
    python -m flows.repro -- dvc repro -f sft
    python -m flows.repro --profile sokoban [-S key=value ...]   # dvc exp run with params.yaml's profile

``--profile NAME`` runs ``dvc exp run`` with one ``-S key=value`` per entry of ``profiles.NAME`` in
params.yaml (then any further arguments, e.g. more ``-S``), after checking the profile there.
``dvc exp run -S`` leaves its values in the workspace's params.yaml, and a profile sets only its own
keys, so a value an earlier experiment set (``-S tasks.sokoban.repeat_hint=true``) applies to the
next run too: before it starts, a warning names every key whose value differs from the last commit's
params.yaml and that neither the profile nor a ``-S`` sets (``git checkout params.yaml`` restores them).
``-h`` / ``--help`` (before ``--``) prints this text and starts nothing.

When the command ends, a short table says where the time went: each stage this run ran (its
``timing/<stage>.json``, written when a stage succeeds; stages DVC found up to date are not in it),
its wall time, the share that was the process start (imports) and its largest timed parts, then
the stages' sum against the run's own wall time (the rest: DVC, the Prefect server, hand-offs).

The command runs with this interpreter's directory first on PATH, so that the venv's ``dvc`` and,
in the stages DVC starts, its ``python`` are found when the venv is not activated
(``.venv/bin/python -m flows.repro``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flows import PREFECT_STARTUP_TIMEOUT_S, REPO, TIMING_DIR
from flows.serve import get_json


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, log: Path) -> subprocess.Popen:
    """A Prefect API server on 127.0.0.1:port (no UI, no background services) in its own session."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PREFECT_HOME": os.environ["PREFECT_HOME"], "PREFECT_UI_ENABLED": "false"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "prefect",
                "server",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-services",
            ],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + PREFECT_STARTUP_TIMEOUT_S
    while get_json(f"http://127.0.0.1:{port}/api/health")[0] != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(proc)
            raise SystemExit(
                f"repro: the Prefect server did not start on 127.0.0.1:{port} "
                f"(exit {proc.returncode}); its log: {log}"
            )
        time.sleep(0.5)
    return proc


def stop_server(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM to the server's process group, SIGKILL after ``grace_s``."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def command_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this interpreter's bin directory (the venv's) first on PATH."""
    bin_dir = str(Path(sys.executable).parent)
    path = env.get("PATH", "")
    if path.split(os.pathsep)[:1] == [bin_dir]:
        return env
    return {**env, "PATH": bin_dir + os.pathsep + path if path else bin_dir}


def profile_command(name: str, extra: list[str], params: Path) -> list[str]:
    """``dvc exp run -S key=value ...`` of ``profiles.<name>`` (values in JSON, which DVC's override
    grammar reads), then ``extra``. Raises ConfigError naming the profile when it is unknown or invalid."""
    from components.config import ConfigError, load_params

    profiles = load_params(params).profiles
    if name not in profiles:
        raise ConfigError(f"{params}: profiles.{name}: no such profile (known: {sorted(profiles)})")
    load_params(params, overrides=profiles[name])  # the params as the run will see them must be valid
    sets = [arg for key, value in profiles[name].items() for arg in ("-S", f"{key}={json.dumps(value)}")]
    return ["dvc", "exp", "run", *sets, *extra]


def params_drift(current: dict[str, Any], committed: dict[str, Any], set_keys: set[str]) -> list[str]:
    """Keys of ``current`` params whose value differs from ``committed`` (both parsed params.yaml),
    not under ``profiles`` and not set by the run (``set_keys``, dotted, or a section above them), as
    ``key = value (committed: value)``, sorted."""

    from components.config import flatten

    def is_set(key: str) -> bool:
        return any(key == k or key.startswith(k + ".") for k in set_keys)

    now = {k: v for k, v in flatten(current).items() if not k.startswith("profiles.")}
    then = {k: v for k, v in flatten(committed).items() if not k.startswith("profiles.")}

    def shown(tree: dict[str, Any], key: str) -> str:
        return json.dumps(tree[key]) if key in tree else "absent"

    return [
        f"{key} = {shown(now, key)} (committed: {shown(then, key)})"
        for key in sorted(set(now) | set(then))
        if (key in now, now.get(key)) != (key in then, then.get(key)) and not is_set(key)
    ]


def set_param_keys(command: list[str], params_file: str = "params.yaml") -> set[str]:
    """The dotted keys of ``params_file`` a ``dvc exp run`` command sets, in each of its spellings:
    ``-S key=value``, ``-Skey=value``, ``--set-param key=value``, ``--set-param=key=value``, each
    value with or without a file (``params.yaml:key=value``; another file's keys are not this file's)
    and Hydra's prefixes (``+key``, ``++key``, ``~key``: added, forced, removed)."""
    values = []
    for i, arg in enumerate(command):
        if arg in ("-S", "--set-param") and i + 1 < len(command):
            values.append(command[i + 1])
        elif arg.startswith("--set-param="):
            values.append(arg.removeprefix("--set-param="))
        elif arg.startswith("-S") and len(arg) > 2 and not arg.startswith("--"):
            values.append(arg[2:])
    keys = set()
    for value in values:
        target = value.split("=", 1)[0]
        file, _, key = target.rpartition(":")
        if file and os.path.normpath(file) != params_file:
            continue
        keys.add(key.lstrip("+~"))
    return keys


def _committed_params(params: Path) -> dict[str, Any] | None:
    """params.yaml as the repo's last commit has it; None outside a git checkout or without one."""
    import yaml

    try:
        out = subprocess.run(
            ["git", "show", f"HEAD:{params.name}"],
            cwd=params.parent,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return yaml.safe_load(out.stdout) if out.returncode == 0 else None


def warn_params_drift(command: list[str], params: Path) -> None:
    """Print which params.yaml values left by earlier experiments this profile run keeps."""
    import yaml

    committed = _committed_params(params)
    if committed is None:
        return
    drift = params_drift(yaml.safe_load(params.read_text()), committed, set_param_keys(command, params.name))
    if drift:
        print(
            f"repro: warning: {params.name} differs from the last commit in keys this run does not set, "
            "and the run uses them (an earlier `dvc exp run -S` leaves its values there; "
            f"`git checkout {params.name}` restores the committed ones):\n  " + "\n  ".join(drift),
            file=sys.stderr,
            flush=True,
        )


def stages_since(timing: Path, since: datetime) -> list[dict[str, Any]]:
    """The timing/<stage>.json records of stages that finished at or after ``since`` (UTC), in the order
    they finished; files that are not such a record are skipped."""
    records = []
    for f in timing.glob("*.json"):
        try:
            r = json.loads(f.read_text())
            finished = datetime.fromisoformat(r["finished"])
            float(r["total"]), float(r["process_start"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if finished >= since.replace(microsecond=0):
            records.append({**r, "_finished": finished})
    return sorted(records, key=lambda r: r["_finished"])


def time_table(records: list[dict[str, Any]], wall_s: float, top_parts: int = 2) -> str:
    """Where a run's time went: one line per stage (wall s, process start s, its largest parts), the
    stages' sum and the run's wall time. Empty when no stage ran."""
    if not records:
        return ""
    width = max(len("stages (sum)"), *(len(r["stage"]) for r in records))
    lines = [f"{'stage':<{width}}  {'wall s':>7}  {'start s':>7}  largest parts (s)"]
    for r in records:
        parts = sorted(r.get("parts", {}).items(), key=lambda kv: -kv[1])[:top_parts]
        shown = ", ".join(f"{k} {v:.0f}" for k, v in parts) or "-"
        lines.append(f"{r['stage']:<{width}}  {r['total']:>7.1f}  {r['process_start']:>7.1f}  {shown}")
    total = sum(r["total"] for r in records)
    start = sum(r["process_start"] for r in records)
    lines.append(f"{'stages (sum)':<{width}}  {total:>7.1f}  {start:>7.1f}")
    lines.append(
        f"{'this run':<{width}}  {wall_s:>7.1f}           "
        f"(DVC, the Prefect server and hand-offs: {max(wall_s - total, 0.0):.0f} s)"
    )
    return "\n".join(lines)


def print_time_table(since: datetime, t0: float, timing: Path | None = None) -> None:
    """Print :func:`time_table` of the stages that finished since ``since`` (nothing when none did);
    ``timing``: default :data:`TIMING_DIR`."""
    timing = TIMING_DIR if timing is None else timing
    table = time_table(stages_since(timing, since), time.monotonic() - t0)
    if table:
        print(f"\nrepro: where the time went ({timing.name}/<stage>.json of the stages this run ran)")
        print(table, flush=True)


def run_command(command: list[str], env: dict[str, str]) -> int:
    """Run ``command`` in the repo, then print where its stages' time went; its exit code."""
    since, t0 = datetime.now(UTC), time.monotonic()
    try:
        return subprocess.call(command, cwd=REPO, env=env)
    finally:
        print_time_table(since, t0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(argv[: argv.index("--")] if "--" in argv else argv):
        print(__doc__.strip())
        return 0
    if argv[:1] == ["--profile"] and len(argv) >= 2:
        from components.config import ConfigError

        try:
            command = profile_command(argv[1], argv[2:], REPO / "params.yaml")
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print("repro: " + " ".join(command), flush=True)
        warn_params_drift(command, REPO / "params.yaml")
    else:
        command = argv[argv.index("--") + 1 :] if "--" in argv else ["dvc", "repro", *argv]
    # Stages of queued DVC experiments run in temporary copies of the repo: they log to this repo's
    # MLflow store, not to a copy that is deleted with them.
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{REPO / 'mlflow' / 'mlflow.db'}")
    (REPO / "mlflow").mkdir(exist_ok=True)
    env = command_env(dict(os.environ))
    if shutil.which(command[0], path=env["PATH"]) is None:
        print(
            f"error: repro: {command[0]!r} is neither next to {sys.executable} nor on PATH: run "
            "`make setup` (it installs dvc into .venv) and start this with .venv/bin/python",
            file=sys.stderr,
        )
        return 127
    if os.environ.get("PREFECT_API_URL"):
        return run_command(command, env)
    port = free_port()
    t0 = time.monotonic()
    server = start_server(port, REPO / ".prefect" / "repro-server.log")
    print(f"repro: Prefect server on 127.0.0.1:{port} ({time.monotonic() - t0:.0f} s to start)", flush=True)
    try:
        env["PREFECT_API_URL"] = f"http://127.0.0.1:{port}/api"
        return run_command(command, env)
    except KeyboardInterrupt:
        return 130
    finally:
        stop_server(server)


if __name__ == "__main__":
    raise SystemExit(main())
