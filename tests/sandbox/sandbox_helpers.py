"""What the sandbox's tests share: their limits, and the processes a sandbox left."""

from __future__ import annotations

import threading
from collections.abc import Callable

import psutil

from components.sandbox import Sandbox, SandboxLimits

LIMITS = SandboxLimits(wall_s=4.0, cpu_s=1, memory_mb=256, output_bytes=4096, file_mb=1, threads=8)


def sandbox_processes(sandbox: Sandbox) -> list[psutil.Process]:
    """Processes the sandbox left: its zygote's children, and anything running as one of its uids."""
    left = psutil.Process(sandbox.zygote_pid).children(recursive=True)
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info["uids"]
        if uids is not None and uids.real in sandbox.uids:
            left.append(proc)
    return left


def run_beside(
    run: Callable[[str], object], hostile: list[str], innocent: int, factor: int
) -> tuple[list, list]:
    """Run the ``hostile`` snippets and ``innocent`` calls printing ``i * factor`` at once, each in a
    thread of its own; the results of each, in order."""
    codes = hostile + [f"print({i} * {factor})" for i in range(innocent)]
    results: dict[int, object] = {}

    def call(i: int) -> None:
        results[i] = run(codes[i])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(codes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ordered = [results[i] for i in range(len(codes))]
    return ordered[: len(hostile)], ordered[len(hostile) :]
