"""The work-pool path of docs/scale-out.md, without servers: the pool deployment's definition, the
experiment push (only when STEPRL_PUSH names a git remote and a DVC remote is set), the MLflow
server's artifact arguments, the served-artifacts check, and what `make worker` / `make serve POOL=`
run. The real thing (server, worker, push, pull) is tests/flows/test_pipeline_pool_e2e.py (slow)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from components.config import ConfigError
from flows import pool, serve
from flows._experiments import ExperimentError, push_experiment, push_remote
from flows._stage import check_served_artifacts
from flows.serve import Endpoints
from tests.make_dry_run import make_n

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_the_pool_deployment_runs_the_pipeline_module_in_the_workers_clone(monkeypatch):
    from prefect.client.schemas.schedules import CronSchedule

    kept = [CronSchedule(cron="0 4 * * *")]
    asked = []
    monkeypatch.setattr(pool, "kept_schedules", lambda name: asked.append(name) or kept)
    dep = pool.build_deployment("steprl", ["sft.steps=20"])
    assert (dep.flow_name, dep.name, dep.work_pool_name) == ("pipeline", "on-steprl", "steprl")
    assert asked == ["pipeline/on-steprl"]  # the schedules it has now (made in the UI) are passed back
    assert [s.schedule.cron for s in dep.schedules] == ["0 4 * * *"]
    assert dep.entrypoint == "flows.pipeline.pipeline"  # imported from the worker's PYTHONPATH
    assert dep.storage.to_pull_step() == {
        "prefect.deployments.steps.set_working_directory": {"directory": "{{ $STEPRL_REPO }}"}
    }
    assert dep.parameters == {"overrides": ["sft.steps=20"]}
    assert dep.concurrency_limit is None  # several workers run several runs at once
    assert "targets" in dep._parameter_openapi_schema.properties  # the typed form of the UI


def test_the_pull_step_resolves_to_the_workers_clone(tmp_path):
    """Prefect's own step runner, as a flow run of a worker runs it: the directory is the worker's.
    In a process of its own, with a Prefect home of its own: the runner resolves blocks and variables
    through an API, so without one it starts a temporary server, which must not outlive the test nor
    write into the repo's .prefect/ (stopped in this process at exit, after pytest closed its streams,
    its last log line was a 'Logging error' traceback at the end of every test run)."""
    clone = tmp_path / "clone"
    clone.mkdir()
    code = (
        "import asyncio, os\n"
        "from prefect.deployments.steps.core import run_steps\n"
        "from flows import pool\n"
        "out = asyncio.run(run_steps([pool.PULL_STEP]))\n"
        "print('RESULT', out['directory'], os.getcwd(), sep='\\n')\n"
    )
    env = {**os.environ, "STEPRL_REPO": str(clone), "PREFECT_HOME": str(tmp_path / ".prefect")}
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    directory, cwd = done.stdout.split("RESULT\n", 1)[1].split()
    assert Path(directory) == clone and Path(cwd) == clone
    # its temporary server's database: in this home, not the repo's
    assert (tmp_path / ".prefect" / "prefect.db").is_file()


@pytest.mark.parametrize("bad", ["", "a b", "-x", "a/b", "x" * 64])
def test_bad_pool_names_are_rejected_naming_pool(bad, capsys):
    with pytest.raises(ConfigError, match="POOL"):
        pool.deployment_name(bad)
    with pytest.raises(SystemExit) as err:
        serve.main(["start", "--pool", bad])
    assert err.value.code == 2 and "--pool" in capsys.readouterr().err


def test_serve_with_a_pool_deploys_it_and_serves_artifacts(monkeypatch):
    started = []
    monkeypatch.setattr(serve, "start", lambda ep, **kw: started.append(kw) or 0)
    assert serve.main(["start", "--pool", "steprl"]) == 0 and serve.main(["start"]) == 0
    assert [kw["pool"] for kw in started] == ["steprl", None]
    env = serve.service_env(Endpoints(), pool="steprl")
    assert (env["STEPRL_WORK_POOL"], env["STEPRL_MLFLOW_SERVE_ARTIFACTS"]) == ("steprl", "1")
    plain = serve.service_env(Endpoints())
    assert (plain["STEPRL_WORK_POOL"], plain["STEPRL_MLFLOW_SERVE_ARTIFACTS"]) == ("", "")
    assert serve.pool_urls(Endpoints(4300), "steprl") == {
        "pool deployment": "http://127.0.0.1:4300/api/deployments/name/pipeline/on-steprl"
    }
    assert serve.pool_urls(Endpoints(), None) == {}


def _server_args(tmp_path: Path, env: dict[str, str]) -> list[str]:
    """The arguments mlflow/server.sh gives `mlflow server` (a stand-in `mlflow` prints them)."""
    fake = tmp_path / "bin" / "mlflow"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {"PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}", **env}
    shutil.copy2(REPO / "mlflow" / "server.sh", tmp_path / "server.sh")
    out = subprocess.run(
        ["sh", str(tmp_path / "server.sh")], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()


def test_mlflow_server_serves_artifacts_with_a_served_root_only_when_asked(tmp_path):
    args = _server_args(tmp_path, {})
    root = args[args.index("--default-artifact-root") + 1]
    assert root == (tmp_path / "artifacts").as_uri()  # as before: file://, usable without the server
    assert "--serve-artifacts" in args
    assert args[args.index("--artifacts-destination") + 1] == str(tmp_path / "artifacts")
    served = _server_args(tmp_path, {"STEPRL_MLFLOW_SERVE_ARTIFACTS": "1"})
    assert served[served.index("--default-artifact-root") + 1] == "mlflow-artifacts:/"
    assert served[served.index("--artifacts-destination") + 1] == str(tmp_path / "artifacts")  # same files


@pytest.mark.parametrize(
    "location", ["file:///srv/steprl/mlflow/artifacts/1", "/srv/steprl/mlflow/artifacts/1"]
)
def test_a_worker_refuses_an_experiment_whose_artifacts_are_a_path(location):
    with pytest.raises(ConfigError, match="STEPRL_SERVED_ARTIFACTS=1: MLflow experiment 'calc'"):
        check_served_artifacts("calc", location)


@pytest.mark.parametrize("location", ["mlflow-artifacts:/1", "s3://bucket/mlflow/1", "http://h:5000/x"])
def test_a_worker_accepts_served_or_remote_artifact_locations(location):
    check_served_artifacts("calc", location)


def _git(cwd: Path, *args: str) -> str:
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@e", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def _dvc(cwd: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    cmd = [sys.executable, "-m", "dvc", *args]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture
def exp_repo(tmp_path):
    """A git + DVC repo with one stage and one experiment `e1`, a bare origin and a local DVC remote."""
    repo, origin = tmp_path / "repo", tmp_path / "origin.git"
    repo.mkdir()
    _git(tmp_path, "init", "-q", "--bare", str(origin))
    _git(repo, "init", "-q")
    _dvc(repo, "init", "-q")
    (repo / "params.yaml").write_text("n: 1\n")
    (repo / "dvc.yaml").write_text(
        "stages:\n  make:\n    cmd: python -c \"import yaml; open('out.txt','w').write(str(yaml.safe_load(open('params.yaml'))['n']))\"\n"
        "    params: [n]\n    outs: [out.txt]\n"
    )
    (repo / ".gitignore").write_text("/out.txt\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "init")
    _dvc(repo, "exp", "run", "-q", "-n", "e1", "-S", "n=7")
    return repo, origin, tmp_path / "dvc-remote"


def test_push_only_when_steprl_push_names_a_remote_and_dvc_has_one(exp_repo):
    repo, origin, remote = exp_repo
    assert (
        push_remote(repo, {}) is None and push_remote(repo, {"STEPRL_PUSH": " "}) is None
    )  # default: no push
    with pytest.raises(ConfigError, match="STEPRL_PUSH='origin': .* no git remote of that name"):
        push_remote(repo, {"STEPRL_PUSH": "origin"})
    _git(repo, "remote", "add", "origin", str(origin))
    with pytest.raises(ConfigError, match="STEPRL_PUSH='origin': .* no default DVC remote"):
        push_remote(repo, {"STEPRL_PUSH": "origin"})
    _dvc(repo, "remote", "add", "--local", "-d", "steprl", str(remote))
    assert push_remote(repo, {"STEPRL_PUSH": "origin"}) == "origin"

    (ref,) = [
        r for r in _git(repo, "for-each-ref", "--format=%(refname)", "refs/exps").split() if r.endswith("/e1")
    ]
    assert not list(remote.rglob("*"))
    push_experiment(repo, "origin", ref)
    assert ref in _git(repo, "ls-remote", str(origin), "refs/exps/*")
    pushed = [p for p in remote.rglob("*") if p.is_file()]
    assert [p.read_text() for p in pushed] == ["7"]  # out.txt of the experiment, in the DVC remote
    with pytest.raises(ExperimentError, match="dvc exp push nowhere failed"):
        push_experiment(repo, "nowhere", ref)


def _make_n(*args: str) -> str:
    return make_n(*args, drop=("POOL",))  # nor a parent make's variables (`make test POOL=...`)


def test_make_worker_runs_prefects_worker_in_this_clone():
    out = _make_n("worker", "POOL=p1", "PUSH=")
    assert f"STEPRL_REPO={REPO} PYTHONPATH={REPO} PREFECT_HOME={REPO}/.prefect" in out
    assert "PREFECT_API_URL=http://127.0.0.1:4200/api MLFLOW_TRACKING_URI=http://127.0.0.1:5000" in out
    assert "STEPRL_PUSH= STEPRL_SERVED_ARTIFACTS=1" in out
    assert "prefect worker start --pool p1 --type process --limit 1" in out
    assert "--pool p1" in _make_n("serve", "POOL=p1")
    plain = _make_n("serve")
    assert "--pool" not in plain  # make serve as before
    with pytest.raises(subprocess.CalledProcessError) as err:
        _make_n("worker")
    assert "POOL is not set: name the work pool, e.g. make worker POOL=steprl" in err.value.stderr


def test_status_shows_the_pool_deployment_of_a_start_with_a_pool(monkeypatch, capsys):
    ep = Endpoints()
    dep = {"id": "d-1", "status": "READY", "paused": False, "schedules": []}
    answers = {
        ep.urls["prefect"]: (200, True),
        ep.urls["mlflow"]: (200, "OK"),
        ep.urls["deployment"]: (200, dep),
        serve.pool_urls(ep, "steprl")["pool deployment"]: (200, {**dep, "status": "NOT_READY"}),
    }
    monkeypatch.setattr(serve, "get_json", lambda url, body=None: answers.get(url, (0, None)))
    monkeypatch.setattr(serve, "running", lambda path=None: {"pid": 1, "started": "now", "pool": "steprl"})
    assert serve.status(ep) == 0
    out = capsys.readouterr().out
    assert "pipeline/on-steprl" in out and "NOT_READY on work pool steprl" in out  # no worker polls yet
    monkeypatch.setattr(serve, "running", lambda path=None: {"pid": 1, "started": "now"})
    assert serve.status(ep) == 0 and "on-steprl" not in capsys.readouterr().out  # make serve without POOL
