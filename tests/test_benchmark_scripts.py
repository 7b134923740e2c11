"""The benchmarks that import each other start as the docs run them, ``python benchmarks/<name>.py``
(the script's own directory, not the checkout, is first on sys.path then)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IMPORTING = sorted(
    p.name for p in (REPO / "benchmarks").glob("*.py") if "\nfrom benchmarks." in p.read_text()
)


def test_some_benchmark_imports_another():
    assert "partial_rollout.py" in IMPORTING


@pytest.mark.parametrize("name", IMPORTING)
def test_the_script_starts_from_outside_the_checkout(name, tmp_path):
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / name), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout
