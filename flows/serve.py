"""The steprl services as one command: Prefect server, the `pipeline` deployment, MLflow tracking server.

    python -m flows.serve start [--cron "0 3 * * *" | --interval 3600] [-S key=value ...]   (make serve)
    python -m flows.serve status      URLs, and whether each answers               (make status)
    python -m flows.serve env         `export` lines so a shell's own runs report to the servers
    python -m flows.serve stop        stop a `start` running in another terminal

`start` binds everything to 127.0.0.1 (ports: --prefect-port/--mlflow-port, or STEPRL_PREFECT_PORT/
STEPRL_MLFLOW_PORT; defaults 4200 and 5000), starts the two servers at once, then the deployment
(flows/pipeline.py) pointed at both, and stays in the foreground printing the deployment's log.
Ctrl-C or SIGTERM stops the deployment, then the Prefect server, then MLflow: each process group gets
SIGTERM, then SIGKILL after a grace period, and any process of theirs still alive (a flow run's
`dvc exp run`, its stages) is killed too, so nothing is left behind.

Prefect keeps its database in <repo>/.prefect (the flow runs of earlier `dvc repro` show up); MLflow
uses mlflow/mlflow.db and mlflow/artifacts (mlflow/server.sh). Server logs: .prefect/server.log,
mlflow/server.log; the deployment's log also goes to .prefect/deployment.log.
This module does not schedule anything itself: schedules belong to the deployment (flags or the UI).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path

from flows import REPO

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PREFECT_PORT = 4200
DEFAULT_MLFLOW_PORT = 5000
FLOW, DEPLOYMENT = "pipeline", "steprl"
STATE = REPO / ".prefect" / "serve.json"
BIN = Path(sys.executable).parent


class ServeError(RuntimeError):
    """A service could not start (port taken, a server died); the message says which and why."""


# ----------------------------------------------------------------------------------------------
# where things listen


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


def _port(value: object, what: str) -> int:
    try:
        port = int(str(value))
    except ValueError:
        raise ServeError(f"{what}: {value!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise ServeError(f"{what}: {port} is not a port number (1-65535)")
    return port


def resolve_endpoints(
    host: str | None = None,
    prefect_port: int | None = None,
    mlflow_port: int | None = None,
    env: Mapping[str, str] = os.environ,
) -> Endpoints:
    """Flag, else environment variable (STEPRL_HOST, STEPRL_PREFECT_PORT, STEPRL_MLFLOW_PORT), else default."""
    return Endpoints(
        host=host or env.get("STEPRL_HOST") or DEFAULT_HOST,
        prefect_port=_port(
            prefect_port or env.get("STEPRL_PREFECT_PORT") or DEFAULT_PREFECT_PORT,
            "--prefect-port / STEPRL_PREFECT_PORT",
        ),
        mlflow_port=_port(
            mlflow_port or env.get("STEPRL_MLFLOW_PORT") or DEFAULT_MLFLOW_PORT,
            "--mlflow-port / STEPRL_MLFLOW_PORT",
        ),
    )


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_free(host: str, port: int) -> bool:
    """Nobody listens on ``port`` (SO_REUSEADDR as the servers use it: TIME_WAIT leftovers do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
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
            body = r.read()
            status = r.status
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


# ----------------------------------------------------------------------------------------------
# processes


@dataclass
class Service:
    """One child process, started in its own process group (session) so it can be stopped as a whole."""

    name: str
    argv: list[str]
    env: dict[str, str]
    ready_url: str | None = None  # GET answers 200 once the service is up
    fresh: bool = False  # ready_url returns a record whose `updated` time must be after this start
    log: Path | None = None  # None: its output is echoed with a "[name] " prefix (and to echo_log)
    echo_log: Path | None = None
    stop_signal: int = signal.SIGTERM  # first signal of a stop; SIGKILL follows after the grace period
    signal_leader: bool = False  # send stop_signal to the leader only (it stops its own children)
    # SIGTERM these children of the leader first and give them the grace period to finish (flow runs:
    # their engine turns SIGTERM into an exception, so they stop their `dvc exp run` and report it)
    stop_children_first: Callable[[object], bool] | None = None
    started_at: float = 0.0
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def start(self, cwd: Path) -> None:
        self.started_at = time.time()
        out = subprocess.PIPE if self.log is None else open(self.log, "w")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            if out is not subprocess.PIPE:
                out.close()
        if self.log is None:
            threading.Thread(target=self._echo, daemon=True).start()

    def _echo(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        sink = open(self.echo_log, "wb") if self.echo_log else None
        try:
            for line in self.proc.stdout:
                sys.stdout.write(f"[{self.name}] {line.decode(errors='replace')}")
                sys.stdout.flush()
                if sink:
                    sink.write(line)
                    sink.flush()
        except (ValueError, OSError):
            pass
        finally:
            if sink:
                sink.close()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, n: int = 20) -> str:
        if self.log and self.log.is_file():
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        return ""


def _descendants(pid: int) -> list:
    import psutil

    try:
        parent = psutil.Process(pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop_services(
    services: Sequence[Service], grace: float = 25.0, say: Callable[[str], None] = print, known: Sequence = ()
) -> None:
    """Stop ``services`` in the given order: SIGTERM to each group, SIGKILL after ``grace``; then kill
    every process that belonged to them and is still alive (also ones that left their group, and the
    ``known`` psutil processes seen earlier, e.g. orphans of a service that died)."""
    import psutil

    tree = {p.pid: p for p in known}
    tree.update({p.pid: p for s in services if s.proc for p in _descendants(s.proc.pid)})
    for s in services:
        if s.proc is None:
            continue
        say(f"{time.strftime('%H:%M:%S')} stopping {s.name} (pid {s.proc.pid})")
        if s.stop_children_first is not None:
            _stop_children(s, grace, say)
        for sig, wait in ((s.stop_signal, grace), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if s.signal_leader and sig != signal.SIGKILL:
                    os.kill(s.proc.pid, sig)
                else:
                    os.killpg(s.proc.pid, sig)
            t0 = time.monotonic()
            end = t0 + wait
            while time.monotonic() < end and _group_alive(s.proc):
                if s.proc.returncode is not None:  # the leader is done: stragglers get 3 s, not the grace
                    end = min(end, time.monotonic() + 3.0)
                time.sleep(0.1)
            if not _group_alive(s.proc):
                break
            if sig != signal.SIGKILL:
                say(f"{s.name} did not stop within {time.monotonic() - t0:.0f} s: killing it")
    left = []
    for p in tree.values():
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(left, timeout=5)
    if left:
        say(f"killed {len(left)} leftover process(es): {sorted(p.pid for p in left)}")


def _stop_children(s: Service, grace: float, say: Callable[[str], None]) -> None:
    import psutil

    try:
        kids = [c for c in psutil.Process(s.proc.pid).children() if s.stop_children_first(c)]
    except psutil.Error:
        return
    for c in kids:
        say(f"{time.strftime('%H:%M:%S')} stopping {s.name}'s child {c.pid} (a flow run)")
        with contextlib.suppress(psutil.Error):
            c.terminate()
    psutil.wait_procs(kids, timeout=grace)


def is_flow_run_process(p) -> bool:
    """Prefect 3.7's runner starts each flow run as a multiprocessing 'spawn' child."""
    try:
        return "multiprocessing.spawn" in " ".join(p.cmdline())
    except Exception:
        return False


def _group_alive(proc: subprocess.Popen) -> bool:
    proc.poll()  # reap the leader, or its zombie keeps the group "alive"
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ----------------------------------------------------------------------------------------------
# start / status / env / stop


def service_specs(
    ep: Endpoints,
    *,
    cron: str | None = None,
    interval: float | None = None,
    overrides: Sequence[str] = (),
    limit: int = 1,
    repo: Path = REPO,
) -> list[Service]:
    """The three services of `start`, in start order: MLflow server, Prefect server, deployment."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PREFECT_API_", "PREFECT__", "MLFLOW_TRACKING_"))
    }
    base["PATH"] = f"{BIN}{os.pathsep}{base.get('PATH', '')}"
    base["PYTHONPATH"] = str(repo)  # this repo's code, also when another copy is installed editable
    base["PREFECT_HOME"] = str(repo / ".prefect")
    base["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    base["DO_NOT_TRACK"] = "1"
    (repo / ".prefect").mkdir(exist_ok=True)
    (repo / "mlflow").mkdir(exist_ok=True)
    mlflow_env = {**base, "STEPRL_MLFLOW_HOST": ep.host, "STEPRL_MLFLOW_PORT": str(ep.mlflow_port)}
    deploy = [sys.executable, "-m", "flows.pipeline", "serve", "--name", DEPLOYMENT, "--limit", str(limit)]
    if cron:
        deploy += ["--cron", cron]
    if interval:
        deploy += ["--interval", str(interval)]
    for o in overrides:
        deploy += ["-S", o]
    deploy_env = {
        **base,
        "PREFECT_API_URL": ep.prefect_api,
        "MLFLOW_TRACKING_URI": ep.mlflow_url,
        "PYTHONUNBUFFERED": "1",
    }
    return [
        Service(
            "mlflow",
            ["sh", str(repo / "mlflow" / "server.sh")],
            mlflow_env,
            ready_url=ep.health["mlflow"],
            log=repo / "mlflow" / "server.log",
        ),
        Service(
            "prefect",
            [
                sys.executable,
                "-m",
                "prefect",
                "server",
                "start",
                "--host",
                ep.host,
                "--port",
                str(ep.prefect_port),
            ],
            base,
            ready_url=ep.health["prefect"],
            log=repo / ".prefect" / "server.log",
        ),
        # Ready once this runner has re-registered the deployment (its record outlives `start`).
        # Stopped in two steps: SIGTERM to its flow runs (each stops its `dvc exp run`, removes its clone
        # and reports Crashed), then SIGINT to the runner alone, which pauses the schedules (its SIGTERM
        # path warns about an un-awaited stop; a group-wide SIGINT left it waiting on a running flow run).
        Service(
            "deployment",
            deploy,
            deploy_env,
            ready_url=ep.deployment_api(),
            fresh=True,
            echo_log=repo / ".prefect" / "deployment.log",
            stop_signal=signal.SIGINT,
            signal_leader=True,
            stop_children_first=is_flow_run_process,
        ),
    ]


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


class _Stop(Exception):
    pass


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
    services: list[Service] | None = None,
    sweep_own_children: bool = False,
) -> int:
    """Start the services and supervise them until Ctrl-C/SIGTERM (exit 0) or one of them dies (exit 1).

    ``services`` (default: service_specs(...)) are started in order: all but the last at once, the
    last (the deployment) once the others answer. Every process of theirs is remembered while they
    run (``sweep_own_children``: all of this process's descendants, for a child subreaper), so a stop
    also reaches the orphans of a service that died.
    """
    t0 = time.monotonic()
    state = read_state(state_path)
    if state and pid_alive(state.get("pid")):
        raise ServeError(
            f"already running (pid {state['pid']}): `make status` shows it, "
            "`python -m flows.serve stop` stops it"
        )
    for what, port, flag in (
        ("Prefect", ep.prefect_port, "--prefect-port/STEPRL_PREFECT_PORT"),
        ("MLflow", ep.mlflow_port, "--mlflow-port/STEPRL_MLFLOW_PORT"),
    ):
        if not port_free(ep.host, port):
            raise ServeError(f"{what} port {port} on {ep.host} is in use; choose another with {flag}")
    if ep.prefect_port == ep.mlflow_port:
        raise ServeError(f"the Prefect and MLflow ports are both {ep.prefect_port}")
    if overrides:  # a bad default override fails here, not in the deployment's log
        from flows._experiments import build_overrides, check_overrides, head_rev, params_at

        check_overrides(params_at(repo, "head", head_rev(repo)), build_overrides(overrides=overrides))

    if services is None:
        services = service_specs(
            ep, cron=cron, interval=interval, overrides=overrides, limit=limit, repo=repo
        )
    stop = threading.Event()
    known: dict[int, object] = {}

    def track() -> None:
        roots = [s.proc.pid for s in services if s.proc] + ([os.getpid()] if sweep_own_children else [])
        for root in roots:
            for p in _descendants(root):
                if p.pid != os.getpid():
                    known.setdefault(p.pid, p)

    previous = {
        s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }

    def wait_ready(group: list[Service]) -> None:
        pending = list(group)
        while pending:
            if stop.is_set():
                raise _Stop
            track()
            for s in list(pending):
                if not s.running:
                    raise ServeError(
                        f"{s.name} exited with code {s.proc.returncode} while starting"
                        + (f"; last lines of {s.log}:\n{s.tail()}" if s.log else "")
                    )
                if is_ready(s):
                    print(f"{s.name} is up after {time.monotonic() - t0:.1f} s", flush=True)
                    pending.remove(s)
            if time.monotonic() - t0 > timeout:
                raise ServeError(
                    f"{', '.join(s.name for s in pending)} did not answer within {timeout:.0f} s "
                    f"({', '.join(str(s.ready_url) for s in pending)})"
                )
            time.sleep(0.5)

    code = 0
    try:
        try:
            for s in services[:-1]:
                s.start(repo)
            wait_ready(services[:-1])
            services[-1].start(repo)
            wait_ready(services[-1:])
        except _Stop:
            return 0
        state_path.write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": ep.host,
                    "prefect_port": ep.prefect_port,
                    "mlflow_port": ep.mlflow_port,
                    "prefect_url": ep.prefect_url,
                    "mlflow_url": ep.mlflow_url,
                    "deployment": f"{FLOW}/{DEPLOYMENT}",
                    "children": {s.name: s.proc.pid for s in services if s.proc},
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    "startup_seconds": round(time.monotonic() - t0, 1),
                },
                indent=2,
            )
        )
        print(banner(ep, time.monotonic() - t0), flush=True)
        while not stop.wait(1.0):
            track()
            dead = [s for s in services if not s.running]
            if dead:
                print(
                    f"{dead[0].name} exited with code {dead[0].proc.returncode}; stopping the others"
                    + (f"\nlast lines of {dead[0].log}:\n{dead[0].tail()}" if dead[0].log else ""),
                    flush=True,
                )
                code = 1
                break
        return code
    finally:
        track()
        stop_services(list(reversed(services)), grace=grace, known=list(known.values()))
        state = read_state(state_path)
        if state and state.get("pid") == os.getpid():
            state_path.unlink(missing_ok=True)
        for s, handler in previous.items():
            signal.signal(s, handler)
        print("all steprl services stopped", flush=True)


def is_ready(s: Service, timeout: float = 5.0) -> bool:
    code, body = get_json(s.ready_url or "", timeout=timeout)
    if code != 200:
        return False
    if not s.fresh:
        return True
    return isinstance(body, dict) and _epoch(body.get("updated")) >= s.started_at - 1.0


def _epoch(iso: object) -> float:
    from datetime import datetime

    try:
        t = datetime.fromisoformat(str(iso).replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def banner(ep: Endpoints, seconds: float) -> str:
    return "\n".join(
        [
            f"steprl services are up ({seconds:.1f} s):",
            f"  Prefect UI   {ep.prefect_url}   deployment {FLOW}/{DEPLOYMENT}: Deployments -> {DEPLOYMENT} -> Run",
            f"  MLflow UI    {ep.mlflow_url}",
            f'  your shell:  eval "$({_python()} -m flows.serve env)"   so your own dvc runs report here too',
            "Ctrl-C stops everything.",
        ]
    )


def _python() -> str:
    try:
        return str(Path(sys.executable).relative_to(Path.cwd()))
    except ValueError:
        return sys.executable


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
            if sch.get("rrule")
            else "schedule"
        )
        out.append(what + ("" if item.get("active", True) else " (inactive)"))
    return ", ".join(out) or "none (run it from the UI)"


def status(ep: Endpoints, state: dict | None = None, say: Callable[[str], None] = print) -> int:
    """Print the URLs and whether each answers; 0 when all answer, 1 otherwise."""
    if state and pid_alive(state.get("pid")):
        say(f"`make serve` is running: pid {state['pid']}, started {state.get('started', '?')}")
    else:
        say("`make serve` is not running (start it with `make serve`)")
    prefect_up, mlflow_up = answers(ep.health["prefect"]), answers(ep.health["mlflow"])
    say(
        f"  Prefect UI/API  {ep.prefect_url:<28} {'up' if prefect_up else 'not answering'}  ({ep.health['prefect']})"
    )
    say(
        f"  MLflow UI       {ep.mlflow_url:<28} {'up' if mlflow_up else 'not answering'}  ({ep.health['mlflow']})"
    )
    dep_ok = False
    if prefect_up:
        code, dep = get_json(ep.deployment_api())
        if code == 200 and isinstance(dep, dict):
            dep_ok = dep.get("status") == "READY"
            paused = " paused" if dep.get("paused") else ""
            say(
                f"  deployment      {FLOW}/{DEPLOYMENT:<19} {dep.get('status', '?')}{paused}; schedule: "
                f"{_schedule_text(dep)}; {ep.prefect_url}/deployments/deployment/{dep.get('id')}"
            )
        else:
            say(f"  deployment      {FLOW}/{DEPLOYMENT:<19} not registered")
    else:
        say(f"  deployment      {FLOW}/{DEPLOYMENT:<19} unknown (Prefect is not answering)")
    return 0 if prefect_up and mlflow_up and dep_ok else 1


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


def _become_subreaper() -> bool:
    """Linux: processes orphaned below us are re-parented to us instead of init (PR_SET_CHILD_SUBREAPER)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.serve", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    parsers = {
        "start": sub.add_parser(
            "start", help="start Prefect server + deployment + MLflow server (Ctrl-C stops)"
        ),
        "status": sub.add_parser("status", help="print URLs and whether each answers"),
        "env": sub.add_parser("env", help="print export lines for PREFECT_API_URL and MLFLOW_TRACKING_URI"),
        "stop": sub.add_parser("stop", help="stop a running `start`"),
    }
    for name in ("start", "status", "env"):
        p = parsers[name]
        p.add_argument("--host", default=None, help=f"bind address (STEPRL_HOST, default {DEFAULT_HOST})")
        p.add_argument(
            "--prefect-port",
            type=int,
            default=None,
            help=f"Prefect port (STEPRL_PREFECT_PORT, default {DEFAULT_PREFECT_PORT})",
        )
        p.add_argument(
            "--mlflow-port",
            type=int,
            default=None,
            help=f"MLflow port (STEPRL_MLFLOW_PORT, default {DEFAULT_MLFLOW_PORT})",
        )
    st = parsers["start"]
    st.add_argument(
        "--cron",
        default=os.environ.get("STEPRL_SCHEDULE_CRON") or None,
        help='schedule of the deployment, e.g. "0 3 * * *" (STEPRL_SCHEDULE_CRON; default none)',
    )
    st.add_argument(
        "--interval",
        type=float,
        default=os.environ.get("STEPRL_SCHEDULE_INTERVAL") or None,
        help="schedule every N seconds (STEPRL_SCHEDULE_INTERVAL; default none)",
    )
    st.add_argument(
        "-S",
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="default params overrides of the deployment's runs (editable in the UI)",
    )
    st.add_argument("--limit", type=int, default=1, help="most pipeline runs at once (default 1)")
    st.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for the services to answer")
    args = vars(parser.parse_args(argv))
    command = args.pop("command")
    try:
        if command == "start":
            check_schedule(args["cron"], args["interval"])
            ep = resolve_endpoints(args["host"], args["prefect_port"], args["mlflow_port"])
            subreaper = _become_subreaper()  # orphans of our children stay ours to stop
            return start(
                ep,
                cron=args["cron"],
                interval=args["interval"],
                overrides=args["overrides"],
                limit=args["limit"],
                timeout=args["timeout"],
                sweep_own_children=subreaper,
            )
        if command == "status":
            return status(_endpoints_for_status(args), read_state())
        if command == "env":
            print("\n".join(env_lines(_endpoints_for_status(args))))
            return 0
        return stop_running(read_state())
    except ServeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # a bad default override (ConfigError)
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
