"""Random hostile snippets through the real ``python`` tool: crashes, processes left, files changed.

    python benchmarks/sandbox_fuzz.py [--snippets 3000] [--seed 0] [--concurrency 4]

Each snippet joins 1-3 random fragments (fork, exec, signals to the server / this process / pid 1,
sockets, reads and writes of host paths, allocation, CPU and thread loops, huge prints, raw
``ctypes`` syscalls with random numbers and arguments, rlimit changes, fd games, recursion, syntax
errors, random bytes; and variants of the classes of the 2026-12-01 attack: signals of any number
sent by the kernel, deep and unreadable trees, file floods, disk fills, System V IPC, inotify,
fanotify, memfd, fallocate, signal owners set through fcntl and ioctl, frame and heap walks, stderr
floods, odd exit statuses, site-packages imports, hard links and FIFOs) and goes through the ``python`` tool (its sandbox call and ``format_result``) with
``concurrency`` calls in flight. Prints: snippets, crashes (the tool raised, or the sandbox itself
failed: status ``sandbox``/``setup``; must be 0), server restarts (must be 0), processes left (the server's children and any
process of a sandbox uid, checked every 100 snippets and at the end), files changed outside the
scratch directories (a world-writable canary folder in /tmp, the repo's top level and
pyproject.toml, escape paths in /tmp and /: see ``snapshot``), the count of each status, and the wall time.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.sandbox import Sandbox, SandboxLimits  # noqa: E402
from components.tasks.code.tool import format_result  # noqa: E402


def fragments(rng: random.Random, trainer: int, server: int, canary: Path) -> str:
    pid = rng.choice([trainer, server, 1, 0, -1, os.getppid()])
    path = rng.choice(
        ["/etc/passwd", "/etc/shadow", str(ROOT / "pyproject.toml"), str(canary / "x"), "/tmp/fuzz-escape",
         "/proc/self/environ", f"/proc/{server}/mem", "/dev/sda", "/root/.bashrc", "../x", "/", str(ROOT)]
    )  # fmt: skip
    n, args = rng.randrange(0, 460), [rng.choice([0, 1, -1, 2**31, rng.randrange(2**16)]) for _ in range(3)]
    return rng.choice(
        [
            "import os\nwhile True:\n    os.fork()",
            "import os\nos.execv('/bin/sh', ['sh', '-c', 'id'])",
            "import subprocess\nprint(subprocess.run(['id'], capture_output=True))",
            f"import os, signal\nos.kill({pid}, signal.SIGKILL)",
            f"import os\nos.killpg({pid}, 9)",
            "import socket\ns = socket.create_connection(('127.0.0.1', 5000), timeout=1)",
            "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('/var/run/docker.sock')",
            f"print(open({path!r}).read(100))",
            f"open({path!r}, 'w').write('fuzz')",
            f"import os\nos.remove({path!r})",
            f"import os\nprint(os.listdir({path!r}))",
            "import os\nos.chdir('..')\nopen('escape', 'w').write('x')",
            f"x = bytearray({rng.choice([1 << 20, 1 << 28, 1 << 31, 1 << 40])})",
            "a = []\nwhile True:\n    a.append('x' * 10**6)",
            "while True:\n    pass",
            "import threading\ndef f():\n    while True:\n        pass\n[threading.Thread(target=f).start() for _ in range(50)]",
            "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)",
            "print('z' * 10**7)",
            f"import ctypes\nprint(ctypes.CDLL(None).syscall({n}, {args[0]}, {args[1]}, {args[2]}))",
            "import ctypes\nctypes.string_at(0)",
            "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
            "import os\nos.setsid()",
            "import os\nos.setuid(0)",
            "import os\nfor fd in range(64):\n    try:\n        os.write(fd, b'junk')\n    except OSError:\n        pass",
            "import os\nos.close(1)\nprint('gone')",
            "import os\nos._exit(7)",
            "import sys\nsys.exit('bye')",
            "def f():\n    return f()\nf()",
            "eval('(' * 10**5)",
            "import signal\nsignal.alarm(1)\nwhile True:\n    pass",
            "import mmap\nm = mmap.mmap(-1, 1 << 33)",
            "import sys\nsys.path.append('/usr/lib/python3/dist-packages')\nimport numpy",
            "import os\nprint(os.environ)",
            "raise KeyboardInterrupt",
            "def (:",
            "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(1, 80))),
            f"print({rng.randrange(10**6)} ** {rng.randrange(10**4)} % 97)",
            # the classes of the attack of 2026-12-01, and variants of them
            TIMER.replace("SIGNO", str(rng.choice([rng.randrange(1, 65), 9, 24, 34, 40, 64]))),
            f"import os\nfor _ in range({rng.choice([500, 1500, 3000])}):\n    os.mkdir('d')\n    os.chdir('d')",
            "import os\nos.makedirs('d/e/f')\nos.chmod('d/e', 0)\nos.chmod('d', 0)\nos.chmod('.', 0)",
            "import os\nos.symlink('/etc', 'l')\nos.symlink('l', 'm')\nos.mkdir('n')\nos.chmod('n', 0o1000)",
            "import os\nfor i in range(5000):\n    open(f'f{i}', 'w').close()",
            f"for i in range(200):\n    open(f'f{{i}}', 'wb').write(b'x' * {rng.choice([1 << 16, 1 << 20, 1 << 24])})",
            LIBC + f"print(libc.shmget({rng.choice([0, 0x5EC0, rng.randrange(2**31)])}, 1 << 26, 0o1666))",
            LIBC
            + "print(libc.msgget(0, 0o1666), libc.semget(0, 8, 0o1666), libc.mq_open(b'/q', 0o100, 0o666, None))",
            LIBC + "fd = libc.inotify_init()\nprint(fd, libc.inotify_add_watch(fd, b'/tmp', 0xfff))",
            LIBC + "print(libc.fanotify_init(0, 0), libc.memfd_create(b'm', 0))",
            "import os\nfd = os.memfd_create('m')\nfor _ in range(64):\n    os.write(fd, b'x' * (1 << 24))",
            LIBC
            + "import os\nfd = os.open('f', os.O_CREAT | os.O_WRONLY)\nprint(libc.fallocate(fd, 1, 0, 1 << 32))",
            f"import fcntl, os\nr, w = os.pipe()\nfcntl.fcntl(r, fcntl.F_SETOWN, {pid})\nfcntl.fcntl(r, 10, 9)\n"
            "fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC)\nos.write(w, b'x')",
            LIBC
            + f"import os\nr, w = os.pipe()\nprint(libc.syscall(72, r, ctypes.c_long((1 << 32) | 8), {pid}))",
            LIBC + f"print(libc.ioctl(0, 0x8901, ctypes.byref(ctypes.c_int({pid}))))",
            "import sys\nf = sys._getframe()\nwhile f.f_back:\n    f = f.f_back\nprint(sorted(f.f_globals)[:20], list(f.f_locals)[:20])",
            "import gc\nprint(sorted({type(o).__name__ for o in gc.get_objects()})[:50])",
            f"import sys\nsys.stderr.write('e' * {rng.choice([3000, 5000, 10**6])})\nprint('x' * 3990)\n1/0",
            f"import sys\nsys.exit({rng.choice([0, 1, 2, 124, 125, 126, 255, 256, -1])})",
            "raise SystemExit(object())",
            "import sys\nsys.path.append('/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages')\nimport numpy",
            "import os\nos.link('/etc/passwd', 'p')",
            "import os\nos.mkfifo('f')\nopen('f').read()",
        ]
    )


# A call that has the kernel send it signal SIGNO (a POSIX timer), then waits for it.
TIMER = """import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
class E(ctypes.Structure):
    _fields_ = [("v", ctypes.c_void_p), ("s", ctypes.c_int), ("n", ctypes.c_int), ("p", ctypes.c_byte * 48)]
class T(ctypes.Structure):
    _fields_ = [("i", ctypes.c_long * 2), ("v", ctypes.c_long * 2)]
t = ctypes.c_void_p()
libc.timer_create(0, ctypes.byref(E(None, SIGNO, 0)), ctypes.byref(t))
libc.timer_settime(t, 0, ctypes.byref(T((0, 0), (0, 1000000))), None)
time.sleep(0.5)"""
LIBC = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def snapshot(canary: Path) -> dict[str, tuple[int, int] | bool]:
    """What a snippet could change outside its scratch directory: every file of the canary folder
    (size, mtime), the repo's top-level names and its pyproject.toml (the repo itself may be edited
    while the fuzz runs), and the escape paths the snippets write in /tmp."""
    out: dict[str, tuple[int, int] | bool] = {}
    for dirpath, dirnames, filenames in os.walk(canary):
        for name in [*filenames, *dirnames]:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.join(dirpath, name)] = (st.st_size, st.st_mtime_ns)
    for name in os.listdir(ROOT):
        out[str(ROOT / name)] = True
    st = os.stat(ROOT / "pyproject.toml")
    out[str(ROOT / "pyproject.toml")] = (st.st_size, st.st_mtime_ns)
    for path in ("/tmp/fuzz-escape", "/tmp/escape", "/escape"):
        out[path] = os.path.exists(path)
    return out


def left_processes(box: Sandbox) -> list[psutil.Process]:
    """The zygote's children and every process of the sandbox's uids (none between calls)."""
    left = psutil.Process(box.zygote_pid).children(recursive=True)
    left += [psutil.Process(pid) for pid in box.leftover_processes() if psutil.pid_exists(pid)]
    return left


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--snippets", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    canary = Path(tempfile.mkdtemp(prefix="steprl-fuzz-canary-"))
    canary.chmod(0o777)
    (canary / "x").write_text("canary")
    before = snapshot(canary)
    limits = SandboxLimits(wall_s=1.0, cpu_s=1, memory_mb=256, output_bytes=4096)
    print(f"cpus {os.cpu_count()}, load average before {os.getloadavg()}")
    statuses: collections.Counter[str] = collections.Counter()
    crashes, leaks = [], 0
    start = time.perf_counter()
    # Every protection or none of this: the snippets signal pid -1 (every process the caller may signal),
    # the trainer and its shell, which only seccomp and the uid switch stop. Never allow_weaker here.
    with Sandbox(limits, workers=args.concurrency) as box:
        print("protections:", {k: v is None for k, v in box.probe.items()})
        snippets = [
            "\n".join(fragments(rng, os.getpid(), box.server_pid, canary) for _ in range(rng.randint(1, 3)))
            for _ in range(args.snippets)
        ]

        server, restarts = box.server_pid, 0

        def one(code: str) -> None:
            try:  # what PythonTool.execute does, keeping the status
                result = box.run(code)
                text = format_result(result, box).text
            except Exception as err:
                crashes.append(f"{type(err).__name__}: {err}")
                return
            statuses[result.status] += 1
            if result.status in ("sandbox", "setup") or not text:
                crashes.append(f"{result.status}: {result.stderr[:200]}")

        with ThreadPoolExecutor(args.concurrency) as pool:
            for i in range(0, len(snippets), 100):
                list(pool.map(one, snippets[i : i + 100]))
                if box.server_pid != server:
                    print(f"after {i + 100}: the server was restarted")
                    restarts, server = restarts + 1, box.server_pid
                left = left_processes(box)
                leaks += len(left)
                if left:
                    print(f"after {i + 100}: processes left {left}")
    elapsed = time.perf_counter() - start
    after = snapshot(canary)
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    shutil.rmtree(canary)
    print(f"snippets {args.snippets}, crashes {len(crashes)}, server restarts {restarts}, processes left {leaks}, "
          f"files changed outside scratch {len(changed)}, wall {elapsed:.0f} s")  # fmt: skip
    print("statuses:", dict(statuses.most_common()))
    for line in crashes[:10] + changed[:10]:
        print("  ", line)
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
