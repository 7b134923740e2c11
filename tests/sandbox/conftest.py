"""A sandbox shared by the module's tests, and the checks every hostile call ends with."""

from __future__ import annotations

import psutil
import pytest

from components.sandbox import Sandbox, SandboxLimits
from components.sandbox.client import _UID_BASE

LIMITS = SandboxLimits(wall_s=4.0, cpu_s=1, memory_mb=256, output_bytes=4096, file_mb=1, threads=8)


def sandbox_processes(sandbox: Sandbox) -> list[psutil.Process]:
    """Processes the sandbox left: its server's children, and anything running as a sandbox uid."""
    left = psutil.Process(sandbox.server_pid).children(recursive=True)
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info["uids"]
        if uids is not None and uids.real >= _UID_BASE:
            left.append(proc)
    return left


@pytest.fixture
def leftovers():
    """:func:`sandbox_processes`, for a test that checks a sandbox of its own."""
    return sandbox_processes


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(LIMITS, workers=4) as box:
        yield box


@pytest.fixture
def run(sandbox):
    """Run code in the shared sandbox and check that the call left no process behind."""

    def _run(code: str):
        result = sandbox.run(code)
        assert sandbox_processes(sandbox) == []
        return result

    return _run


@pytest.fixture(scope="module")
def weaker():
    """A sandbox without the given protections (to show that a test fails without them)."""
    boxes: dict[tuple[str, ...], Sandbox] = {}

    def _weaker(*disable: str) -> Sandbox:
        if disable not in boxes:
            boxes[disable] = Sandbox(LIMITS, workers=2, allow_weaker=True, disable=disable)
            boxes[disable].start()
        return boxes[disable]

    yield _weaker
    for box in boxes.values():
        box.close()
