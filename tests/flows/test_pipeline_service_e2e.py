"""End to end, in a throwaway copy of the repo: the documented service command (`python -m flows.serve
start`, what `make serve` runs) on free loopback ports; a pipeline run triggered through the Prefect
API (`run_deployment`) with parameter overrides, while a user runs `dvc exp run` in the workspace;
then the DVC experiment with those values, the MLflow runs that logged them (through the tracking
server, which also lists a run logged before it started), and a clean stop with nothing left running.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml

from components.train.distributed import free_port
from flows.serve import port_free
from tests.flows.workspace import make_workspace, run

pytestmark = pytest.mark.slow

# The run the "schedule" makes: up to sft, tiny, with values a default run would never have.
RUN = {
    "seed": 7,
    "overrides": [
        "prepare.n_train=40",
        "sft.steps=2",
        "sft.batch_size=4",
        "sft.micro_batch_size=4",
        "sft.warmup_steps=1",
    ],
    "targets": ["sft"],
    "experiment_name": "svc-e2e",
}


def _env(ws: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "DVC_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ws)
    return env


def _post(url: str, body: dict) -> dict | list:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _exp_rows(ws: Path) -> dict[str, dict[str, str]]:
    out = run(["dvc", "exp", "show", "--csv", "--no-pager"], ws).stdout
    return {row["Experiment"]: row for row in csv.DictReader(io.StringIO(out)) if row["Experiment"]}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    ws = make_workspace(tmp_path_factory.mktemp("service"))
    # A pipeline run before any server exists: Prefect ephemeral, MLflow straight into mlflow/mlflow.db.
    run(
        [
            sys.executable,
            "-m",
            "flows.pipeline",
            "run",
            "-n",
            "before-serve",
            "-S",
            "prepare.n_train=33",
            "prepare",
        ],
        ws,
    )

    pport, mport = free_port(), free_port()
    log = open(ws / "serve.out", "w")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flows.serve",
            "start",
            "--prefect-port",
            str(pport),
            "--mlflow-port",
            str(mport),
        ],
        cwd=ws,
        env=_env(ws),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    while "services are up" not in (ws / "serve.out").read_text():
        assert proc.poll() is None, (ws / "serve.out").read_text()[-4000:]
        assert time.monotonic() - t0 < 300, "services did not come up in 300 s"
        time.sleep(0.5)
    startup = time.monotonic() - t0
    print(f"\nservice start-up (both UIs and the deployment answering): {startup:.1f} s")
    with urllib.request.urlopen(f"http://127.0.0.1:{pport}/ui-settings", timeout=30) as r:
        assert json.loads(r.read())["api_url"] == f"http://127.0.0.1:{pport}/api"  # the UI's own port
    info = {
        "ws": ws,
        "proc": proc,
        "prefect": f"http://127.0.0.1:{pport}",
        "mlflow": f"http://127.0.0.1:{mport}",
        "ports": (pport, mport),
        "startup": startup,
    }
    try:
        yield info
    finally:
        if proc.poll() is None:  # a test failed before the clean stop: stop it the same way
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


@pytest.fixture(scope="module")
def scheduled(service):
    """The deployment's run (through the API) and, at the same time, a user's `dvc exp run`."""
    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    ws = service["ws"]
    params = yaml.safe_load((ws / "params.yaml").read_text())
    params["prepare"]["n_val"] = 9  # an uncommitted edit: a run from HEAD must not see it
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    t0 = time.monotonic()
    with temporary_settings({PREFECT_API_URL: f"{service['prefect']}/api"}):
        flow_run = run_deployment("pipeline/steprl", parameters=RUN, timeout=0)
        user = run(
            ["dvc", "exp", "run", "-n", "user-run", "-S", "prepare.n_train=44", "prepare"], ws, check=False
        )
        with get_client(sync_client=True) as client:
            while True:
                flow_run = client.read_flow_run(flow_run.id)
                if flow_run.state and flow_run.state.is_final():
                    break
                assert time.monotonic() - t0 < 1200, "the deployment's run did not finish in 20 min"
                time.sleep(2)
    print(f"scheduled run: {time.monotonic() - t0:.1f} s")
    return {"flow_run": flow_run, "user": user}


def test_the_scheduled_run_and_the_users_run_both_complete(service, scheduled):
    fr = scheduled["flow_run"]
    assert fr.state.is_completed(), (fr.state, (service["ws"] / "serve.out").read_text()[-6000:])
    assert scheduled["user"].returncode == 0, (
        scheduled["user"].stdout[-3000:] + scheduled["user"].stderr[-3000:]
    )


def test_dvc_experiment_holds_the_overridden_values_from_head(service, scheduled):
    ws = service["ws"]
    rows = _exp_rows(ws)
    exp = rows["svc-e2e"]
    assert (exp["sft.steps"], exp["seed"], exp["prepare.n_train"]) == ("2", "7", "40")
    assert exp["prepare.n_val"] == "8"  # HEAD's value, not the uncommitted 9
    assert rows["user-run"]["prepare.n_train"] == "44"
    # the scheduled run never touched the workspace: it holds the user's run, uncommitted edit included
    params = yaml.safe_load((ws / "params.yaml").read_text())
    assert (params["prepare"]["n_train"], params["prepare"]["n_val"]) == (44, 9)
    assert not list((ws / ".dvc" / "tmp" / "steprl-runs").glob("*"))  # the private clone is gone


def test_mlflow_runs_logged_it_through_the_server(service, scheduled):
    url = service["mlflow"]
    exps = _post(f"{url}/api/2.0/mlflow/experiments/search", {"max_results": 100})["experiments"]
    calc = next(e for e in exps if e["name"] == "calc")
    runs = _post(
        f"{url}/api/2.0/mlflow/runs/search", {"experiment_ids": [calc["experiment_id"]], "max_results": 100}
    )["runs"]
    by_name = {r["info"]["run_name"]: r for r in runs}
    # logged to the sqlite file before the server started, listed by the server
    assert by_name["pipeline before-serve"]["info"]["status"] == "FINISHED"

    parent = by_name["pipeline svc-e2e"]
    params = {p["key"]: p["value"] for p in parent["data"]["params"]}
    tags = {t["key"]: t["value"] for t in parent["data"]["tags"]}
    assert parent["info"]["status"] == "FINISHED"
    assert (params["sft.steps"], params["seed"], params["prepare.n_train"], params["prepare.n_val"]) == (
        "2",
        "7",
        "40",
        "8",
    )
    assert re.fullmatch(r"refs/exps/[0-9a-f]{2}/[0-9a-f]{38}/svc-e2e", tags["steprl.dvc_ref"])
    assert tags["prefect.flow_run_id"] == str(scheduled["flow_run"].id)
    metrics = {m["key"]: m["value"] for m in parent["data"]["metrics"]}
    assert metrics.get("sft.steps") == 2

    sft = [
        r
        for r in runs
        if r["info"]["run_name"] == "sft"
        and {"key": "mlflow.parentRunId", "value": parent["info"]["run_id"]} in r["data"]["tags"]
    ]
    assert len(sft) == 1, "the sft stage's run is not a child of the pipeline run"
    sft_params = {p["key"]: p["value"] for p in sft[0]["data"]["params"]}
    assert sft_params["sft.steps"] == "2"
    history = json.loads(
        urllib.request.urlopen(
            f"{url}/api/2.0/mlflow/metrics/get-history?run_id={sft[0]['info']['run_id']}&metric_key=sft/loss"
        ).read()
    )
    assert len(history["metrics"]) == 2


def test_stage_flows_reported_to_the_prefect_server(service, scheduled):
    # the stage flows of the scheduled run (the time filter keeps out a flow run another process on a
    # shared machine once sent to this workspace's temporary server through a reused port)
    start = scheduled["flow_run"].start_time.isoformat()
    query = {
        "flows": {"name": {"any_": ["sft", "base_model"]}},
        "flow_runs": {"start_time": {"after_": start}},
    }
    runs = _post(f"{service['prefect']}/api/flow_runs/filter", query)
    assert {r["state_type"] for r in runs} == {"COMPLETED"} and len(runs) >= 2


def test_status_then_ctrl_c_during_a_run_leaves_nothing_behind(service, scheduled):
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    ws, proc = service["ws"], service["proc"]
    status = run([sys.executable, "-m", "flows.serve", "status"], ws, check=False)
    assert status.returncode == 0, status.stdout
    assert (
        service["prefect"] in status.stdout
        and service["mlflow"] in status.stdout
        and "READY" in status.stdout
    )

    with temporary_settings({PREFECT_API_URL: f"{service['prefect']}/api"}):
        interrupted = run_deployment(
            "pipeline/steprl",
            timeout=0,
            parameters={
                "experiment_name": "interrupted",
                "targets": ["base_model"],
                "overrides": ["prepare.n_train=39"],
            },
        )
    supervisor = psutil.Process(proc.pid)
    t0 = time.monotonic()
    while not any(
        "interrupted" in " ".join(p.cmdline()) for p in supervisor.children(recursive=True) if p.is_running()
    ):
        assert time.monotonic() - t0 < 300, "the second run's `dvc exp run` never started"
        time.sleep(0.5)
    time.sleep(5)  # let it get into a stage
    tree = [supervisor, *supervisor.children(recursive=True)]
    names = " ".join(" ".join(p.cmdline()) for p in tree if p.is_running())
    assert "exp run" in names and "mlflow" in names and "prefect" in names  # the whole tree, run included

    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    assert proc.wait(timeout=180) == 0
    print(f"stopped during a run in {time.monotonic() - t0:.1f} s")
    time.sleep(0.5)
    left = []
    for p in tree:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(" ".join(p.cmdline())[:120])
        except psutil.NoSuchProcess:
            pass
    assert not left, left
    assert all(port_free(p) for p in service["ports"])
    assert not (ws / ".prefect" / "serve.json").exists()
    out = (ws / "serve.out").read_text()
    assert "all steprl services stopped" in out and "Execution was aborted by a termination signal" in out
    assert not list((ws / ".dvc" / "tmp" / "steprl-runs").glob("*"))  # the interrupted run removed its clone
    assert "interrupted" not in _exp_rows(ws)
    # the deployment was stopped before the Prefect server: the run's end reached it
    with contextlib.closing(sqlite3.connect(ws / ".prefect" / "prefect.db")) as db:
        (state,) = db.execute(
            "SELECT state_type FROM flow_run WHERE id = ?", (str(interrupted.id),)
        ).fetchone()
    assert state == "CRASHED"


def test_workspace_baseline_runs_the_workspace_as_it_is_in_a_temp_dir(service, scheduled):
    from flows._experiments import run_experiment

    ws = service["ws"]
    before = (ws / "params.yaml").read_text()
    result = run_experiment(
        ws,
        ["prepare.n_train=41"],
        "ws-temp",
        baseline="workspace",
        targets=["prepare"],
        env=_env(ws),
        on_line=lambda line: None,
    )
    row = _exp_rows(ws)["ws-temp"]
    assert (row["prepare.n_train"], row["prepare.n_val"]) == ("41", "9")  # the uncommitted 9 is included
    assert (ws / "params.yaml").read_text() == before
    assert result.ref.endswith("/ws-temp")
