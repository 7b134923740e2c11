"""A sandbox shared by the module's tests, and the checks every hostile call ends with."""

from __future__ import annotations

import pytest
from sandbox_helpers import LIMITS, sandbox_processes

from components.sandbox import Sandbox


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
