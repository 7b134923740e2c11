"""`make repro` runs `dvc repro` against one Prefect server it starts and always stops."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

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
