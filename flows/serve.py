"""`make serve`: the Prefect server, the `pipeline` deployment and the MLflow tracking server.

    python -m flows.serve start [--cron "0 3 * * *" | --interval 3600] [-S key=value ...]   (make serve)
    python -m flows.serve status | env | stop     URLs and whether each answers (make status); `export`
                                                  lines for a shell's own runs; stop a running `start`

`start` checks its flags, then runs the three processes of the repo's Procfile with honcho, bound to
127.0.0.1 (ports: flags, STEPRL_PREFECT_PORT/STEPRL_MLFLOW_PORT, or 4200/5000), the ports passed through
the tools' own settings (PREFECT_SERVER_API_PORT, PREFECT_UI_API_URL, PREFECT_API_URL, ...). Ctrl-C or
SIGTERM: the deployment first (its flow runs stop their `dvc exp run` and report it), then honcho stops
the servers; SIGKILL after the grace period. This process is the child subreaper of them all, so what
they orphaned is stopped too. Server logs: .prefect/server.log, mlflow/server.log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from flows import REPO

DEFAULT_HOST, DEFAULT_PREFECT_PORT, DEFAULT_MLFLOW_PORT = "127.0.0.1", 4200, 5000
FLOW, DEPLOYMENT = "pipeline", "steprl"
STATE = REPO / ".prefect" / "serve.json"


class ServeError(RuntimeError):
    """The services cannot start (bad flag, port taken, already running); the message says which."""


@dataclass(frozen=True)
class Endpoints:
    host: str = DEFAULT_HOST
    prefect_port: int = DEFAULT_PREFECT_PORT
    mlflow_port: int = DEFAULT_MLFLOW_PORT

    @property
    def prefect_url(self) -> str:
        return f"http://{self.host}:{self.prefect_port}"

    @property
    def prefect_api(self) -> str:
        return f"{self.prefect_url}/api"

    @property
    def mlflow_url(self) -> str:
        return f"http://{self.host}:{self.mlflow_port}"

    @property
    def health(self) -> dict[str, str]:
        return {"prefect": f"{self.prefect_api}/health", "mlflow": f"{self.mlflow_url}/health"}

    def deployment_api(self, flow: str = FLOW, name: str = DEPLOYMENT) -> str:
        return f"{self.prefect_api}/deployments/name/{flow}/{name}"

    def env(self) -> dict[str, str]:
        """The tools' own settings for these endpoints (every process of the Procfile gets them)."""
        return {
            "PREFECT_SERVER_API_HOST": self.host,
            "PREFECT_SERVER_API_PORT": str(self.prefect_port),
            "PREFECT_UI_API_URL": self.prefect_api,  # else the UI calls :4200 (Prefect's default port)
            "PREFECT_API_URL": self.prefect_api,
            "STEPRL_MLFLOW_HOST": self.host,
            "STEPRL_MLFLOW_PORT": str(self.mlflow_port),
            "MLFLOW_TRACKING_URI": self.mlflow_url,
        }


def resolve_endpoints(
    host: str | None = None,
    prefect_port: int | None = None,
    mlflow_port: int | None = None,
    env: Mapping[str, str] = os.environ,
) -> Endpoints:
    """Flag, else environment variable (STEPRL_HOST, STEPRL_PREFECT_PORT, STEPRL_MLFLOW_PORT), else default."""
    ports = []
    for flag, default, what in (
        (prefect_port, DEFAULT_PREFECT_PORT, "--prefect-port / STEPRL_PREFECT_PORT"),
        (mlflow_port, DEFAULT_MLFLOW_PORT, "--mlflow-port / STEPRL_MLFLOW_PORT"),
    ):
        value = flag or env.get(what.split()[-1]) or default
        if not str(value).isdigit() or not 1 <= int(value) <= 65535:
            raise ServeError(f"{what}: {value!r} is not a port number (1-65535)")
        ports.append(int(value))
    return Endpoints(host or env.get("STEPRL_HOST") or DEFAULT_HOST, *ports)


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port nobody listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_free(host: str, port: int) -> bool:
    """Nobody listens on ``port`` (SO_REUSEADDR as the servers use it: TIME_WAIT leftovers do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def get_json(url: str, timeout: float = 5.0) -> tuple[int, object]:
    """(HTTP status, parsed body) of a GET; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, None
    except (urllib.error.URLError, OSError, ValueError):
        return 0, None
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode(errors="replace")


def answers(url: str, timeout: float = 5.0) -> bool:
    return get_json(url, timeout)[0] == 200


def check_schedule(cron: str | None, interval: float | None) -> None:
    """A schedule the deployment will accept, checked before anything starts."""
    if cron and interval:
        raise ServeError("give --cron or --interval, not both")
    if interval is not None and not interval > 0:
        raise ServeError(f"--interval {interval:g}: must be a positive number of seconds")
    if cron:
        from prefect.client.schemas.schedules import CronSchedule

        try:
            CronSchedule(cron=cron)
        except ValueError as err:
            why = err.errors()[0]["msg"] if hasattr(err, "errors") else str(err)
            raise ServeError(f"--cron {cron!r} is not a valid cron expression ({why})") from None


# ----------------------------------------------------------------------------------------------
# start: the Procfile under honcho


def procfile(repo: Path = REPO) -> dict[str, str]:
    """{name: shell command} of the repo's Procfile, in order (honcho's own parser)."""
    from honcho.environ import parse_procfile

    return dict(parse_procfile((repo / "Procfile").read_text()).processes)


def service_env(
    ep: Endpoints,
    *,
    cron: str | None = None,
    interval: float | None = None,
    overrides: Sequence[str] = (),
    limit: int = 1,
    repo: Path = REPO,
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "STEPRL_"))}
    env.update(ep.env())
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(repo),  # this repo's code, also when another copy is installed editable
        PYTHONUNBUFFERED="1",
        PREFECT_HOME=str(repo / ".prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DO_NOT_TRACK="1",
        STEPRL_DEPLOYMENT=DEPLOYMENT,
        STEPRL_SCHEDULE_CRON=cron or "",
        STEPRL_SCHEDULE_INTERVAL=f"{interval:g}" if interval else "",
        STEPRL_OVERRIDES=json.dumps(list(overrides)),
        STEPRL_LIMIT=str(limit),
    )
    return env


def read_state(path: Path = STATE) -> dict | None:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def pid_alive(pid: object) -> bool:
    try:
        os.kill(int(pid), 0)  # type: ignore[arg-type]
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


def _updated(body: object) -> float:
    """Epoch seconds of a Prefect record's `updated` time (inf if the body is not a record)."""
    if not isinstance(body, dict) or "updated" not in body:
        return float("inf")
    try:
        return datetime.fromisoformat(str(body["updated"]).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def start(
    ep: Endpoints,
    *,
    cron: str | None = None,
    interval: float | None = None,
    overrides: Sequence[str] = (),
    limit: int = 1,
    timeout: float = 240.0,
    grace: float = 25.0,
    repo: Path = REPO,
    state_path: Path = STATE,
    processes: Mapping[str, str] | None = None,
    ready: Mapping[str, str] | None = None,
) -> int:
    """Run ``processes`` (default: the Procfile) with honcho until Ctrl-C/SIGTERM (exit 0) or one of
    them exits (exit 1: honcho stops the others). ``ready``: {name: URL answering 200 once it is up};
    by default both health URLs and the deployment's record, re-registered by this start."""
    import honcho.manager

    state = read_state(state_path)
    if state and pid_alive(state.get("pid")):
        raise ServeError(
            f"already running (pid {state['pid']}): `make status` shows it, "
            "`python -m flows.serve stop` stops it"
        )
    if ep.prefect_port == ep.mlflow_port:
        raise ServeError(f"the Prefect and MLflow ports are both {ep.prefect_port}")
    for what, port, flag in (
        ("Prefect", ep.prefect_port, "--prefect-port/STEPRL_PREFECT_PORT"),
        ("MLflow", ep.mlflow_port, "--mlflow-port/STEPRL_MLFLOW_PORT"),
    ):
        if not port_free(ep.host, port):
            raise ServeError(f"{what} port {port} on {ep.host} is in use; choose another with {flag}")
    if overrides:  # a bad default override fails here, not in the deployment's log
        from flows._experiments import build_overrides, check_overrides, head_rev, params_at

        check_overrides(params_at(repo, "head", head_rev(repo)), build_overrides(overrides=overrides))

    t0, began = time.monotonic(), time.time()
    (repo / ".prefect").mkdir(exist_ok=True)
    (repo / "mlflow").mkdir(exist_ok=True)
    env = service_env(ep, cron=cron, interval=interval, overrides=overrides, limit=limit, repo=repo)

    class Manager(honcho.manager.Manager):
        stopping = False

        def terminate(self) -> None:  # honcho's stop of all processes (a signal, or one of them exited)
            if not self.stopping:  # the deployment first: its flow runs report to both servers as they stop
                self.stopping = True
                _stop_first("deployment", grace, idle=lambda: not running_flow_runs(ep))
            super().terminate()
            # honcho waits for each process's output to end: kill whatever still holds it after the grace
            killer = threading.Timer(grace + 5, _kill_all)  # (orphans, stubborn processes)
            killer.daemon = True
            killer.start()

    manager = Manager()
    processes = dict(processes or procfile(repo))
    for name, cmd in processes.items():
        manager.add_process(name, cmd, env=env, cwd=str(repo))
    honcho.manager.KILL_WAIT = grace  # a flow run takes ~8 s to stop its `dvc exp run` (2 busy cores)
    ready = dict(ready or {**ep.health, "deployment": ep.deployment_api()})
    failed = []

    def watch() -> None:  # banner and state file once everything answers; stop all if it never does
        time.sleep(1.0)  # honcho forks its process readers first; this thread holds no lock meanwhile
        pending = dict(ready)
        while pending and time.monotonic() - t0 < timeout:
            for name, url in list(pending.items()):
                code, body = get_json(url)
                if code == 200 and _updated(body) >= began - 1:  # a record: re-registered by this start
                    print(f"{name} is up after {time.monotonic() - t0:.1f} s", flush=True)
                    del pending[name]
            time.sleep(0.5)
        if pending:
            print(f"error: {', '.join(pending)} did not answer within {timeout:.0f} s", flush=True)
            failed.append(pending)
            return os.kill(os.getpid(), signal.SIGTERM)
        seconds = time.monotonic() - t0
        info = {"pid": os.getpid(), **vars(ep), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        state_path.write_text(json.dumps({**info, "startup_seconds": round(seconds, 1)}, indent=2))
        print(banner(ep, seconds), flush=True)

    threading.Thread(target=watch, daemon=True).start()
    try:
        manager.loop()
    finally:  # what is left is orphans: flow runs still stopping their `dvc exp run` (no second SIGTERM)
        _kill_all(grace)
        if (read_state(state_path) or {}).get("pid") == os.getpid():
            state_path.unlink(missing_ok=True)
        print("all steprl services stopped", flush=True)
    return 0 if manager.returncode in (130, 143) and not failed else 1  # a signal, else one of them died


def running_flow_runs(ep: Endpoints) -> list:
    """The deployment's flow runs the Prefect server has as RUNNING ([] if it does not answer)."""
    query = {
        "deployments": {"name": {"any_": [DEPLOYMENT]}},
        "flow_runs": {"state": {"type": {"any_": ["RUNNING"]}}},
    }
    req = urllib.request.Request(
        f"{ep.prefect_api}/flow_runs/filter", json.dumps(query).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return []


def _stop_first(name: str, grace: float, idle: Callable[[], bool] = lambda: True) -> None:
    """Stop honcho's process ``name`` before the others: SIGTERM to its leader's children (the runner's
    flow runs: each stops its `dvc exp run`), wait until ``idle()`` (the runner has reported them as
    crashed), then SIGTERM to its whole group; each step gets up to ``grace`` seconds."""
    import multiprocessing

    import psutil

    for reader in (r for r in multiprocessing.active_children() if r.name == name):  # honcho's reader
        with contextlib.suppress(psutil.Error, OSError):
            for leader in psutil.Process(reader.pid).children():
                print(f"{time.strftime('%H:%M:%S')} stopping {name} first (pid {leader.pid})", flush=True)
                # (not multiprocessing's resource tracker: it ignores SIGTERM and exits with its parent)
                _terminate([p for p in leader.children() if "resource_tracker" not in _cmd(p)], grace)
                end = time.monotonic() + grace  # the runner reports its flow runs as crashed
                while not idle() and time.monotonic() < end:
                    time.sleep(0.5)
                _terminate([leader, *leader.children(recursive=True)], grace)


def _cmd(p) -> str:
    try:
        return " ".join(p.cmdline())
    except Exception:
        return ""


def _terminate(procs: list, grace: float) -> None:
    import psutil

    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    psutil.wait_procs(procs, timeout=grace)


def _kill_all(grace: float = 0.0) -> None:
    """SIGKILL every process below this one but honcho's output readers, after up to ``grace`` seconds."""
    import multiprocessing

    import psutil

    readers = {r.pid for r in multiprocessing.active_children()}
    procs = [p for p in psutil.Process().children(recursive=True) if p.pid not in readers]
    _, left = psutil.wait_procs(procs, timeout=grace)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(left, timeout=5)
    if left and grace:
        print(f"killed {len(left)} leftover process(es): {sorted(p.pid for p in left)}", flush=True)


def become_subreaper() -> bool:
    """Linux: processes orphaned below us are re-parented to us instead of init (PR_SET_CHILD_SUBREAPER)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def banner(ep: Endpoints, seconds: float) -> str:
    return "\n".join(
        [
            f"steprl services are up ({seconds:.1f} s):",
            f"  Prefect UI   {ep.prefect_url}   deployment {FLOW}/{DEPLOYMENT}: Deployments -> {DEPLOYMENT} -> Run",
            f"  MLflow UI    {ep.mlflow_url}",
            '  your shell:  eval "$(.venv/bin/python -m flows.serve env)"   so your own dvc runs report here too',
            "Ctrl-C stops everything.",
        ]
    )


# ----------------------------------------------------------------------------------------------
# status / env / stop


def _schedule_text(dep: dict) -> str:
    out = []
    for item in dep.get("schedules") or []:
        sch = item.get("schedule") or {}
        what = (
            f"cron {sch['cron']!r}"
            if sch.get("cron")
            else f"every {sch['interval']:g} s"
            if sch.get("interval")
            else "rrule"
        )
        out.append(what + ("" if item.get("active", True) else " (inactive)"))
    return ", ".join(out) or "none (run it from the UI)"


def status(ep: Endpoints, state: dict | None = None, say: Callable[[str], None] = print) -> int:
    """Print the URLs and whether each answers; 0 when all answer, 1 otherwise."""
    if state and pid_alive(state.get("pid")):
        say(f"`make serve` is running: pid {state['pid']}, started {state.get('started', '?')}")
    else:
        say("`make serve` is not running (start it with `make serve`)")
    up = {name: answers(url) for name, url in ep.health.items()}
    for name, label, url in (
        ("prefect", "Prefect UI/API", ep.prefect_url),
        ("mlflow", "MLflow UI", ep.mlflow_url),
    ):
        say(f"  {label:<15} {url:<28} {'up' if up[name] else 'not answering'}  ({ep.health[name]})")
    code, dep = get_json(ep.deployment_api()) if up["prefect"] else (0, None)
    if not up["prefect"]:
        say(f"  deployment      {FLOW}/{DEPLOYMENT:<19} unknown (Prefect is not answering)")
    elif code == 200 and isinstance(dep, dict):
        paused = " paused" if dep.get("paused") else ""
        say(
            f"  deployment      {FLOW}/{DEPLOYMENT:<19} {dep.get('status', '?')}{paused}; schedule: "
            f"{_schedule_text(dep)}; {ep.prefect_url}/deployments/deployment/{dep.get('id')}"
        )
    else:
        say(f"  deployment      {FLOW}/{DEPLOYMENT:<19} not registered")
    ok = code == 200 and isinstance(dep, dict) and dep.get("status") == "READY"
    return 0 if all(up.values()) and ok else 1


def env_lines(ep: Endpoints) -> list[str]:
    return [f"export PREFECT_API_URL={ep.prefect_api}", f"export MLFLOW_TRACKING_URI={ep.mlflow_url}"]


def stop_running(state: dict | None, timeout: float = 60.0, say: Callable[[str], None] = print) -> int:
    if not state or not pid_alive(state.get("pid")):
        say("`make serve` is not running")
        return 0
    pid = int(state["pid"])
    os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + timeout
    while time.monotonic() < end and pid_alive(pid):
        time.sleep(0.2)
    if pid_alive(pid):
        say(f"pid {pid} is still running after {timeout:.0f} s")
        return 1
    say(f"stopped (pid {pid})")
    return 0


def _endpoints_for_status(args: dict) -> Endpoints:
    """Explicit flags win; else the ports of the running `start` (state file); else env/defaults."""
    state = read_state()
    if state and pid_alive(state.get("pid")) and not (args.get("prefect_port") or args.get("mlflow_port")):
        return Endpoints(state["host"], int(state["prefect_port"]), int(state["mlflow_port"]))
    return resolve_endpoints(args.get("host"), args.get("prefect_port"), args.get("mlflow_port"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.serve", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    st = sub.add_parser("start", help="start Prefect server + deployment + MLflow server (Ctrl-C stops)")
    for p in (st, sub.add_parser("status", help="URLs and whether each answers"), sub.add_parser("env")):
        p.add_argument("--host", help=f"bind address (STEPRL_HOST, default {DEFAULT_HOST})")
        p.add_argument("--prefect-port", type=int, help="STEPRL_PREFECT_PORT, default 4200")
        p.add_argument("--mlflow-port", type=int, help="STEPRL_MLFLOW_PORT, default 5000")
    sub.add_parser("stop", help="stop a running `start`")
    env = os.environ.get
    st.add_argument("--cron", default=env("STEPRL_SCHEDULE_CRON") or None, help='e.g. "0 3 * * *"')
    st.add_argument("--interval", type=float, default=env("STEPRL_SCHEDULE_INTERVAL") or None, help="seconds")
    st.add_argument("-S", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    st.add_argument("--limit", type=int, default=1, help="most pipeline runs at once (default 1)")
    st.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for the services")
    args = vars(parser.parse_args(argv))
    command = args.pop("command")
    try:
        if command == "start":
            check_schedule(args["cron"], args["interval"])
            ep = resolve_endpoints(args.pop("host"), args.pop("prefect_port"), args.pop("mlflow_port"))
            become_subreaper()  # orphans of the services stay ours to stop
            return start(ep, **args)
        if command == "status":
            return status(_endpoints_for_status(args), read_state())
        if command == "env":
            print("\n".join(env_lines(_endpoints_for_status(args))))
            return 0
        return stop_running(read_state())
    except (ServeError, ValueError) as err:  # ValueError: a bad default override (ConfigError)
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
