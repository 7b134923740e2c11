"""The MLflow tracking server as `make serve` starts it (mlflow/server.sh), on a throwaway store:
bound to 127.0.0.1, shows runs logged to the sqlite file before it started, and loses nothing when
two processes log through it at once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from components.train.distributed import free_port
from flows.serve import get_json

REPO = Path(__file__).resolve().parents[2]

LOGGER = textwrap.dedent("""
    import sys, mlflow
    sys.path.insert(0, sys.argv[5])
    from flows._stage import ensure_experiment  # what every stage uses to find its experiment
    uri, experiment, name, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=ensure_experiment(experiment))
    with mlflow.start_run(run_name=name):
        mlflow.log_params({f"p{i}": f"{name}-{i}" for i in range(30)})
        for step in range(n):  # one request per value: the most contention a logger can make
            mlflow.log_metric("x", float(step), step=step)
        mlflow.log_text(name, f"{name}.txt")
    print("done", name, flush=True)
""")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow-server")
    store = root / "mlflow"
    store.mkdir()
    shutil.copy2(REPO / "mlflow" / "server.sh", store / "server.sh")

    # A run logged the way the pipeline logs without a server: straight into the sqlite file.
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    exp = client.create_experiment("calc", artifact_location=(store / "artifacts").as_uri())
    run = client.create_run(exp, run_name="before-server")
    client.log_param(run.info.run_id, "sft.steps", "2")
    client.log_metric(run.info.run_id, "sft/loss", 1.25, step=1)
    (root / "note.txt").write_text("logged before the server")
    client.log_artifact(run.info.run_id, str(root / "note.txt"))
    client.set_terminated(run.info.run_id)

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", STEPRL_MLFLOW_PORT=str(port)
    )
    t0 = time.monotonic()
    proc = subprocess.Popen(
        ["sh", str(store / "server.sh")],
        env=env,
        cwd=root,
        start_new_session=True,
        stdout=open(root / "server.log", "w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    while get_json(f"{url}/health")[0] != 200:
        assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
        assert time.monotonic() - t0 < 180, "MLflow server did not answer within 180 s"
        time.sleep(0.5)
    print(f"MLflow server up in {time.monotonic() - t0:.1f} s")
    yield {"url": url, "port": port, "root": root, "store": store, "proc": proc, "before": run.info.run_id}
    group = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    time.sleep(0.5)
    assert not [
        p for p in group if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def test_server_listens_on_loopback_only(server):
    pids = {server["proc"].pid, *(p.pid for p in psutil.Process(server["proc"].pid).children(recursive=True))}
    listening = [
        c
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == server["port"]
    ]
    assert listening, "nothing listens on the server's port"
    assert {c.laddr.ip for c in listening} == {"127.0.0.1"}
    assert {c.pid for c in listening if c.pid} <= pids


def test_server_lists_runs_logged_before_it_started_with_their_artifacts(server):
    exps = _post(f"{server['url']}/api/2.0/mlflow/experiments/search", {"max_results": 100})["experiments"]
    calc = next(e for e in exps if e["name"] == "calc")
    assert calc["artifact_location"] == (server["store"] / "artifacts").as_uri()
    runs = _post(f"{server['url']}/api/2.0/mlflow/runs/search", {"experiment_ids": [calc["experiment_id"]]})[
        "runs"
    ]
    before = next(r for r in runs if r["info"]["run_id"] == server["before"])
    assert before["info"]["run_name"] == "before-server" and before["info"]["status"] == "FINISHED"
    assert {"key": "sft.steps", "value": "2"} in before["data"]["params"]
    assert before["data"]["metrics"][0]["value"] == 1.25
    files = _get(f"{server['url']}/ajax-api/2.0/mlflow/artifacts/list?run_id={server['before']}")["files"]
    assert [f["path"] for f in files] == ["note.txt"]


def test_two_concurrent_loggers_through_the_server_lose_nothing(server):
    (server["root"] / "logger.py").write_text(LOGGER)
    n = 100
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(server["root"] / "logger.py"),
                server["url"],
                "concurrent",
                name,
                str(n),
                str(REPO),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in ("scheduled", "user")
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
        assert "database is locked" not in out
    exps = _post(f"{server['url']}/api/2.0/mlflow/experiments/search", {"max_results": 100})["experiments"]
    exp = next(e for e in exps if e["name"] == "concurrent")
    # created through the server: artifacts under mlflow/artifacts, as without a server
    assert exp["artifact_location"].startswith((server["store"] / "artifacts").as_uri())
    runs = _post(f"{server['url']}/api/2.0/mlflow/runs/search", {"experiment_ids": [exp["experiment_id"]]})[
        "runs"
    ]
    assert sorted(r["info"]["run_name"] for r in runs) == ["scheduled", "user"]
    for r in runs:
        rid, name = r["info"]["run_id"], r["info"]["run_name"]
        params = {p["key"]: p["value"] for p in r["data"]["params"]}
        assert params == {f"p{i}": f"{name}-{i}" for i in range(30)}
        history = _get(
            f"{server['url']}/api/2.0/mlflow/metrics/get-history?run_id={rid}&metric_key=x&max_results=1000"
        )
        assert sorted((m["step"], m["value"]) for m in history["metrics"]) == [
            (s, float(s)) for s in range(n)
        ]
        art = Path(r["info"]["artifact_uri"].removeprefix("file://")) / f"{name}.txt"
        assert art.read_text() == name and str(server["store"] / "artifacts") in str(art)
