"""tests.flows.workspace.kill_when_written, the kill-then-resume tests' helper: it kills the whole
process group once the target file exists, and says when the target never came."""

from __future__ import annotations

import sys
import time

import psutil

from tests.flows.workspace import kill_when_written

# writes "target", then starts a child and sleeps: both must die with the group
WRITER = (
    "import pathlib, subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "pathlib.Path('child.pid').write_text(str(child.pid))\n"
    "pathlib.Path('target').write_text('x')\n"
    "time.sleep(60)\n"
)


def test_kills_the_group_once_the_target_is_written(tmp_path):
    t0 = time.monotonic()
    assert kill_when_written([sys.executable, "-c", WRITER], tmp_path, tmp_path / "target", timeout=30)
    assert time.monotonic() - t0 < 30, "it waited for the command instead of killing it"
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 10
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the command's child outlived the kill"
        time.sleep(0.05)


def test_false_when_the_command_ends_without_writing_the_target(tmp_path):
    assert not kill_when_written([sys.executable, "-c", "pass"], tmp_path, tmp_path / "target", timeout=30)


def test_false_after_the_timeout(tmp_path):
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    t0 = time.monotonic()
    assert not kill_when_written(sleeper, tmp_path, tmp_path / "target", timeout=1)
    assert time.monotonic() - t0 < 30
