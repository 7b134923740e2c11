"""``make -n`` in the repo, as the tests that check a make target's command line run it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def make_n(*args: str, drop: tuple[str, ...] = ()) -> str:
    """What `make <args>` would run here (-n; setup taken as up to date), with none of the caller's
    Prefect/MLflow/steprl settings nor a parent make's (MAKELEVEL, MAKEFLAGS: under `make test` they
    would add "Entering/Leaving directory" lines and the parent's variables), nor the variables in
    ``drop`` (a target's own, e.g. MODEL, that the caller's environment may set)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PREFECT_", "MLFLOW_", "STEPRL_", "MAKE", "MFLAGS")) and k not in drop
    }
    cmd = ["make", "-n", "--no-print-directory", "-o", ".venv/.installed", *args]
    return subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, check=True, timeout=60
    ).stdout
