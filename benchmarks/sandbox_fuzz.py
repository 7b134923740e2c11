"""Random hostile snippets through the real ``python`` tool: crashes, processes left, files changed.

    python benchmarks/sandbox_fuzz.py [--snippets 3000] [--seed 0] [--concurrency 4]

Each snippet joins 1-3 random fragments (fork, exec, signals to the server / this process / pid 1,
sockets, reads and writes of host paths, allocation, CPU and thread loops, huge prints, raw
``ctypes`` syscalls with random numbers and arguments, rlimit changes, fd games, recursion, syntax
errors, random bytes) and goes through the ``python`` tool (its sandbox call and ``format_result``) with
``concurrency`` calls in flight. Prints: snippets, crashes (the tool raised, or the sandbox itself
failed: status ``sandbox``/``setup``; must be 0), processes left (the server's children and any
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
from components.sandbox.client import _UID_BASE  # noqa: E402
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
        ]
    )


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
    left = psutil.Process(box.server_pid).children(recursive=True)
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info["uids"]
        if uids is not None and uids.real >= _UID_BASE:
            left.append(proc)
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
                left = left_processes(box)
                leaks += len(left)
                if left:
                    print(f"after {i + 100}: processes left {left}")
    elapsed = time.perf_counter() - start
    after = snapshot(canary)
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    shutil.rmtree(canary)
    print(f"snippets {args.snippets}, crashes {len(crashes)}, processes left {leaks}, "
          f"files changed outside scratch {len(changed)}, wall {elapsed:.0f} s")  # fmt: skip
    print("statuses:", dict(statuses.most_common()))
    for line in crashes[:10] + changed[:10]:
        print("  ", line)
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
