"""Per-call latency of the sandbox against a fresh ``python -I -S`` process per call, in the same run.

    python benchmarks/sandbox_latency.py [--calls 200] [--concurrency 1,4,16]

A trivial script (``print(1)``) through :class:`components.sandbox.Sandbox` (the warm server, every
protection the machine grants), through ``subprocess.run([python, "-I", "-S", "-c", script])`` (the
cheapest unconfined interpreter per call), and the floor of any fork-per-call design: this process
forking a child that exits at once (on a loaded machine mostly the scheduler's delay). Prints, for
each, the median and p99 of one call at a time (for the sandbox also the time the server measured,
from the call's start to its answer, without the pipes to and from the client); and, for the sandbox and the fresh interpreter, calls
per second with N calls in flight from a thread pool (the sandbox's ``workers`` set to N). Also the
load average before and after: shared machines are noisy, so compare the rows of one run, not runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.sandbox import Sandbox, SandboxLimits

SCRIPT = "print(1)"


def fresh_python() -> None:
    out = subprocess.run([sys.executable, "-I", "-S", "-c", SCRIPT], capture_output=True, text=True, env={})
    assert out.stdout == "1\n", out


def bare_fork() -> None:
    """The floor: this process forks a child that exits at once, and waits for it."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def timed(call, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def throughput(call, n: int, concurrency: int) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda _: call(), range(n)))
    return n / (time.perf_counter() - start)


def p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--concurrency", default="1,4,16")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    print(f"cpus {os.cpu_count()}, load average before {os.getloadavg()}")
    rows = {}
    for level in levels:
        with Sandbox(SandboxLimits(), workers=level) as box:
            if level == levels[0]:
                print("protections:", {k: v is None for k, v in box.probe.items()})

            served: list[float] = []

            def sandboxed(box=box, served=served) -> None:
                r = box.run(SCRIPT)
                assert r.stdout == "1\n", r
                served.append(r.wall_s)

            if level == 1:
                timed(sandboxed, 10)  # warm-up
                rows["sandbox"] = timed(sandboxed, args.calls)
                rows["in the server"] = served[-args.calls :]
                rows["python -I -S"] = timed(fresh_python, args.calls)
                rows["bare fork"] = timed(bare_fork, args.calls)
            rows[f"sandbox c={level}"] = throughput(sandboxed, args.calls, level)
            rows[f"python -I -S c={level}"] = throughput(fresh_python, args.calls, level)
    for name in ("sandbox", "in the server", "python -I -S", "bare fork"):
        if name in rows:
            xs = rows[name]
            print(f"{name:14s} median {statistics.median(xs) * 1e3:6.1f} ms   p99 {p99(xs) * 1e3:6.1f} ms")
    for level in levels:
        print(
            f"concurrency {level:2d}: sandbox {rows[f'sandbox c={level}']:6.1f} calls/s, "
            f"python -I -S {rows[f'python -I -S c={level}']:6.1f} calls/s"
        )
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
