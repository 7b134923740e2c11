"""The classes of an independent attack on the sandbox (a fresh clone, root, every protection), each a
test that failed on the server that forked calls itself: the server cannot be crashed from inside a
call, one call cannot read or disturb another (in this sandbox or in another one on the machine), the
limits bind (memfd pages, disk, the import path), and the tool says what happened."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest
from sandbox_helpers import LIMITS, run_beside, sandbox_processes

from components.sandbox import Sandbox, SandboxLimits
from components.sandbox.scratch import empty_dir
from components.sandbox.server import call_status, signal_name
from components.tasks.code.tool import format_result

# A snippet that has the kernel send it signal SIGNO (a POSIX timer: no kill syscall, which seccomp
# refuses), then waits for it.
TIMER_SIGNAL = """
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
class SigEvent(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("pad", ctypes.c_byte * 48)]
class ITimerSpec(ctypes.Structure):
    _fields_ = [("interval", ctypes.c_long * 2), ("value", ctypes.c_long * 2)]
tid = ctypes.c_void_p()
assert libc.timer_create(0, ctypes.byref(SigEvent(None, SIGNO, 0)), ctypes.byref(tid)) == 0
libc.timer_settime(tid, 0, ctypes.byref(ITimerSpec((0, 0), (0, 10_000_000))), None)
time.sleep(2)
print("survived")
"""
LIBC = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
# Deeper than a recursive removal can go (shutil.rmtree of Python 3.11 raises RecursionError there).
DEPTH = 1200


def _result(box: Sandbox, code: str, timeout: float = 60):
    """Run ``code``; a call that never returns fails the test instead of hanging it."""
    return box.submit(code).result(timeout=timeout)


# --- the server goes down from inside a call -------------------------------------------------------


@pytest.mark.parametrize("signo", [40, signal.SIGRTMAX, signal.SIGKILL])
def test_a_call_killed_by_any_signal_number_leaves_the_server_up(sandbox, signo):
    pid = sandbox.server_pid
    r = _result(sandbox, TIMER_SIGNAL.replace("SIGNO", str(int(signo))))
    assert r.status == "killed" and "survived" not in r.stdout
    assert r.signal == signal_name(int(signo))
    assert _result(sandbox, "print(5)").stdout == "5\n" and sandbox.server_pid == pid


def test_signal_names_never_raise():
    assert signal_name(11) == "SIGSEGV"
    assert signal_name(signal.SIGRTMIN + 6) == "SIGRTMIN+6"
    assert signal_name(70) == "signal 70"
    assert signal_name(0) == "signal 0"


@pytest.mark.parametrize("tmpfs", [True, False], ids=["tmpfs", "host-dir"])
def test_a_deep_tree_in_scratch_is_removed_and_the_server_goes_on(sandbox, weaker, tmpfs):
    box = sandbox if tmpfs else weaker("scratch_tmpfs")
    pid = box.server_pid
    deep = f"import os\nfor _ in range({DEPTH}):\n    os.mkdir('d')\n    os.chdir('d')\nprint('deep')"
    assert _result(box, deep).stdout == "deep\n"
    for _ in range(box.workers):  # every slot is empty again
        assert _result(box, "import os\nprint(os.listdir('.'))").stdout == "[]\n"
    assert box.server_pid == pid


def test_unreadable_directories_are_removed_by_their_owner(tmp_path):
    """Without the uid switch the server is not root: a directory a call made unreadable must still be
    emptied. Checked here as an unprivileged user (the scratch reset's own code)."""
    nobody = 65534
    tree = Path(tempfile.mkdtemp(prefix="steprl-scratch-test-"))
    os.chown(tree, nobody, nobody)
    pid = os.fork()
    if pid == 0:  # an unprivileged process builds the tree and empties it
        try:
            os.setresgid(nobody, nobody, nobody)
            os.setresuid(nobody, nobody, nobody)
            os.makedirs(tree / "d" / "e" / "f")
            (tree / "d" / "e" / "f" / "x").write_text("x")
            os.chmod(tree / "d" / "e", 0)
            os.chmod(tree / "d", 0)
            os.symlink("/etc", tree / "link")
            os.mkfifo(tree / "fifo")
            empty_dir(str(tree))
            os._exit(0 if os.listdir(tree) == [] else 3)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    try:
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.path.isdir("/etc")  # the symlink was removed, not followed
    finally:
        subprocess.run(["rm", "-rf", str(tree)], check=False)


def test_a_dead_server_fails_its_calls_at_once_and_is_cleaned_up():
    """The server killed while a call runs, with a tree in scratch too deep for a recursive rmtree:
    the call fails with ``sandbox`` (and is not sent again), no process of the sandbox is left, its
    scratch is removed, and the next call gets a new server."""
    limits = SandboxLimits(wall_s=30.0, cpu_s=5, memory_mb=256, output_bytes=4096, file_mb=1, threads=8)
    box = Sandbox(limits, workers=2, allow_weaker=True, disable=("scratch_tmpfs",))
    try:
        box.start()
        pid, scratch, uids = box.server_pid, box.scratch_root, box.uids
        code = f"import os, time\nfor _ in range({DEPTH}):\n    os.mkdir('d')\n    os.chdir('d')\nprint('x', flush=True)\ntime.sleep(30)"
        future = box.submit(code)
        deadline = time.monotonic() + 20
        while not _deepest(scratch) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        r = future.result(timeout=20)
        assert r.status == "sandbox" and "exited" in r.stderr
        deadline = time.monotonic() + 20
        while (os.path.exists(scratch) or _processes(uids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists(scratch) and _processes(uids) == []
        assert _result(box, "print(8)").stdout == "8\n" and box.server_pid != pid
    finally:
        box.close()


def _deepest(scratch: str) -> bool:
    """Whether a slot of ``scratch`` holds a tree ``DEPTH`` levels deep (walked without recursion)."""
    for slot in Path(scratch).glob("slot*"):
        depth, path = 0, str(slot)
        while os.path.isdir(os.path.join(path, "d")):
            path, depth = os.path.join(path, "d"), depth + 1
        if depth >= DEPTH:
            return True
    return False


def _processes(uids: range) -> list[int]:
    from components.sandbox.confine import processes_of

    return processes_of(uids)


# --- one call reads or disturbs another ------------------------------------------------------------


def test_a_call_finds_nothing_of_the_server_or_a_running_call(sandbox):
    """A running call's output is held by the server; the child of the next call is forked from the
    zygote, so neither its frames nor anything reachable from them hold it."""
    secret = "s3cr3t-" + os.urandom(6).hex()
    other = sandbox.submit(f"print({secret!r}, flush=True)\nimport time\ntime.sleep(1.5)")
    time.sleep(0.5)  # the server has read the secret from the running call's stdout
    scan = (
        "import gc, sys\n"
        "seen, todo, found, kinds = set(), [], [], set()\n"
        "f = sys._getframe()\n"
        "while f is not None:\n    todo.append(f)\n    f = f.f_back\n"
        "todo += gc.get_objects() + list(sys.modules.values())\n"
        "while todo and len(seen) < 500000:\n"
        "    o = todo.pop()\n"
        "    if id(o) in seen:\n        continue\n"
        "    seen.add(id(o))\n"
        "    kinds.add(type(o).__name__)\n"
        "    if isinstance(o, (str, bytes, bytearray)):\n"
        "        if SECRET in (o if isinstance(o, str) else o.decode('latin-1')):\n            found.append(type(o).__name__)\n"
        "        continue\n"
        "    todo.extend(gc.get_referents(o))\n"
        "import json\nprint(json.dumps([len(seen), found, sorted(kinds & {'Server', '_Call'})]))\n"
    ).replace("SECRET", repr(secret[::-1]) + "[::-1]")  # the scan's own code does not hold the secret
    r = _result(sandbox, scan)
    assert other.result(timeout=30).stdout == secret + "\n"
    assert r.status == "ok", r
    seen, found, kinds = json.loads(r.stdout)
    assert seen > 1000 and found == [] and kinds == []


@pytest.mark.parametrize(
    "call",
    [
        "libc.inotify_init()",
        "libc.inotify_init1(0)",
        "libc.fanotify_init(0, 0)",
        "libc.shmget(0, 64 << 20, 0o1666)",
        "libc.msgget(0, 0o1666)",
        "libc.semget(0, 4, 0o1666)",
        "libc.memfd_create(b'x', 0)",
    ],
)
def test_watching_files_sysv_ipc_and_memfd_are_refused(run, call):
    r = run(LIBC + f"print({call}, ctypes.get_errno())")
    assert r.stdout == "-1 1\n", r  # EPERM


def test_sysv_ipc_without_seccomp_stays_in_the_servers_namespace(weaker):
    """Without seccomp a segment can be made, but in the server's own IPC namespace: the host's table
    does not list it, and it is gone with the server."""
    key = 0x5EC0 + os.getpid() % 1000
    r = weaker("seccomp").run(LIBC + f"print(libc.shmget({key}, 1 << 20, 0o1666) >= 0)")
    assert r.stdout == "True\n", r
    assert f"{key:d}" not in [
        line.split()[0] for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    ]


@pytest.mark.parametrize("cmd", ["F_SETOWN", "F_SETSIG", "F_SETOWN_EX"])
def test_a_signal_owner_cannot_be_set(run, cmd):
    number = {"F_SETOWN": 8, "F_SETSIG": 10, "F_SETOWN_EX": 15}[cmd]
    r = run(f"import fcntl, os\nr, w = os.pipe()\nfcntl.fcntl(r, {number}, 1)")
    assert r.status == "error" and r.last_error_line.startswith("PermissionError"), r
    # the kernel reads the command as 32 bits: a high bit set does not get past the filter
    r = run(
        LIBC
        + f"import os\nr, w = os.pipe()\nprint(libc.syscall(72, r, ctypes.c_long((1 << 32) | {number}), 1), ctypes.get_errno())"
    )
    assert r.stdout == "-1 1\n"


def test_two_sandboxes_hold_disjoint_uid_ranges(sandbox):
    with Sandbox(LIMITS, workers=2) as other:
        assert set(other.uids).isdisjoint(sandbox.uids)
        code = "import os\nprint(os.getuid())"
        assert int(_result(other, code).stdout) in other.uids
        assert int(_result(sandbox, code).stdout) in sandbox.uids


def test_one_sandboxs_threads_do_not_starve_anothers(sandbox):
    """RLIMIT_NPROC counts the processes and threads of a uid: with a range per sandbox, a call using
    all its threads leaves another sandbox's call its own."""
    with Sandbox(LIMITS, workers=sandbox.workers) as other:
        hog = (
            "import threading, time\n"
            "ts = [threading.Thread(target=time.sleep, args=(2,)) for _ in range(4)]\n"
            "[t.start() for t in ts]\nprint('holding', flush=True)\n[t.join() for t in ts]"
        )
        held = sandbox.submit(hog)
        time.sleep(0.7)
        three = "import threading, time\nts = [threading.Thread(target=time.sleep, args=(0.3,)) for _ in range(3)]\n[t.start() for t in ts]"
        r = _result(other, three)
        assert held.result(timeout=30).status == "ok"
        assert r.status == "ok", r


def test_a_signal_sent_through_the_kernel_cannot_reach_another_sandbox(weaker):
    """Without seccomp, F_SETOWN + F_SETSIG(SIGKILL) + O_ASYNC would have the kernel kill a call of
    another sandbox (there is no kill syscall to refuse): the uid ranges differ and Landlock scopes
    signals, so the victim runs to its end."""
    with Sandbox(LIMITS, workers=2) as victim_box:
        victim = victim_box.submit(
            "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(1.5)\nprint('alive')"
        )
        deadline = time.monotonic() + 10
        pids = _processes(victim_box.uids)
        while not pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = _processes(victim_box.uids)
        attack = (
            "import fcntl, os\nr, w = os.pipe()\n"
            f"fcntl.fcntl(r, fcntl.F_SETOWN, {pids[0]})\nfcntl.fcntl(r, 10, 9)\n"
            "fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK)\nos.write(w, b'x')\nprint('sent')"
        )
        weaker("seccomp").run(attack)
        assert victim.result(timeout=30).stdout.endswith("alive\n")


# --- limits that bind ------------------------------------------------------------------------------


def test_scratch_has_a_disk_total():
    limits = SandboxLimits(wall_s=4.0, cpu_s=2, memory_mb=256, output_bytes=4096, file_mb=1, disk_mb=4)
    with Sandbox(limits, workers=1) as box:
        r = box.run("for i in range(8):\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20))\n")
        assert r.status == "error" and "[Errno 28]" in r.last_error_line, r
        assert "disk limit 4 MB" in format_result(r, box).text
        assert box.run("import os\nprint(os.listdir('.'))").stdout == "[]\n"


def test_fallocate_past_the_file_limit_is_refused(run):
    code = (
        LIBC
        + "import os\nfd = os.open('f', os.O_CREAT | os.O_WRONLY)\nprint(libc.fallocate(fd, 1, 0, 1 << 30), ctypes.get_errno())"
    )
    assert run(code).stdout == "-1 1\n"
    r = run("import os\nfd = os.open('f', os.O_CREAT | os.O_WRONLY)\nos.posix_fallocate(fd, 0, 1 << 30)")
    assert r.status == "error" and "Errno" in r.last_error_line


def test_the_base_interpreters_site_packages_cannot_be_imported(run):
    """On a layout where site-packages lies inside the standard library's directory (pyenv, a source
    build), it is not readable for all that."""
    site = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})["purelib"]
    if not os.path.isdir(site) or not os.listdir(site):
        pytest.skip(f"{site} is empty here")
    mods = [n for n in ("numpy", "boto3", "pip", "setuptools") if os.path.isdir(os.path.join(site, n))]
    if not mods:
        pytest.skip(f"no known package in {site}")
    r = run(f"import sys\nsys.path.append({site!r})\nimport {mods[0]}")
    assert r.status == "error" and r.last_error_line.split(":")[0] in (
        "PermissionError",
        "ModuleNotFoundError",
    ), r


# --- what the tool tells the model -----------------------------------------------------------------


def test_the_traceback_line_comes_back_after_a_long_print(run, sandbox):
    r = run("print('x' * 3990)\n1 / 0")
    assert r.status == "error" and r.stdout == "x" * 3990 + "\n"
    assert r.last_error_line == "ZeroDivisionError: division by zero"
    assert format_result(r, sandbox).text.endswith("ZeroDivisionError: division by zero")


def test_a_huge_exception_message_keeps_its_last_line(run):
    r = run("raise ValueError('v' * 20000)")
    assert r.status == "error" and r.last_error_line.startswith("ValueError: vvv")


def test_exit_statuses_are_the_programs_own(run, sandbox):
    r = run("import sys\nsys.exit(125)")
    assert r.status == "error" and r.exit_code == 125
    assert format_result(r, sandbox).text == "the program exited with status 125"
    r = run("raise SystemExit('bad input')")
    assert r.status == "error" and r.exit_code == 1 and r.last_error_line == "bad input"
    assert format_result(r, sandbox).text == "bad input"


def test_a_self_inflicted_sigkill_is_not_the_cpu_limit(run, sandbox):
    r = run(TIMER_SIGNAL.replace("SIGNO", "9"))
    assert r.status == "killed" and r.signal == "SIGKILL"
    assert format_result(r, sandbox).text.endswith("killed by SIGKILL")
    r = run("while True:\n    pass")
    assert r.status == "cpu_time" and r.cpu_s >= 0.5 * LIMITS.cpu_s


@pytest.mark.parametrize(
    ("stopped", "exit_code", "ready", "cpu_s", "status"),
    [
        (None, 0, True, 0.0, "ok"),
        (None, 3, True, 0.0, "error"),
        (None, 125, True, 0.0, "error"),
        (None, 125, False, 0.0, "setup"),
        (None, -signal.SIGXCPU, True, 1.0, "cpu_time"),
        (None, -signal.SIGXCPU, True, 0.81, "cpu_time"),
        (None, -signal.SIGKILL, True, 2.0, "cpu_time"),
        (None, -signal.SIGKILL, True, 0.1, "killed"),
        (None, -signal.SIGXCPU, True, 0.1, "killed"),
        (None, -40, True, 0.0, "killed"),
        ("wall", -signal.SIGKILL, True, 0.0, "wall_time"),
        ("output", -signal.SIGKILL, True, 0.0, "output"),
        (None, None, True, 0.0, "sandbox"),
    ],
)
def test_each_status_says_what_happened(stopped, exit_code, ready, cpu_s, status):
    if exit_code is None:
        wait = None
    elif exit_code >= 0:
        wait = exit_code << 8
    else:
        wait = -exit_code
    assert call_status(stopped, wait, ready, cpu_s, cpu_limit=1) == status


def test_calls_beside_an_attack_are_unharmed(sandbox):
    """Innocent calls run beside each class above: each answers once, with its own output."""
    attacks = [TIMER_SIGNAL.replace("SIGNO", "40"), LIBC + "libc.shmget(0, 1 << 20, 0o1666)",
               "import os\nfor _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')"]  # fmt: skip
    _, innocent = run_beside(lambda code: _result(sandbox, code), attacks, 6, 3)
    assert [r.stdout for r in innocent] == [f"{i * 3}\n" for i in range(6)]
    assert sandbox_processes(sandbox) == []
