"""Fast tests of the service layer: override building/checking, experiment helpers, the process
supervisor (with stand-in services) and the status command. The real servers are in
test_pipeline_service_mlflow.py and test_pipeline_service_e2e.py."""

from __future__ import annotations

import http.server
import json
import os
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
from flows import serve
from flows._experiments import (
    PARAM_KEYS,
    ExperimentError,
    _stream,
    build_overrides,
    check_experiment_name,
    check_overrides,
    check_targets,
    experiment_ref,
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
        ({"overrides": ["sft.lr"]}, "expected key=value"),
        ({"overrides": ["seed=1,2"]}, "sweep"),
        ({"overrides": ["params.yaml:seed=1"]}, "only params.yaml keys"),
        ({"overrides": ["~seed"]}, "expected key=value"),
        ({"overrides": ["=3"]}, "'' is not a dotted params key"),
        ({"overrides": ["seed=[1"]}, "not a valid key=value"),
        ({"overrides": ["a..b=1"]}, "a..b"),
        ({"overrides": "seed=1"}, "list"),
        ({"seed": 1, "overrides": ["seed=2"]}, "already set by parameter 'seed'"),
        ({"overrides": ["sft.lr=1", "sft.lr=2"]}, "already set by override 'sft.lr=1'"),
        ({"lr": 1}, "unknown run parameter"),
    ],
)
def test_build_overrides_rejects_bad_input_naming_it(kwargs, needle):
    with pytest.raises(ConfigError, match=None) as err:
        build_overrides(**kwargs)
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


def test_experiment_ref_is_where_dvc_keeps_it():
    rev = "0123456789abcdef0123456789abcdef01234567"
    assert experiment_ref(rev, "x") == "refs/exps/01/23456789abcdef0123456789abcdef01234567/x"


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


def test_run_experiment_refuses_a_repo_without_commits_and_bad_names(tmp_path):
    _git(tmp_path, "init", "-q")
    with pytest.raises(ExperimentError, match="no commit"):
        run_experiment(tmp_path, [], "fine")
    with pytest.raises(ConfigError, match="experiment_name"):
        run_experiment(tmp_path, [], "bad name")
    with pytest.raises(ConfigError, match="baseline"):
        run_experiment(tmp_path, [], "fine", baseline="tomorrow")


def test_check_targets_reads_dvc_yaml_of_the_baseline(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  prepare: {cmd: x}\n  evaluate: {foreach: [sft], do: {cmd: y}}\n"
    )
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "base")
    rev = _git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "dvc.yaml").write_text("stages:\n  prepare: {cmd: x}\n  fresh: {cmd: z}\n")  # uncommitted
    assert check_targets(tmp_path, "head", rev, []) == []
    assert check_targets(tmp_path, "head", rev, ["prepare", "evaluate@sft"]) == ["prepare", "evaluate@sft"]
    with pytest.raises(ConfigError, match="'fresh' is not a stage of dvc.yaml; stages: evaluate, prepare"):
        check_targets(tmp_path, "head", rev, ["fresh"])
    assert check_targets(tmp_path, "workspace", rev, ["fresh"]) == ["fresh"]
    with pytest.raises(ConfigError, match="'evaluate' is not"):
        check_targets(tmp_path, "workspace", rev, ["evaluate"])


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
# endpoints


def test_endpoint_defaults_bind_loopback_on_the_documented_ports():
    ep = serve.resolve_endpoints(env={})
    assert (ep.host, ep.prefect_port, ep.mlflow_port) == ("127.0.0.1", 4200, 5000)
    assert ep.prefect_url == "http://127.0.0.1:4200" and ep.prefect_api == "http://127.0.0.1:4200/api"
    assert ep.health == {
        "prefect": "http://127.0.0.1:4200/api/health",
        "mlflow": "http://127.0.0.1:5000/health",
    }
    assert ep.deployment_api() == "http://127.0.0.1:4200/api/deployments/name/pipeline/steprl"
    assert serve.env_lines(ep) == [
        "export PREFECT_API_URL=http://127.0.0.1:4200/api",
        "export MLFLOW_TRACKING_URI=http://127.0.0.1:5000",
    ]


def test_flags_beat_environment_beat_defaults():
    env = {"STEPRL_PREFECT_PORT": "4300", "STEPRL_MLFLOW_PORT": "5300", "STEPRL_HOST": "127.0.0.2"}
    assert serve.resolve_endpoints(env=env) == Endpoints("127.0.0.2", 4300, 5300)
    assert serve.resolve_endpoints("127.0.0.1", 4400, None, env=env) == Endpoints("127.0.0.1", 4400, 5300)


@pytest.mark.parametrize("bad", ["http", "0", "70000", "-1", "4200.5"])
def test_bad_port_is_named(bad):
    with pytest.raises(ServeError, match="STEPRL_MLFLOW_PORT"):
        serve.resolve_endpoints(env={"STEPRL_MLFLOW_PORT": bad})


def test_free_port_and_port_free():
    port = serve.free_port()
    assert serve.port_free("127.0.0.1", port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not serve.port_free("127.0.0.1", port)


# ---------------------------------------------------------------------------------------------
# status


def test_status_against_nothing_running(tmp_path, capsys):
    ep = Endpoints("127.0.0.1", serve.free_port(), serve.free_port())
    assert serve.status(ep, None) == 1
    out = capsys.readouterr().out
    assert "is not running" in out
    assert f"{ep.prefect_url}" in out and f"{ep.mlflow_url}" in out
    assert out.count("not answering") == 3 and "unknown (Prefect is not answering)" in out
    # a state file left by a start that died counts as not running
    assert serve.status(ep, {"pid": _dead_pid(), "host": "127.0.0.1"}) == 1
    assert "is not running" in capsys.readouterr().out


def test_status_main_exit_code_with_explicit_ports(capsys):
    code = serve.main(
        ["status", "--prefect-port", str(serve.free_port()), "--mlflow-port", str(serve.free_port())]
    )
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
    yield Endpoints("127.0.0.1", servers[0].server_address[1], servers[1].server_address[1])
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def test_status_when_everything_answers(fake_servers, capsys):
    assert serve.status(fake_servers, {"pid": os.getpid(), "started": "now"}) == 0
    out = capsys.readouterr().out
    assert f"pid {os.getpid()}" in out
    assert out.count(" up ") == 2
    assert "READY; schedule: cron '0 3 * * *', every 3600 s (inactive)" in out
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
    from flows.serve import Endpoints, become_subreaper, start
    tmp = Path(sys.argv[1]); ports = [int(p) for p in sys.argv[2:5]]; flags = sys.argv[5:]  # "deployment:stubborn"
    names = ["mlflow", "prefect", "deployment"]
    processes = {
        name: f"exec {sys.executable} {tmp / 'fake.py'} {port} {tmp / name}.pids "
        + " ".join(f.split(":")[1] for f in flags if f.startswith(name + ":"))
        for name, port in zip(names, ports)
    }
    ready = {name: f"http://127.0.0.1:{port}/" for name, port in zip(names, ports)}
    become_subreaper()
    sys.exit(start(Endpoints("127.0.0.1", ports[1], ports[0]), processes=processes, ready=ready, repo=tmp,
                   state_path=tmp / "serve.json", grace=3.0, timeout=60))
""")


def _start_supervisor(tmp_path, *flags):
    (tmp_path / "fake.py").write_text(FAKE_SERVER)
    (tmp_path / "sup.py").write_text(SUPERVISOR)
    ports = [str(serve.free_port()) for _ in range(3)]
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
    assert state["pid"] == proc.pid and (state["prefect_port"], state["host"]) == (
        state["prefect_port"],
        "127.0.0.1",
    )
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
        ep = Endpoints("127.0.0.1", busy, serve.free_port())
        with pytest.raises(ServeError, match=f"Prefect port {busy} on 127.0.0.1 is in use.*--prefect-port"):
            serve.start(ep, repo=tmp_path, state_path=tmp_path / "serve.json")
    (tmp_path / "serve.json").write_text(json.dumps({"pid": os.getpid()}))
    with pytest.raises(ServeError, match="already running"):
        serve.start(
            Endpoints("127.0.0.1", serve.free_port(), serve.free_port()),
            repo=tmp_path,
            state_path=tmp_path / "serve.json",
        )


def test_procfile_runs_the_three_services_on_the_tools_own_settings():
    procfile = serve.procfile()
    assert list(procfile) == ["prefect", "mlflow", "deployment"]
    assert "prefect server start" in procfile["prefect"] and "mlflow/server.sh" in procfile["mlflow"]
    assert "flows.pipeline serve" in procfile["deployment"]
    env = serve.service_env(Endpoints("127.0.0.1", 4311, 5055), cron="0 3 * * *", overrides=["seed=1"])
    assert (env["PREFECT_SERVER_API_HOST"], env["PREFECT_SERVER_API_PORT"]) == ("127.0.0.1", "4311")
    assert env["PREFECT_UI_API_URL"] == env["PREFECT_API_URL"] == "http://127.0.0.1:4311/api"
    assert (env["STEPRL_MLFLOW_PORT"], env["MLFLOW_TRACKING_URI"]) == ("5055", "http://127.0.0.1:5055")
    assert (env["STEPRL_SCHEDULE_CRON"], env["STEPRL_OVERRIDES"]) == ("0 3 * * *", '["seed=1"]')


PREFECT_ONLY = textwrap.dedent("""
    import sys
    from pathlib import Path
    from flows.serve import Endpoints, become_subreaper, procfile, start
    tmp, port = Path(sys.argv[1]), int(sys.argv[2])
    ep = Endpoints("127.0.0.1", port, port + 1)
    become_subreaper()
    sys.exit(start(ep, processes={"prefect": procfile()["prefect"]}, ready={"prefect": ep.health["prefect"]},
                   repo=tmp, state_path=tmp / "serve.json", grace=10.0, timeout=180))
""")


def test_prefect_ui_calls_its_own_api_on_a_non_default_port(tmp_path):
    """`make serve PREFECT_PORT=...`: the UI's settings (what the page's JavaScript reads) point to
    the port it is served on, not to Prefect's default 4200."""
    (tmp_path / "sup.py").write_text(PREFECT_ONLY)
    port = serve.free_port()
    while not serve.port_free("127.0.0.1", port + 1):
        port = serve.free_port()
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
    assert serve.port_free("127.0.0.1", port)


@pytest.mark.parametrize(
    ("cron", "interval", "needle"),
    [
        ("0 3 * * *", 5.0, "not both"),
        (None, 0.0, "positive"),
        (None, -3.0, "positive"),
        ("every night", None, "not a valid cron"),
        ("61 * * * *", None, "not a valid cron"),
    ],
)
def test_bad_schedules_fail_before_anything_starts(cron, interval, needle):
    with pytest.raises(ServeError, match=needle):
        serve.check_schedule(cron, interval)
    args = ["start", "--prefect-port", "1", "--mlflow-port", "2"]
    args += (["--cron", cron] if cron else []) + (
        ["--interval", str(interval)] if interval is not None else []
    )
    assert serve.main(args) == 2  # ports 1 and 2 are never bound: the schedule is checked first


def test_good_schedules_pass():
    serve.check_schedule("0 3 * * *", None)
    serve.check_schedule(None, 3600.0)
    serve.check_schedule(None, None)


def test_clone_shares_the_repo_cache_and_keeps_its_local_config(tmp_path, monkeypatch):
    import flows._experiments as experiments

    monkeypatch.setattr(experiments, "_cache_dir", lambda repo: "/abs/cache")
    repo, clone, bare = tmp_path / "repo", tmp_path / "clone", tmp_path / "bare"
    for d in (repo, clone, bare):
        (d / ".dvc").mkdir(parents=True)
    (repo / ".dvc" / "config.local").write_text(
        "[cache]\n    type = symlink\n    dir = ../elsewhere\n[core]\n    remote = x\n"
    )
    experiments._share_cache(repo, clone)
    text = (clone / ".dvc" / "config.local").read_text()
    assert text.count("[cache]") == 1 and "dir = /abs/cache" in text and "elsewhere" not in text
    assert "type = symlink" in text and "remote = x" in text
    experiments._share_cache(tmp_path / "no-local-config", bare)
    assert (bare / ".dvc" / "config.local").read_text().split() == ["[cache]", "dir", "=", "/abs/cache"]
