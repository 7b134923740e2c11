"""Fast tests of the service layer: override building/checking, experiments in a tiny DVC repo, the
process supervisor (with stand-in services) and the status command. The real servers are in
test_pipeline_service_mlflow.py and test_pipeline_service_e2e.py."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from components.config import ConfigError
from components.train.distributed import free_port
from flows import serve
from flows._experiments import (
    PARAM_KEYS,
    ExperimentError,
    _remove_tree,
    _stream,
    build_overrides,
    check_experiment_name,
    check_overrides,
    hydra_value,
    read_metrics,
    run_experiment,
)
from flows.serve import Endpoints, ServeError

REPO = Path(__file__).resolve().parents[2]
PARAMS = (REPO / "params.yaml").read_text()


# ---------------------------------------------------------------------------------------------
# overrides


HOSTILE = [
    "plain",
    "/models/Qwen2.5-0.5B-Instruct",
    "it's",
    "back\\slash",
    "end\\",
    "\\'",
    "'",
    "''",
    "a,b",
    "[x]",
    "{a: 1}",
    "null",
    "true",
    "1e-3",
    "12",
    "",
    " sp ",
    'dq"x',
    "$x",
    "a=b",
    "k=v,w",
    "é ü 中",
    "line\nbreak",
    "tab\there",
    "\\\\'\\",
    "# not a comment",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hydra_value_round_trips_strings_through_hydras_own_parser(text):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_override(f"model.path={hydra_value(text)}")
    assert parsed.value() == text
    assert isinstance(parsed.value(), str)


def test_hydra_value_of_numbers_lists_and_null():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for value in [0, 7, -3, 1e-3, 0.5, True, False, None, ["grpo", "ppo"], [], ["it's", "a,b"]]:
        got = parser.parse_override(f"k={hydra_value(value)}").value()
        assert got == value and type(got) is type(value), (value, got)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "${oc.env:HOME}", {"a": 1}, object()])
def test_hydra_value_rejects_what_dvc_would_mangle(bad):
    with pytest.raises(ConfigError):
        hydra_value(bad, key="model_path")


def test_build_overrides_passes_only_set_parameters_mapped_to_their_keys():
    assert build_overrides() == []
    assert build_overrides(task=None, seed=None, algorithms=None, iterations=None, model_path=None) == []
    got = build_overrides(
        seed=3,
        algorithms=["grpo", "ppo"],
        iterations=5,
        model_path="/m/x",
        overrides=["sft.lr=0.001", " prepare.n_train=40 "],
    )
    assert got == [
        "seed=3",
        "compare.algorithms=['grpo','ppo']",
        "train.iterations=5",
        "model.path='/m/x'",
        "sft.lr=0.001",
        "prepare.n_train=40",
    ]
    assert PARAM_KEYS["algorithms"] == "compare.algorithms" and PARAM_KEYS["iterations"] == "train.iterations"


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"overrides": ["sft.lr"]}, "override 'sft.lr': expected key=value"),
        ({"overrides": ["seed=1,2"]}, "override 'seed=1,2': a sweep (several values)?"),
        ({"overrides": ["params.yaml:seed=1"]}, "override 'params.yaml:seed=1': Error parsing override"),
        ({"overrides": ["~seed"]}, "override '~seed': expected key=value"),
        ({"overrides": ["=3"]}, "override '=3': params.yaml has no key ''"),
        ({"overrides": ["seed=[1"]}, "override 'seed=[1': no viable alternative"),
        ({"overrides": ["a..b=1"]}, "override 'a..b=1'"),
        ({"overrides": "seed=1"}, "list"),
        ({"overrides": [None]}, "override None: expected key=value"),
        ({"seed": 1, "overrides": ["seed=2"]}, "override 'seed=2': seed is already set by parameter 'seed'"),
        ({"overrides": ["sft.lr=1", "sft.lr=2"]}, "already set by override 'sft.lr=1'"),
        ({"lr": 1}, "unknown run parameter"),
    ],
)
def test_bad_run_parameters_are_rejected_naming_them(kwargs, needle):
    """What a run does with its parameters before anything runs: build the `-S` list, check it."""
    with pytest.raises(ConfigError) as err:
        check_overrides(PARAMS, build_overrides(**kwargs))
    assert needle in str(err.value), str(err.value)


def test_check_overrides_returns_the_typed_params_the_run_will_see():
    p = check_overrides(
        PARAMS,
        ["prepare.n_train=40", "sft.rows=30", "sft.lr=1e-3", "model.path='/x/y'", "evaluate.max_samples=4"],
    )
    assert p.prepare.n_train == 40 and p.sft.rows == 30 and p.sft.lr == 0.001 and p.model.path == "/x/y"
    assert p.evaluate.max_samples == 4
    assert check_overrides(PARAMS, []).prepare.n_train == check_overrides(PARAMS, []).prepare.n_train


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("prepare.n_trian=40", "params.yaml has no key 'prepare.n_trian'"),
        ("++prepare.n_trian=40", "prepare.n_trian: unknown key"),
        ("sft.lr=abc", "sft.lr: Input should be a valid number"),
        ("prepare.n_train=0", "prepare.n_train: Input should be greater than or equal to 1"),
        ("prepare=3", "prepare: Input should be"),
        (
            "prepare.n_train=40",
            "leaves no train rows for RL prompts (prepare.n_train=40)",
        ),  # cross-field check
    ],
)
def test_check_overrides_names_the_bad_key(override, needle):
    with pytest.raises(ConfigError) as err:
        check_overrides(PARAMS, [override])
    assert needle in str(err.value), str(err.value)
    assert "steprl-params-" not in str(err.value)  # the temporary copy is never what the user sees


def test_a_named_parameter_for_a_key_params_yaml_lacks_fails_naming_it():
    # algorithms/iterations map to compare.algorithms/train.iterations; with a params file that
    # lacks the key, the run fails fast with the key named instead of inside dvc.
    with pytest.raises(ConfigError, match="compare.algorithms"):
        check_overrides("task: calc\nseed: 0\n", build_overrides(algorithms=["grpo"]))


@pytest.mark.parametrize("name", ["ok", "run-1", "a.b_c", "X" * 100])
def test_experiment_names_accepted(name):
    assert check_experiment_name(name) == name


@pytest.mark.parametrize("name", ["", "-x", "a b", "a/b", "a..b", "x.lock", "X" * 101, "é", "a:b", None])
def test_experiment_names_rejected(name):
    with pytest.raises(ConfigError, match="experiment_name"):
        check_experiment_name(name)


# ---------------------------------------------------------------------------------------------
# git / dvc helpers


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def test_read_metrics_reports_the_numeric_metrics_changed_since_the_baseline(tmp_path):
    _git(tmp_path, "init", "-q")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "metrics").mkdir()
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  s:\n    cmd: 'true'\n    metrics:\n"
        "    - metrics/sft.json: {cache: false}\n    - metrics/eval_sft.json: {cache: false}\n"
    )
    (tmp_path / "metrics" / "sft.json").write_text(
        json.dumps({"loss": 1.5, "steps": 4, "name": "x", "ok": True})
    )
    (tmp_path / "metrics" / "eval_sft.json").write_text(json.dumps({"accuracy": 0.25}))
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "base")
    base = _git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "metrics" / "sft.json").write_text(json.dumps({"loss": 0.5, "steps": 8, "ok": False}))
    _git(tmp_path, "commit", "-qam", "exp")
    rev = _git(tmp_path, "rev-parse", "HEAD")
    assert read_metrics(tmp_path, rev, since=base) == {"sft.loss": 0.5, "sft.steps": 8.0}
    assert read_metrics(tmp_path, rev, since=rev) == {}
    with pytest.raises(ExperimentError, match="dvc metrics diff failed"):
        read_metrics(tmp_path, "no-such-rev", since=base)


def test_run_experiment_refuses_a_repo_without_commits(tmp_path):
    _git(tmp_path, "init", "-q")
    with pytest.raises(ExperimentError, match="no commit"):
        run_experiment(tmp_path, [], "fine")


def test_run_experiment_from_head_runs_in_a_private_clone_with_the_repos_cache(tmp_path):
    """A head-baseline run: HEAD's params plus the overrides (not the uncommitted edit), the
    experiment brought into the repo, the repo's DVC cache and local config used, the workspace and
    the clone left as they were; a target that is not a stage fails with DVC's error naming it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=repo, check=True)
    (repo / "s.py").write_text(
        "import json, yaml\np = yaml.safe_load(open('params.yaml'))\n"
        "json.dump({'n': p['n'], 'k': p['k']}, open('m.json', 'w'))\nopen('out.txt', 'w').write('x' * p['n'])\n"
    )
    (repo / "dvc.yaml").write_text(
        "stages:\n  s:\n    cmd: python s.py\n    deps: [s.py]\n    params: [n, k]\n"
        "    outs: [out.txt]\n    metrics: [m.json: {cache: false}]\n"
    )
    (repo / "params.yaml").write_text("n: 1\nk: 2\n")
    (repo / ".dvc" / "config.local").write_text(
        f"[core]\n    remote = x\n['remote \"x\"']\n    url = {tmp_path / 'remote'}\n[cache]\n    dir = ../../cache\n"
    )
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    (repo / "params.yaml").write_text("n: 1\nk: 9\n")  # uncommitted: a head run must not see it
    seen = []
    result = run_experiment(repo, ["n=5"], "e1", on_line=seen.append)
    assert result.name == "e1" and result.baseline_rev == _git(repo, "rev-parse", "HEAD")
    assert result.ref == f"refs/exps/{result.baseline_rev[:2]}/{result.baseline_rev[2:]}/e1"
    assert _git(repo, "rev-parse", result.ref) == result.rev  # brought into the repo
    assert json.loads(_git(repo, "show", f"{result.rev}:m.json")) == {"n": 5, "k": 2}
    assert read_metrics(repo, result.rev, since=result.baseline_rev) == {"m.n": 5.0, "m.k": 2.0}
    assert "Running stage 's'" in result.log and not [x for x in seen if "applied to your workspace" in x]
    assert list((tmp_path / "cache").rglob("*"))  # out.txt went into the repo's cache (config.local)
    assert (repo / "params.yaml").read_text() == "n: 1\nk: 9\n" and not (repo / "out.txt").exists()
    assert not list((repo / ".dvc" / "tmp" / "steprl-runs").rglob("*"))  # the clone is gone
    with pytest.raises(ExperimentError, match="'fresh' does not exist as an output or a stage name"):
        run_experiment(repo, [], "e2", targets=["fresh"], on_line=seen.append)
    assert not list((repo / ".dvc" / "tmp" / "steprl-runs").rglob("*"))


def test_remove_tree_outlasts_a_straggler_still_writing_into_the_clone(tmp_path):
    """A helper left by the run (cwd in the clone) may still write files while the clone is removed.
    The straggler is bounded by counts, not by time, and is writing before the removal starts: it
    writes relative to the clone (a directory fd, as a helper's cwd), so once the clone is gone it
    can write nothing more and stops; before that it recreates .dvc/tmp whenever a removal took it,
    and stops 200 files after its second recreation or after 5,000 files, whichever comes first (a
    git or dvc helper writes a handful; 300,000 outlasted the removal's 240 attempts on a loaded CI
    machine, where rmtree never emptied .dvc/tmp ahead of the writer: that is a writer that never
    stops, which the removal gives up on by design). However slowly a busy machine runs either side,
    the clone must end up gone (the old test stopped the straggler by the clock and started the
    removal 0.1 s after the thread: a thread started late found no clone, and wrote it after)."""
    clone, started = tmp_path / "clone", threading.Event()
    clone.mkdir()
    seen = {"recreated": 0, "written": 0}

    def straggler(cwd: int) -> None:
        more = 200
        for i in range(5_000):  # a bound on the files, never a writer without an end
            try:
                try:
                    os.stat(".dvc/tmp", dir_fd=cwd)
                except FileNotFoundError:
                    seen["recreated"] += started.is_set()
                    for d in (".dvc", ".dvc/tmp"):
                        with contextlib.suppress(FileExistsError):
                            os.mkdir(d, dir_fd=cwd)
                os.close(os.open(f".dvc/tmp/f{i}", os.O_WRONLY | os.O_CREAT, dir_fd=cwd))
            except FileNotFoundError:  # the removal took a directory under it, or the clone itself
                if os.fstat(cwd).st_nlink == 0:
                    return  # its cwd is gone: nothing left to write into
                continue
            seen["written"] += 1
            started.set()
            if seen["recreated"] >= 2:
                more -= 1
                if more == 0:
                    return

    cwd = os.open(clone, os.O_RDONLY | os.O_DIRECTORY)
    writer = threading.Thread(target=straggler, args=(cwd,))
    try:
        writer.start()
        assert started.wait(60)  # the clone is being written before its removal starts
        _remove_tree(clone)
        writer.join()
    finally:
        os.close(cwd)
    assert not clone.exists(), seen


def test_remove_tree_retries_as_long_as_each_attempt_finds_something_new(tmp_path, monkeypatch):
    """A straggler slower than any fixed count of attempts (here 15 removals each undone by a new
    file): the removal keeps going while what is left changes, and ends with the clone gone."""
    from flows import _experiments

    clone, real_rmtree, calls = tmp_path / "clone", shutil.rmtree, []

    def rmtree_outrun(path, ignore_errors):  # what a removal leaves while a straggler writes
        calls.append(path)
        real_rmtree(path, ignore_errors=ignore_errors)
        if len(calls) <= 15:
            (Path(path) / ".dvc" / "tmp").mkdir(parents=True)
            (Path(path) / ".dvc" / "tmp" / f"f{len(calls)}").write_text("x")

    clone.mkdir()
    monkeypatch.setattr(_experiments.shutil, "rmtree", rmtree_outrun)
    _remove_tree(clone, pause=0.01)
    assert not clone.exists() and len(calls) == 16


def test_remove_tree_gives_up_on_what_nothing_writes_and_says_where(tmp_path, monkeypatch, capsys):
    from flows import _experiments

    clone = tmp_path / "clone"
    (clone / "held").mkdir(parents=True)
    monkeypatch.setattr(_experiments.shutil, "rmtree", lambda path, ignore_errors: None)  # it stays
    _remove_tree(clone, pause=0.01)
    assert clone.exists()
    assert f"could not remove the run's clone {clone}" in capsys.readouterr().err


def test_stream_keeps_progress_bar_last_state_and_kills_what_the_command_left_behind(tmp_path):
    pidfile = tmp_path / "bg.pid"
    script = f"echo one; printf '10%%\\r50%%\\r100%%\\n'; sleep 300 >/dev/null 2>&1 & echo $! > {pidfile}; echo two; exit 3"
    seen = []
    code, out = _stream(["sh", "-c", script], tmp_path, dict(os.environ), seen.append)
    assert code == 3
    assert seen == ["one", "100%", "two"] and out == "one\n100%\ntwo"
    pid = int(pidfile.read_text())
    assert not _alive(pid)


def test_stream_kills_the_whole_group_when_interrupted(tmp_path):
    pidfile = tmp_path / "bg.pid"
    script = f"sleep 300 >/dev/null 2>&1 & echo $! > {pidfile}; echo started; sleep 300"

    def interrupt(line):
        raise KeyboardInterrupt  # what a Prefect cancellation (SIGTERM -> exception) looks like here

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        _stream(["sh", "-c", script], tmp_path, dict(os.environ), interrupt)
    assert time.monotonic() - t0 < 20
    assert not _alive(int(pidfile.read_text()))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ---------------------------------------------------------------------------------------------
# endpoints, env, status


@pytest.fixture
def no_start(tmp_path, monkeypatch):
    """No `start` running (as far as these commands can tell): a state file nobody wrote."""
    monkeypatch.setattr(serve, "STATE", tmp_path / "serve.json")
    return tmp_path / "serve.json"


def test_env_prints_the_default_loopback_endpoints_or_the_flags(no_start, capsys):
    assert serve.main(["env"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "export PREFECT_API_URL=http://127.0.0.1:4200/api",
        "export MLFLOW_TRACKING_URI=http://127.0.0.1:5000",
    ]
    assert serve.main(["env", "--mlflow-port", "5055"]) == 0
    assert "MLFLOW_TRACKING_URI=http://127.0.0.1:5055" in capsys.readouterr().out
    ep = Endpoints()
    assert ep.urls == {
        "prefect": "http://127.0.0.1:4200/api/health",
        "mlflow": "http://127.0.0.1:5000/health",
        "deployment": "http://127.0.0.1:4200/api/deployments/name/pipeline/steprl",
    }


def test_env_and_status_follow_the_running_start_unless_ports_are_given(no_start, capsys):
    no_start.write_text(json.dumps({"pid": os.getpid(), "prefect_port": 4300, "mlflow_port": 5300}))
    assert serve.main(["env"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "export PREFECT_API_URL=http://127.0.0.1:4300/api",
        "export MLFLOW_TRACKING_URI=http://127.0.0.1:5300",
    ]
    assert serve.main(["env", "--prefect-port", "4400"]) == 0
    assert "PREFECT_API_URL=http://127.0.0.1:4400/api" in capsys.readouterr().out
    no_start.write_text(json.dumps({"pid": _dead_pid(), "prefect_port": 4300, "mlflow_port": 5300}))
    assert serve.main(["env"]) == 0  # a state file left by a start that died does not count
    assert "PREFECT_API_URL=http://127.0.0.1:4200/api" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["http", "0", "70000", "-1", "4200.5"])
def test_bad_port_is_named(bad, capsys):
    with pytest.raises(SystemExit) as err:
        serve.main(["env", "--mlflow-port", bad])
    assert (
        err.value.code == 2
        and f"argument --mlflow-port: invalid _port value: '{bad}'" in capsys.readouterr().err
    )


def test_port_free():
    port = free_port()
    assert serve.port_free(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not serve.port_free(port)


def test_status_against_nothing_running(no_start, capsys):
    ep = Endpoints(free_port(), free_port())
    assert serve.status(ep) == 1
    out = capsys.readouterr().out
    assert "is not running" in out
    assert f"{ep.prefect_url}" in out and f"{ep.mlflow_url}" in out
    assert out.count("not answering") == 3 and "unknown (Prefect is not answering)" in out
    # a state file left by a start that died counts as not running
    no_start.write_text(json.dumps({"pid": _dead_pid(), "prefect_port": 1, "mlflow_port": 2}))
    assert serve.status(ep) == 1
    assert "is not running" in capsys.readouterr().out


def test_status_main_exit_code_with_explicit_ports(no_start, capsys):
    code = serve.main(["status", "--prefect-port", str(free_port()), "--mlflow-port", str(free_port())])
    assert code == 1
    assert "not answering" in capsys.readouterr().out


class _Fake(http.server.BaseHTTPRequestHandler):
    routes: dict = {}

    def do_GET(self):
        body = self.routes.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(json.dumps(body).encode() if body is not None else b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_servers():
    servers = []
    for routes in (
        {
            "/api/health": True,
            "/api/deployments/name/pipeline/steprl": {
                "id": "d-1",
                "status": "READY",
                "paused": False,
                "schedules": [
                    {"schedule": {"cron": "0 3 * * *"}, "active": True},
                    {"schedule": {"interval": 3600.0}, "active": False},
                ],
            },
        },
        {"/health": "OK"},
    ):
        handler = type("H", (_Fake,), {"routes": routes})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
    yield Endpoints(servers[0].server_address[1], servers[1].server_address[1])
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def test_status_when_everything_answers(fake_servers, tmp_path, capsys):
    state = tmp_path / "serve.json"
    state.write_text(json.dumps({"pid": os.getpid(), "started": "now"}))
    assert serve.status(fake_servers, state) == 0
    out = capsys.readouterr().out
    assert f"pid {os.getpid()}, started now" in out
    assert out.count(" up ") == 2
    assert "READY; schedules: cron 0 3 * * *, interval 3600.0 (inactive)" in out
    assert f"{fake_servers.prefect_url}/deployments/deployment/d-1" in out


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ---------------------------------------------------------------------------------------------
# start (honcho running a Procfile), with stand-in services (a few lines of Python each)


FAKE_SERVER = textwrap.dedent("""
    import http.server, os, signal, subprocess, sys
    if "stubborn" in sys.argv[3:]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # a grandchild in its own session: it leaves the group, only the subreaper's sweep reaches it;
    # "holds-output": it keeps the service's stdout open, so honcho alone would wait for it forever
    kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                           stdout=None if "holds-output" in sys.argv[3:] else subprocess.DEVNULL,
                           stderr=None if "holds-output" in sys.argv[3:] else subprocess.DEVNULL)
    open(sys.argv[2], "w").write(f"{os.getpid()} {kid.pid}")
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")

SUPERVISOR = textwrap.dedent("""
    import sys
    from pathlib import Path
    from flows.serve import Endpoints, start
    tmp = Path(sys.argv[1]); ports = [int(p) for p in sys.argv[2:5]]; flags = sys.argv[5:]  # "deployment:stubborn"
    names = ["mlflow", "prefect", "deployment"]
    processes = {
        name: f"exec {sys.executable} {tmp / 'fake.py'} {port} {tmp / name}.pids "
        + " ".join(f.split(":")[1] for f in flags if f.startswith(name + ":"))
        for name, port in zip(names, ports)
    }
    ready = {name: f"http://127.0.0.1:{port}/" for name, port in zip(names, ports)}
    sys.exit(start(Endpoints(ports[1], ports[0]), processes=processes, ready=ready, repo=tmp,
                   state_path=tmp / "serve.json", grace=3.0, timeout=60))
""")


def _start_supervisor(tmp_path, *flags):
    (tmp_path / "fake.py").write_text(FAKE_SERVER)
    (tmp_path / "sup.py").write_text(SUPERVISOR)
    ports = [str(free_port()) for _ in range(3)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "sup.py"), str(tmp_path), *ports, *flags],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "serve.json").is_file():
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "supervisor did not come up"
        time.sleep(0.1)
    pids = []
    for name in ("mlflow", "prefect", "deployment"):
        pids += [int(p) for p in (tmp_path / f"{name}.pids").read_text().split()]
    return proc, pids


@pytest.mark.parametrize("flags", [(), ("deployment:stubborn",), ("mlflow:holds-output",)])
def test_start_stops_every_process_on_sigterm(tmp_path, flags):
    proc, pids = _start_supervisor(tmp_path, *flags)
    state = json.loads((tmp_path / "serve.json").read_text())
    assert state["pid"] == proc.pid and set(state) == {"pid", "prefect_port", "mlflow_port", "started"}
    assert all(_alive(p) for p in pids)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert time.monotonic() - t0 < 20  # a process that ignores SIGTERM is killed after the grace
    assert "services are up" in out and "all steprl services stopped" in out
    # the deployment first (its flow runs still reach both servers), then honcho stops the others
    assert out.index("stopping deployment first") < out.index("sending SIGTERM to prefect")
    assert "sending SIGTERM to mlflow" in out
    assert ("deployment stopped (rc=-9)" in out) == (
        "deployment:stubborn" in flags
    )  # SIGKILL after the grace
    assert not [p for p in pids if _alive(p)]  # the grandchildren that left their group too
    assert not (tmp_path / "serve.json").exists()


def test_start_stops_the_others_when_one_dies(tmp_path):
    proc, pids = _start_supervisor(tmp_path)
    mlflow_pid = int((tmp_path / "mlflow.pids").read_text().split()[0])
    os.kill(mlflow_pid, signal.SIGKILL)
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()  # a failed test leaves nothing behind either
    assert proc.returncode == 1, out
    assert "mlflow stopped (rc=-9)" in out
    assert not [p for p in pids if _alive(p)]


def test_start_refuses_a_port_in_use_and_a_second_start(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        ep = Endpoints(busy, free_port())
        with pytest.raises(ServeError, match=f"port {busy} on 127.0.0.1 is in use.*--prefect-port"):
            serve.start(ep, repo=tmp_path, state_path=tmp_path / "serve.json")
    (tmp_path / "serve.json").write_text(json.dumps({"pid": os.getpid()}))
    with pytest.raises(ServeError, match="already running"):
        serve.start(
            Endpoints(free_port(), free_port()),
            repo=tmp_path,
            state_path=tmp_path / "serve.json",
        )


def _procfile() -> dict[str, str]:
    from honcho.environ import parse_procfile

    return dict(parse_procfile((REPO / "Procfile").read_text()).processes)


def test_procfile_runs_the_three_services_on_the_tools_own_settings():
    procfile = _procfile()
    assert list(procfile) == ["prefect", "mlflow", "deployment"]
    assert "prefect server start" in procfile["prefect"] and "mlflow/server.sh" in procfile["mlflow"]
    assert "flows.pool serve" in procfile["deployment"]
    env = serve.service_env(Endpoints(4311, 5055), cron="0 3 * * *", overrides=["seed=1"])
    assert (env["PREFECT_SERVER_API_HOST"], env["PREFECT_SERVER_API_PORT"]) == ("127.0.0.1", "4311")
    assert env["PREFECT_UI_API_URL"] == env["PREFECT_API_URL"] == "http://127.0.0.1:4311/api"
    assert (env["STEPRL_MLFLOW_PORT"], env["MLFLOW_TRACKING_URI"]) == ("5055", "http://127.0.0.1:5055")
    assert (env["STEPRL_SCHEDULE_CRON"], env["STEPRL_OVERRIDES"]) == ("0 3 * * *", '["seed=1"]')


PREFECT_ONLY = textwrap.dedent("""
    import sys
    from pathlib import Path
    from honcho.environ import parse_procfile
    from flows.serve import REPO, Endpoints, start
    tmp, port = Path(sys.argv[1]), int(sys.argv[2])
    ep = Endpoints(port, port + 1)
    prefect = parse_procfile((REPO / "Procfile").read_text()).processes["prefect"]
    sys.exit(start(ep, processes={"prefect": prefect}, ready={"prefect": ep.urls["prefect"]},
                   repo=tmp, state_path=tmp / "serve.json", grace=10.0, timeout=180))
""")


def test_prefect_ui_calls_its_own_api_on_a_non_default_port(tmp_path):
    """`make serve PREFECT_PORT=...`: the UI's settings (what the page's JavaScript reads) point to
    the port it is served on, not to Prefect's default 4200."""
    (tmp_path / "sup.py").write_text(PREFECT_ONLY)
    port = free_port()
    while not serve.port_free(port + 1):
        port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PYTHONPATH"] = str(REPO)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "sup.py"), str(tmp_path), str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not (tmp_path / "serve.json").is_file():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the Prefect server did not come up"
            time.sleep(0.2)
        code, settings = serve.get_json(f"http://127.0.0.1:{port}/ui-settings")
        assert code == 200 and settings["api_url"] == f"http://127.0.0.1:{port}/api", settings
        assert serve.get_json(f"http://127.0.0.1:{port}/")[0] == 200  # the page itself
        tree = psutil.Process(proc.pid).children(recursive=True)
    finally:
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    assert not [p for p in tree if _alive(p.pid)]
    assert serve.port_free(port)


@pytest.mark.parametrize(
    ("schedule", "needle"),
    [
        (["--cron", "0 3 * * *", "--interval", "5"], "argument --interval: not allowed with argument --cron"),
        (["--interval", "0"], "argument --interval: invalid _interval value: '0'"),
        (["--interval", "-3"], "argument --interval: invalid _interval value: '-3'"),
        (["--cron", "every night"], "argument --cron: invalid _cron value: 'every night'"),
        (["--cron", "61 * * * *"], "argument --cron: invalid _cron value: '61 * * * *'"),
    ],
)
def test_bad_schedules_fail_before_anything_starts(schedule, needle, capsys):
    with pytest.raises(SystemExit) as err:  # Prefect's own schedule checks, at argument parsing
        serve.main(["start", "--prefect-port", "1", "--mlflow-port", "2", *schedule])
    assert err.value.code == 2 and needle in capsys.readouterr().err


def test_good_schedules_reach_the_deployment(monkeypatch):
    started = []
    monkeypatch.setattr(serve, "start", lambda ep, **kw: started.append((ep, kw)) or 0)
    assert serve.main(["start", "--cron", "0 3 * * *"]) == 0
    assert serve.main(["start", "--interval", "3600", "--prefect-port", "4300", "-S", "seed=3"]) == 0
    assert serve.main(["start"]) == 0
    assert [(ep, kw["cron"], kw["interval"], kw["overrides"]) for ep, kw in started] == [
        (Endpoints(4200, 5000), "0 3 * * *", None, []),
        (Endpoints(4300, 5000), None, 3600.0, ["seed=3"]),
        (Endpoints(4200, 5000), None, None, []),
    ]
    env = serve.service_env(Endpoints(), interval=3600.0)
    assert (env["STEPRL_SCHEDULE_CRON"], env["STEPRL_SCHEDULE_INTERVAL"]) == ("", "3600")
    assert serve.main(["start", "-S", "sft.nope=3"]) == 2  # a bad default override: before anything starts
    assert len(started) == 3
