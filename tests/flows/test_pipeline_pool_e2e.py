"""End to end, in throwaway clones of a bare git origin, as docs/scale-out.md says: the server
clone runs `python -m flows.serve start --pool <pool>` (what `make serve POOL=...` runs); a worker clone
points its default DVC remote at a local directory (`make remote`) and runs `make worker`; a run
submitted to the pool deployment runs in the worker's clone, pushes its experiment (git ref to the
origin, outputs to the DVC remote) and logs to the MLflow server, whose artifacts reach the server's
store over HTTP. A third clone pulls the experiment. A schedule made through the API (as the UI does)
survives a re-deploy (`make deploy`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from components.train.distributed import free_port
from tests.flows.workspace import make_workspace, run

pytestmark = pytest.mark.slow

POOL = "e2e-pool"
VENV = Path(sys.executable).parent.parent  # the venv of this test run, as `make` sees it (VENV=...)


def _env(ws: Path) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "DVC_", "STEPRL_"))
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ws)
    return env


def make(ws: Path, *args: str) -> list[str]:
    """`make <args>` in clone ``ws`` on this test's venv (-o: a clone's fresh pyproject.toml must not
    make it reinstall the venv)."""
    return ["make", "--no-print-directory", f"VENV={VENV}", "-o", f"{VENV}/.installed", *args]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def _wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    t0 = time.monotonic()
    while text not in path.read_text():
        assert proc.poll() is None, path.read_text()[-4000:]
        assert time.monotonic() - t0 < timeout, f"{text!r} not in {path} after {timeout} s"
        time.sleep(0.5)


def _start(cmd: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:  # the child keeps its own copy of the file
        return subprocess.Popen(
            cmd, cwd=cwd, env=_env(cwd), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("pool")
    src = make_workspace(root / "src")
    origin = root / "origin.git"
    run(["git", "clone", "--quiet", "--bare", str(src), str(origin)], root)
    clones = {}
    for name in ("server", "worker", "reader"):
        run(["git", "clone", "--quiet", str(origin), name], root)
        clones[name] = root / name
    remote = root / "dvc-remote"
    for name in ("worker", "reader"):
        run(make(clones[name], "remote", f"DVC_REMOTE={remote}"), clones[name])

    pport, mport = free_port(), free_port()
    procs, logs = {}, {}
    t0 = time.monotonic()
    logs["server"] = clones["server"] / "serve.out"
    serve = [sys.executable, "-m", "flows.serve", "start", "--pool", POOL]
    serve += ["--prefect-port", str(pport), "--mlflow-port", str(mport)]
    procs["server"] = _start(serve, clones["server"], logs["server"])
    try:
        _wait_for(logs["server"], "services are up", procs["server"], 300)
        print(f"\nservices with the pool deployment up in {time.monotonic() - t0:.1f} s")
        logs["worker"] = clones["worker"] / "worker.out"
        worker = make(
            clones["worker"], "worker", f"POOL={POOL}", f"PREFECT_PORT={pport}", f"MLFLOW_PORT={mport}"
        )
        procs["worker"] = _start(worker, clones["worker"], logs["worker"])
        _wait_for(logs["worker"], "started!", procs["worker"], 120)
        yield {
            **clones,
            "origin": origin,
            "remote": remote,
            "prefect": f"http://127.0.0.1:{pport}",
            "mlflow": f"http://127.0.0.1:{mport}",
            "logs": logs,
        }
    finally:
        for name in ("worker", "server"):
            if name in procs:
                _stop(procs[name])


@pytest.fixture(scope="module")
def pool_run(cluster):
    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    params = {"targets": ["prepare"], "experiment_name": "pool-e2e", "overrides": ["prepare.n_train=37"]}
    t0 = time.monotonic()
    with temporary_settings({PREFECT_API_URL: f"{cluster['prefect']}/api"}):
        flow_run = run_deployment(f"pipeline/on-{POOL}", parameters=params, timeout=0)
        with get_client(sync_client=True) as client:
            while not (flow_run.state and flow_run.state.is_final()):
                assert time.monotonic() - t0 < 600, "the pool run did not finish in 10 min"
                time.sleep(2)
                flow_run = client.read_flow_run(flow_run.id)
    print(f"pool run (submit to completed): {time.monotonic() - t0:.1f} s")
    return flow_run


def test_the_worker_ran_it_in_its_own_clone(cluster, pool_run):
    assert pool_run.state.is_completed(), (pool_run.state, cluster["logs"]["worker"].read_text()[-6000:])
    assert pool_run.work_pool_name == POOL
    exps = run(["git", "for-each-ref", "--format=%(refname)", "refs/exps"], cluster["worker"]).stdout
    assert exps.rstrip().endswith("/pool-e2e")
    assert not run(["git", "for-each-ref", "refs/exps"], cluster["server"]).stdout.strip()


def test_the_experiment_reached_the_remotes_and_a_third_clone_pulls_it(cluster, pool_run):
    assert (
        "/pool-e2e"
        in run(["git", "ls-remote", str(cluster["origin"]), "refs/exps/*"], cluster["reader"]).stdout
    )
    assert any(p.is_file() for p in cluster["remote"].rglob("*"))  # the outputs, in DVC's remote layout
    reader = cluster["reader"]
    run(["dvc", "exp", "pull", "origin", "pool-e2e"], reader)  # the git ref and the outputs
    assert "pool-e2e" in run(["dvc", "exp", "show", "--csv", "--no-pager"], reader).stdout
    refs = run(["git", "for-each-ref", "--format=%(refname)", "refs/exps"], reader).stdout.split()
    ref = [r for r in refs if r.endswith("/pool-e2e")]
    assert len(ref) == 1
    # the run made only prepare's outputs: check out the experiment's commit and those outputs
    run(["git", "checkout", "-q", ref[0]], reader)
    assert "n_train: 37" in (reader / "params.yaml").read_text()
    run(["dvc", "checkout", "data/processed/calc"], reader)
    assert any((reader / "data" / "processed" / "calc").iterdir())


def test_the_mlflow_run_is_on_the_server_with_its_artifacts_served(cluster, pool_run):
    url = cluster["mlflow"]
    calc = next(
        e
        for e in _post(f"{url}/api/2.0/mlflow/experiments/search", {"max_results": 100})["experiments"]
        if e["name"] == "calc"
    )
    assert calc["artifact_location"].startswith("mlflow-artifacts:/")
    runs = _post(f"{url}/api/2.0/mlflow/runs/search", {"experiment_ids": [calc["experiment_id"]]})["runs"]
    parent = next(r for r in runs if r["info"]["run_name"] == "pipeline pool-e2e")
    tags = {t["key"]: t["value"] for t in parent["data"]["tags"]}
    assert parent["info"]["status"] == "FINISHED" and tags["steprl.dvc_pushed_to"] == "origin"
    run_id = parent["info"]["run_id"]
    files = {f["path"] for f in _get(f"{url}/ajax-api/2.0/mlflow/artifacts/list?run_id={run_id}")["files"]}
    assert {"dvc_exp_run.log", "dvc_exp_push.log"} <= files
    # uploaded through the server into the server clone's store; nothing written on the worker's side
    stored = cluster["server"] / "mlflow" / "artifacts" / calc["experiment_id"] / run_id / "artifacts"
    assert "pool-e2e" in (stored / "dvc_exp_run.log").read_text()
    assert not (cluster["worker"] / "mlflow" / "artifacts").exists()


def test_a_schedule_made_in_the_ui_survives_a_redeploy(cluster, pool_run):
    from prefect import get_client
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.settings import PREFECT_API_URL, temporary_settings

    name = f"pipeline/on-{POOL}"
    with temporary_settings({PREFECT_API_URL: f"{cluster['prefect']}/api"}):
        with get_client(sync_client=True) as client:
            dep = client.read_deployment_by_name(name)
            client.create_deployment_schedules(dep.id, [(CronSchedule(cron="0 4 * * *"), False)])
        run(
            make(cluster["server"], "deploy", f"POOL={POOL}", f"PREFECT_API_URL={cluster['prefect']}/api"),
            cluster["server"],
        )
        with get_client(sync_client=True) as client:
            after = client.read_deployment_by_name(name)
    assert after.id == dep.id
    assert [(s.schedule.cron, s.active) for s in after.schedules] == [("0 4 * * *", False)]
    assert after.pull_steps == [
        {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $STEPRL_REPO }}"}}
    ]
