"""`make repro` runs `dvc repro` against one Prefect server it starts and always stops."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from flows import repro

CHECK = (
    "import json, os, urllib.request;"
    "url = os.environ['PREFECT_API_URL'];"
    "assert url.startswith('http://127.0.0.1:'), url;"
    "print(url);"
    "print(json.load(urllib.request.urlopen(url + '/health', timeout=5)))"
)


def test_the_command_sees_a_live_local_server_that_is_gone_afterwards(monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    out = subprocess.run(
        [sys.executable, "-m", "flows.repro", "--", sys.executable, "-c", CHECK + ";raise SystemExit(3)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 3, out.stderr  # the command's own exit code
    url, health = out.stdout.strip().splitlines()[-2:]
    assert health == "True"
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/health", timeout=2)


def test_an_existing_api_url_is_used_as_it_is(monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    seen = []
    monkeypatch.setattr(repro.subprocess, "call", lambda cmd, **kw: seen.append(cmd) or 0)
    monkeypatch.setattr(repro, "start_server", lambda *a: pytest.fail("started a server"))
    assert repro.main(["-f", "sft"]) == 0
    assert seen == [["dvc", "repro", "-f", "sft"]]


def test_help_is_answered_without_starting_anything(monkeypatch, capsys):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setattr(repro, "start_server", lambda *a: pytest.fail("started a server"))
    monkeypatch.setattr(repro.subprocess, "call", lambda *a, **k: pytest.fail(f"ran {a}"))
    assert repro.main(["--help"]) == 0
    assert "python -m flows.repro --profile sokoban" in capsys.readouterr().out


def test_the_venvs_dvc_is_used_without_the_venv_on_path(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env.update(PATH="/usr/bin:/bin", PREFECT_API_URL="http://127.0.0.1:9/api", MLFLOW_TRACKING_URI="")
    assert Path(sys.executable).with_name("dvc").exists()  # make setup's venv
    out = subprocess.run(
        [sys.executable, "-m", "flows.repro", "--", "dvc", "--version"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0 and out.stdout.strip(), out.stderr[-3000:]


def test_no_dvc_anywhere_is_said(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(repro.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(repro.subprocess, "call", lambda *a, **k: pytest.fail(f"ran {a}"))
    assert repro.main([]) == 127
    assert "'dvc' is neither next to" in capsys.readouterr().err
