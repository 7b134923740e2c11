"""A sandbox shared by the code task's tests (started once: about a tenth of a second)."""

from __future__ import annotations

import pytest

from components.sandbox import Sandbox, SandboxLimits


@pytest.fixture(scope="session")
def sandbox():
    with Sandbox(SandboxLimits(wall_s=4.0, cpu_s=2, memory_mb=256)) as box:
        yield box
