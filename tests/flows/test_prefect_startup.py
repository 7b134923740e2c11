"""A stage's temporary Prefect server is waited for long enough that a busy machine slows the stage
down instead of failing it ("Timed out while attempting to connect to ephemeral Prefect API server"
after Prefect's 20 s, or the 120 s steprl set before, with both cores busy)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from flows import PREFECT_STARTUP_TIMEOUT_S, REPO

READ = (
    "import flows;"
    "from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS as S;"
    "print(S.value())"
)
# The cheapest stage-like entry that starts the temporary server: flows' defaults, then a flow.
FLOW = (
    "import flows\nfrom prefect import flow\n\n@flow\ndef tiny():\n    return 1\n\nprint('result', tiny())\n"
)


def _env(tmp_path, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return {**env, "PYTHONPATH": str(REPO), "PREFECT_HOME": str(tmp_path / "prefect"), **extra}


def test_a_stage_waits_long_for_its_temporary_server_unless_told_otherwise(tmp_path):
    assert PREFECT_STARTUP_TIMEOUT_S >= 600
    run = [sys.executable, "-c", READ]
    out = subprocess.run(run, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == [str(PREFECT_STARTUP_TIMEOUT_S)], out.stderr[-3000:]
    mine = _env(tmp_path, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="45")
    out = subprocess.run(run, env=mine, capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["45"], out.stderr[-3000:]


@pytest.mark.slow
def test_a_flow_starts_its_temporary_server_with_both_cores_busy(tmp_path):
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
    try:
        out = subprocess.run(
            [sys.executable, "-c", FLOW],
            env=_env(tmp_path),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=2 * PREFECT_STARTUP_TIMEOUT_S,
        )
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert out.returncode == 0 and "result 1" in out.stdout, out.stderr[-3000:]
