"""`make serve`: the Procfile's Prefect server, `pipeline` deployment and MLflow server, under honcho.

`start` (make serve) runs them on 127.0.0.1 until Ctrl-C; `status` (make status): the URLs and whether
each answers; `env`: `export` lines for a shell's own runs. See docs/service.md.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import psutil

from components.ports import HOST, port_free
from flows import REPO

STATE = REPO / ".prefect" / "serve.json"  # pid and ports of the running `start`


class ServeError(RuntimeError):
    """The services cannot start (port taken, already running); the message says which."""


class Endpoints(NamedTuple):
    prefect_port: int = 4200
    mlflow_port: int = 5000

    @property
    def prefect_url(self) -> str:
        return f"http://{HOST}:{self.prefect_port}"

    @property
    def mlflow_url(self) -> str:
        return f"http://{HOST}:{self.mlflow_port}"

    @property
    def urls(self) -> dict[str, str]:
        """What answers 200 once each service is up."""
        return {
            "prefect": f"{self.prefect_url}/api/health",
            "mlflow": f"{self.mlflow_url}/health",
            "deployment": f"{self.prefect_url}/api/deployments/name/pipeline/steprl",
        }


def get_json(url: str, body: object = None) -> tuple[int, object]:
    """(HTTP status, parsed body) of a GET, or of a POST of ``body``; status 0 when nothing answers."""
    try:
        r = httpx.request("POST" if body else "GET", url, json=body, timeout=5)
    except httpx.HTTPError:
        return 0, None
    with contextlib.suppress(ValueError):
        return r.status_code, r.json()
    return r.status_code, r.text


def running(path: Path | None = None) -> dict | None:
    """The state of the running `start` (pid, ports, started; default file STATE), None if there is none."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        state = json.loads((path or STATE).read_text())
        return state if psutil.pid_exists(int(state["pid"])) else None
    return None


def service_env(
    ep: Endpoints, *, cron=None, interval=None, overrides: Sequence[str] = (), repo=REPO, pool=None
):
    """The Procfile's environment: the endpoints in the tools' own settings, the deployment's schedule
    and default overrides, none of the caller's Prefect/MLflow settings. With a work ``pool``: the
    deployment process also registers pipeline/on-<pool>, and the MLflow server serves the artifacts
    of the experiments it creates (mlflow-artifacts:/), so workers need no shared disk."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "STEPRL_"))}
    return {
        **env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": str(repo),  # this repo's code, also when another copy is installed editable
        "PYTHONUNBUFFERED": "1",
        "PREFECT_HOME": str(repo / ".prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_API_HOST": HOST,
        "PREFECT_SERVER_API_PORT": str(ep.prefect_port),
        "PREFECT_UI_API_URL": f"{ep.prefect_url}/api",  # else the UI calls :4200 (Prefect's default)
        "PREFECT_API_URL": f"{ep.prefect_url}/api",
        "STEPRL_MLFLOW_PORT": str(ep.mlflow_port),
        "MLFLOW_TRACKING_URI": ep.mlflow_url,
        "STEPRL_SCHEDULE_CRON": cron or "",
        "STEPRL_SCHEDULE_INTERVAL": f"{interval:g}" if interval else "",
        "STEPRL_OVERRIDES": json.dumps(list(overrides)),
        "STEPRL_WORK_POOL": pool or "",
        "STEPRL_MLFLOW_SERVE_ARTIFACTS": "1" if pool else "",
    }


def start(
    ep: Endpoints,
    *,
    cron: str | None = None,
    interval: float | None = None,
    overrides: Sequence[str] = (),
    timeout: float = 240.0,
    grace: float = 25.0,
    repo: Path = REPO,
    state_path: Path | None = None,
    processes: Mapping[str, str] | None = None,
    ready: Mapping[str, str] | None = None,
    pool: str | None = None,
) -> int:
    """Run ``processes`` (default: the Procfile) with honcho until Ctrl-C/SIGTERM (exit 0) or one of
    them exits (exit 1: honcho stops the others). ``ready``: {name: URL answering 200 once it is up},
    by default ``ep.urls`` (the deployment's record: once this start has re-registered it; with a work
    ``pool`` also pipeline/on-<pool>'s, see service_env). On a stop
    the deployment goes first (its flow runs report to both servers as they stop), SIGKILL follows
    after ``grace``; this process is the subreaper of them all, so what they orphaned is stopped too."""
    from honcho.environ import parse_procfile

    state_path = state_path or STATE
    _check_free(ep, state_path)
    _prepare(repo)
    began, pending, failed = time.time(), dict(ready or {**ep.urls, **pool_urls(ep, pool)}), []
    env = service_env(ep, cron=cron, interval=interval, overrides=overrides, repo=repo, pool=pool)
    manager = _manager(grace)
    for name, cmd in (processes or parse_procfile((repo / "Procfile").read_text()).processes).items():
        manager.add_process(name, cmd, env=env, cwd=str(repo))

    def watch() -> None:  # the banner and state file once everything answers; stop all if it never does
        time.sleep(1.0)  # honcho forks its output readers first; this thread holds no lock meanwhile
        if late := _wait_until_up(pending, began, timeout):
            print(f"error: {', '.join(late)} did not answer within {timeout:.0f} s", flush=True)
            failed.append(late)
            return os.kill(os.getpid(), signal.SIGTERM)
        state = {
            "pid": os.getpid(),
            **ep._asdict(),
            **({"pool": pool} if pool else {}),
            "started": time.ctime(),
        }
        state_path.write_text(json.dumps(state))
        print(_banner(ep, pool, time.time() - began), flush=True)

    threading.Thread(target=watch, daemon=True).start()
    try:
        manager.loop()
    finally:  # what is left is orphans, e.g. flow runs still stopping their `dvc exp run`
        _kill_all(grace)
        if (running(state_path) or {}).get("pid") == os.getpid():
            state_path.unlink()
        print("all steprl services stopped", flush=True)
    return 0 if manager.returncode in (130, 143) and not failed else 1  # a signal, else one of them died


def _check_free(ep: Endpoints, state_path: Path) -> None:
    """ServeError unless no `start` runs (its state file) and every port of ``ep`` is free."""
    if state := running(state_path):
        raise ServeError(
            f"already running (pid {state['pid']}): `make status` shows it; Ctrl-C or `kill {state['pid']}` stops it"
        )
    for name, port in ep._asdict().items():
        if not port_free(port):
            raise ServeError(
                f"port {port} on {HOST} is in use; choose another with --{name.replace('_', '-')}"
            )


def _prepare(repo: Path) -> None:
    """The servers' log directories (the Procfile writes there), and this process as the subreaper."""
    for logs in (".prefect", "mlflow"):
        (repo / logs).mkdir(exist_ok=True)
    with contextlib.suppress(AttributeError):  # Linux: what the services orphan is re-parented to us
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # (PR_SET_CHILD_SUBREAPER), so Ctrl-C stops it too


def _manager(grace: float) -> Any:
    """A honcho Manager whose stop (a signal, or one process exited) stops the deployment first, then
    the others, and kills what still holds its output ``grace`` + 5 s later."""
    import honcho.manager

    class Manager(honcho.manager.Manager):
        stopping = False

        def terminate(self) -> None:
            if not self.stopping:
                self.stopping = True
                _stop_deployment(self._processes.get("deployment", {}).get("pid"), grace)
            super().terminate()
            # honcho waits for each process's output to end: kill what still holds it after the grace
            threading.Thread(target=lambda: (time.sleep(grace + 5), _kill_all()), daemon=True).start()

    honcho.manager.KILL_WAIT = grace  # a flow run takes ~8 s to stop its `dvc exp run` (2 busy cores)
    return Manager()


def _wait_until_up(pending: dict[str, str], began: float, timeout: float) -> dict[str, str]:
    """Poll ``pending`` ({name: URL}) until each answers 200 (a record only once updated after
    ``began``), printing each as it comes up, or ``timeout`` s after ``began``; returns what never did."""
    while pending and time.time() - began < timeout:
        for name, url in list(pending.items()):
            code, body = get_json(url)
            updated = body.get("updated") if isinstance(body, dict) else None  # a record's
            if code == 200 and (not updated or datetime.fromisoformat(updated).timestamp() > began - 1):
                print(f"{name} is up after {time.time() - began:.1f} s", flush=True)
                del pending[name]
        time.sleep(0.5)
    return pending


def _banner(ep: Endpoints, pool: str | None, seconds: float) -> str:
    """What `make serve` prints once everything answers: the URLs and what to do with them."""
    return (
        f"steprl services are up ({seconds:.1f} s):\n"
        f"  Prefect UI   {ep.prefect_url}   deployment pipeline/steprl: Deployments -> steprl -> Run\n"
        f"  MLflow UI    {ep.mlflow_url}\n"
        + (
            f"  work pool    {pool}: deployment pipeline/on-{pool}; workers: make worker POOL={pool}\n"
            if pool
            else ""
        )
        + '  your shell:  eval "$(.venv/bin/python -m flows.serve env)"   so your own dvc runs report here too\n'
        "Ctrl-C stops everything."
    )


def pool_urls(ep: Endpoints, pool: str | None) -> dict[str, str]:
    """{name: URL} of the pool's deployment (answers 200 once registered, on the pool), {} without."""
    return {"pool deployment": f"{ep.prefect_url}/api/deployments/name/pipeline/on-{pool}"} if pool else {}


def _stop_deployment(pid: int | None, grace: float) -> None:
    """SIGTERM to the runner's flow runs first (each stops its `dvc exp run` and reports itself
    crashed to both servers before it exits), then to the runner and what is left below it; each
    step up to ``grace`` seconds. Not multiprocessing's resource tracker: it ignores SIGTERM and
    exits with its parent."""
    with contextlib.suppress(psutil.Error, ValueError):  # ValueError: no pid (it never started)
        runner = psutil.Process(pid or -1)
        print(f"{time.strftime('%H:%M:%S')} stopping deployment first (pid {pid})", flush=True)
        _terminate([p for p in runner.children() if "resource_tracker" not in _cmdline(p)], grace)
        _terminate([runner, *runner.children(recursive=True)], grace)


def _cmdline(p: psutil.Process) -> str:  # "" once it has exited: the caller's list stays whole
    with contextlib.suppress(psutil.Error):
        return " ".join(p.cmdline())
    return ""


def _terminate(procs: list[psutil.Process], grace: float) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    psutil.wait_procs(procs, timeout=grace)


def _kill_all(grace: float = 0.0) -> None:
    """SIGKILL every process below this one but honcho's output readers, after up to ``grace`` seconds."""
    readers = {r.pid for r in multiprocessing.active_children()}
    _, left = psutil.wait_procs([p for p in psutil.Process().children(True) if p.pid not in readers], grace)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    if left and grace:
        print(f"killed {len(left)} leftover process(es): {sorted(p.pid for p in left)}", flush=True)


def status(ep: Endpoints, state_path: Path | None = None) -> int:
    """Print the URLs and whether each answers; 0 when all answer and the deployment is READY, else 1."""
    state = running(state_path)
    print(
        f"`make serve` is running: pid {state['pid']}, started {state['started']}"
        if state
        else "`make serve` is not running (start it with `make serve`)"
    )
    got = {name: get_json(url) for name, url in ep.urls.items()}
    servers = {"prefect": ("Prefect UI/API", ep.prefect_url), "mlflow": ("MLflow UI", ep.mlflow_url)}
    for name, (label, url) in servers.items():
        answer = "up" if got[name][0] == 200 else "not answering"
        print(f"  {label:<15} {url:<28} {answer}  ({ep.urls[name]})")
    code, dep = got["deployment"]
    if got["prefect"][0] != 200:
        what = "unknown (Prefect is not answering)"
    elif code == 200 and isinstance(dep, dict):
        schedules = ", ".join(
            " ".join(map(str, next(iter(s["schedule"].items())))) + ("" if s["active"] else " (inactive)")
            for s in dep["schedules"]
        )
        paused = " paused" if dep["paused"] else ""
        what = f"{dep['status']}{paused}; schedules: {schedules or 'none'}; {ep.prefect_url}/deployments/deployment/{dep['id']}"
    else:
        what = "not registered"
    print(f"  deployment      pipeline/steprl            {what}")
    if pool := (state or {}).get("pool"):
        code, dep = get_json(pool_urls(ep, pool)["pool deployment"])
        on = (
            f"{dep['status']} on work pool {pool}"
            if code == 200 and isinstance(dep, dict)
            else "not registered"
        )
        print(f"  deployment      pipeline/on-{pool:<17} {on} (workers: make worker POOL={pool})")
    return 0 if got["mlflow"][0] == 200 and what.startswith("READY") else 1


def _cron(text: str) -> str:  # Prefect's own checks of a schedule, before anything starts
    from prefect.client.schemas.schedules import CronSchedule

    return CronSchedule(cron=text).cron


def _interval(text: str) -> float:
    from prefect.client.schemas.schedules import IntervalSchedule

    return IntervalSchedule(interval=float(text)).interval.total_seconds()


def _pool(text: str) -> str:
    from flows.pool import check_pool

    try:
        return check_pool(text)
    except ValueError as err:  # ConfigError: argparse names the flag
        raise argparse.ArgumentTypeError(str(err)) from None


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(text)
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.serve", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    st = sub.add_parser("start", help="start Prefect server + deployment + MLflow server (Ctrl-C stops)")
    for p in (st, sub.add_parser("status", help="URLs and whether each answers"), sub.add_parser("env")):
        p.add_argument("--prefect-port", type=_port, help="default: the running `start`'s, else 4200")
        p.add_argument("--mlflow-port", type=_port, help="default: the running `start`'s, else 5000")
    when = st.add_mutually_exclusive_group()
    when.add_argument("--cron", type=_cron, help='a schedule, e.g. "0 3 * * *"')
    when.add_argument("--interval", type=_interval, help="a schedule: every that many seconds")
    st.add_argument("-S", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    st.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for the services")
    st.add_argument(
        "--pool", type=_pool, help="also deploy the pipeline on this Prefect work pool (make worker)"
    )
    args = vars(parser.parse_args(argv))
    command, state = args.pop("command"), running() or {}
    ports = Endpoints._field_defaults.items()  # the flag, else the running start's, else the default
    ep = Endpoints(*(args.pop(k) or (command != "start" and state.get(k)) or d for k, d in ports))
    if command == "env":
        print(f"export PREFECT_API_URL={ep.prefect_url}/api\nexport MLFLOW_TRACKING_URI={ep.mlflow_url}")
    if command != "start":
        return status(ep) if command == "status" else 0
    try:
        if args["overrides"]:  # a bad default override fails here, not in the deployment's log
            from flows._experiments import plan_run

            plan_run(REPO, overrides=args["overrides"])
        return start(ep, **args)
    except (ServeError, ValueError) as err:  # ValueError: a bad default override (ConfigError)
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
