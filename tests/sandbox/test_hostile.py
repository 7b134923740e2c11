"""Hostile code in the sandbox: each snippet fails with a clear error, leaves no process behind
(the ``run`` fixture checks with psutil) and changes nothing outside its scratch directory. Where a
single protection stops a snippet, the same snippet is run once without it (``weaker``) to show
that the test can fail."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest
from sandbox_helpers import run_beside

from components.sandbox import Sandbox, SandboxUnavailable

REPO = Path(__file__).resolve().parents[2]


def test_fork_bomb_is_refused(run, weaker):
    r = run("import os\nwhile True:\n    os.fork()")
    assert r.status == "error" and r.last_error_line.startswith("PermissionError")
    # without seccomp, a fork succeeds (RLIMIT_NPROC of the call's own uid bounds the bomb)
    assert weaker("seccomp").run("import os\nif os.fork():\n    print('forked')").stdout == "forked\n"


def test_fork_bomb_without_seccomp_is_bounded_and_cleaned_up(weaker, leftovers):
    box = weaker("seccomp")
    r = box.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    assert r.status in ("cpu_time", "wall_time")
    assert leftovers(box) == []


@pytest.mark.parametrize(
    "code", ["x = bytearray(1 << 30)", "a = []\nwhile True:\n    a.append(bytearray(10**7))"]
)
def test_memory_hog_gets_memory_error(run, code):
    r = run(code)
    assert r.status == "error" and r.last_error_line.startswith("MemoryError")


def test_infinite_loop_is_stopped(run):
    r = run("while True:\n    pass")
    assert r.status in ("cpu_time", "wall_time")


def test_busy_threads_are_stopped(run):
    code = (
        "import threading\n"
        "def spin():\n    while True:\n        pass\n"
        "ts = [threading.Thread(target=spin) for _ in range(4)]\n"
        "[t.start() for t in ts]\n[t.join() for t in ts]"
    )
    assert run(code).status in ("cpu_time", "wall_time")


def test_too_many_threads_are_refused(run):
    code = "import threading, time\nfor _ in range(100):\n    threading.Thread(target=time.sleep, args=(5,)).start()"
    r = run(code)
    assert r.status == "error" and "can't start new thread" in r.last_error_line


def test_one_gigabyte_print_is_cut(run):
    r = run("import sys\nfor _ in range(10**6):\n    sys.stdout.write('x' * 1000)")
    assert r.status == "output" and len(r.stdout) + len(r.stderr) <= 4096 and r.output_bytes > 4096


@pytest.mark.parametrize("path", ["/etc/passwd", str(REPO / "pyproject.toml"), "/proc/1/environ"])
def test_host_files_cannot_be_read(run, weaker, path):
    r = run(f"print(open({path!r}).read()[:50])")
    assert r.status == "error" and r.last_error_line.startswith("PermissionError"), r
    if path == "/etc/passwd":  # world-readable: only Landlock stops it
        assert weaker("landlock").run(f"print(open({path!r}).read()[:4])").status == "ok"


def test_repo_cannot_be_listed(run):
    r = run(f"import os\nprint(os.listdir({str(REPO)!r}))")
    assert r.status == "error" and r.last_error_line.startswith("PermissionError")


def test_writes_outside_scratch_fail_and_scratch_is_emptied(run, weaker):
    shared = Path(tempfile.mkdtemp(prefix="steprl-sandbox-test-"))
    shared.chmod(0o777)  # writable by any uid: only Landlock keeps the call out
    target = shared / "escaped.txt"
    try:
        for where in (target, REPO / "escaped.txt"):
            r = run(f"open({str(where)!r}, 'w').write('x')")
            assert r.status == "error" and r.last_error_line.startswith("PermissionError")
            assert not where.exists()
        assert weaker("landlock").run(f"open({str(target)!r}, 'w').write('x')").status == "ok"
    finally:
        shutil.rmtree(shared)
    # scratch: writable, and empty again at the next call
    assert (
        run("open('left.txt', 'w').write('x')\nimport os\nprint(os.listdir('.'))").stdout == "['left.txt']\n"
    )
    assert run("import os\nprint(os.listdir('.'))").stdout == "[]\n"


def test_a_file_bigger_than_the_limit_fails(run):
    r = run("open('big', 'wb').write(b'x' * (2 << 20))")
    assert r.status == "error" and "File too large" in r.last_error_line


def test_socket_to_a_local_listener_fails(run, weaker):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    code = (
        f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')"
    )
    try:
        r = run(code)
        assert r.status == "error" and "connected" not in r.stdout
        with pytest.raises(BlockingIOError):
            listener.accept()
        # seccomp alone refuses the socket; without it the empty network namespace still cannot reach
        # the host's loopback, and without that Landlock refuses TCP connections (ABI 4+); without the
        # three, the connection is made
        assert weaker("seccomp").run(code).status == "error"
        assert weaker("seccomp", "network_namespace").run(code).status == "error"
        assert weaker("seccomp", "network_namespace", "landlock").run(code).stdout == "connected\n"
    finally:
        listener.close()


def test_signals_to_the_server_and_the_trainer_are_refused(run, sandbox, weaker):
    for pid in (sandbox.server_pid, os.getpid()):
        r = run(f"import os, signal\nos.kill({pid}, signal.SIGKILL)")
        assert r.status == "error" and r.last_error_line.startswith("PermissionError")
    assert run("print('still serving')").stdout == "still serving\n"
    # each of seccomp and the uid switch stops it alone (signal 0: a probe that delivers nothing)
    for missing in ("seccomp", "uid_switch"):
        r = weaker(missing).run(f"import os\nos.kill({os.getpid()}, 0)\nprint('reached')")
        assert r.status == "error" and r.last_error_line.startswith("PermissionError")


def test_no_sandbox_starts_without_both_seccomp_and_the_uid_switch():
    """Without both, os.kill(-1, ...) would reach every process of this user: refused even when a
    weaker sandbox is accepted."""
    with pytest.raises(SandboxUnavailable, match="neither seccomp nor a uid switch"):
        Sandbox(allow_weaker=True, disable=("seccomp", "uid_switch")).start()


def test_raw_syscalls_through_ctypes_are_refused(run):
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"print(libc.syscall(57), libc.syscall(62, {os.getpid()}, 9), libc.syscall(41, 2, 1, 0), ctypes.get_errno())"
    )  # fork, kill, socket
    r = run(code)
    assert r.status == "ok" and r.stdout == "-1 -1 -1 1\n"


def test_a_segfault_through_ctypes_kills_only_its_call(run):
    r = run("import ctypes\nctypes.string_at(0)")
    assert r.status == "killed" and r.signal == "SIGSEGV"
    assert run("print(2)").stdout == "2\n"


@pytest.mark.parametrize(
    "code",
    [
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)",
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (1, 1))",
    ],
)
def test_rlimits_cannot_be_changed(run, code):
    r = run(code)
    assert r.status == "error" and r.last_error_line.split(":")[0] in ("ValueError", "PermissionError")


def test_importing_something_huge_fails(run):
    site = next(p for p in sys.path if p.endswith("site-packages"))
    r = run(f"import sys\nsys.path.append({site!r})\nimport torch")
    assert r.status == "error" and r.last_error_line.split(":")[0] in (
        "ModuleNotFoundError",
        "PermissionError",
    )


def test_other_calls_go_on_beside_hostile_ones(sandbox: Sandbox):
    hostile = [
        "while True:\n    pass",
        "x = bytearray(1 << 30)",
        "import os\nos.fork()",
        "import ctypes\nctypes.string_at(0)",
    ]
    attacked, innocent = run_beside(sandbox.run, hostile, 8, 7)
    assert [r.stdout for r in innocent] == [f"{i * 7}\n" for i in range(8)]
    assert all(r.status != "ok" for r in attacked)


def test_the_trainer_survives_a_killed_server(weaker):
    box = weaker("landlock")  # a sandbox of its own, so the shared one stays up
    pid, scratch = box.server_pid, box.scratch_root
    running = box.submit("import time\ntime.sleep(20)")
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    r = running.result(timeout=20)  # failed at once, not sent again
    assert r.status == "sandbox" and r.wall_s == 0.0
    assert box.run("print(3)").stdout == "3\n"  # started again
    assert box.server_pid != pid
    assert not os.path.exists(scratch)  # the killed server's scratch directories were removed
