"""A rank that dies stops a multi-rank world within seconds and leaves no process behind.

Each case runs tests/train/fault_world.py (rank 0 of a 2-rank local_world, rank 1 waiting in a
broadcast as a train-stage follower does) in a process of its own, kills a rank with SIGKILL, and
checks from outside: how long until every process of the world has ended (polled with psutil over
the tree recorded before the kill), what rank 0 printed, its exit code. The stage-level kills
(a follower mid-update, rank 0 mid-rollout, then the resumed run's weights) are in
tests/flows/test_train_faults.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from components.train.rank_watch import STOP_GRACE_S

SCRIPT = Path(__file__).with_name("fault_world.py")
REPO = Path(__file__).resolve().parents[2]
# A follower's death stops rank 0 within STOP_GRACE_S; on this 2-core machine under load the join's
# SIGTERM/SIGKILL of the others and the interpreter's exit add a few seconds.
BOUND_S = STOP_GRACE_S + 10.0


class World:
    def __init__(self, log: Path, scenario: str, *extra: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(var, None)
        self.log = log
        with open(log, "w") as err:  # a file: vLLM's logs would fill a pipe nobody reads yet
            self.proc = subprocess.Popen(
                [sys.executable, str(SCRIPT), scenario, *extra],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
                start_new_session=True,
            )
        self.pids: dict = {}
        self.sync: dict = {}  # the vllm scenario's weight-sync check
        self.tree: list[psutil.Process] = []

    def ready(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        for line in self.proc.stdout:
            if line.startswith("SYNC "):
                self.sync = json.loads(line[len("SYNC ") :])
            if line.startswith("READY "):
                self.pids = json.loads(line[len("READY ") :])
                self.tree = psutil.Process(self.proc.pid).children(recursive=True)
                return self.pids
            assert time.monotonic() < deadline, "the world did not come up"
        raise AssertionError(f"the world exited before READY: {self.proc.wait()} {self.stderr()[-3000:]}")

    def stderr(self) -> str:
        return self.log.read_text()

    def left_behind(self, within: float) -> list[str]:
        """Processes of the recorded tree still running after ``within`` seconds (zombies count as ended)."""
        deadline = time.monotonic() + within
        while True:
            alive = [p for p in self.tree if _running(p)]
            if not alive or time.monotonic() > deadline:
                return [f"{p.pid} {p.name()}" for p in alive]
            time.sleep(0.05)

    def close(self) -> None:
        """Whatever the test left running (a failed assertion): killed."""
        for p in [*self.tree, psutil.Process(self.proc.pid)] if self.proc.poll() is None else self.tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        self.proc.wait()


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def world(tmp_path):
    made: list[World] = []

    def make(*args: str) -> World:
        made.append(World(tmp_path / f"stderr-{len(made)}.log", *args))
        return made[-1]

    yield make
    for w in made:
        w.close()


def test_a_killed_follower_stops_rank_0_outside_any_collective(world) -> None:
    w = world("rollout")
    pids = w.ready(timeout=300)
    (follower,) = pids["followers"]
    t0 = time.monotonic()
    os.kill(follower, signal.SIGKILL)
    code = w.proc.wait(timeout=BOUND_S + 30)
    stopped = time.monotonic() - t0
    err = w.stderr()
    assert code == 1, err[-3000:]
    line = f"error: rank 1 of 2 (pid {follower}) was killed by SIGKILL: stopping the stage"
    assert line in err, err[-3000:]
    assert "RankFailed: rank 1 of 2" in err  # rank 0's exception names it too
    assert stopped < BOUND_S, stopped
    assert w.left_behind(within=5.0) == []


def test_a_follower_killed_while_rank_0_is_in_a_collective_ends_the_stage_with_rank_failed(world) -> None:
    w = world("collective")
    (follower,) = w.ready(timeout=300)["followers"]
    os.kill(follower, signal.SIGKILL)
    code = w.proc.wait(timeout=BOUND_S + 30)
    err = w.stderr()
    assert code == 1, err[-3000:]
    last = err.strip().splitlines()[-1]  # the exception the stage ended with (torch prefixes "[rank0]: ")
    failed = f"components.train.rank_watch.RankFailed: rank 1 of 2 (pid {follower}) was killed by SIGKILL"
    assert last.endswith(failed), err[-3000:]
    assert w.left_behind(within=5.0) == []


def test_a_follower_error_is_named_with_its_exception(world) -> None:
    w = world("raise")
    w.ready(timeout=300)
    code = w.proc.wait(timeout=BOUND_S + 30)
    err = w.stderr()
    assert code == 1
    assert "error: rank 1 of 2 (pid " in err and "raised ValueError: a follower's own error" in err, err[
        -3000:
    ]
    assert w.left_behind(within=5.0) == []


def test_rank_0_blocked_where_no_exception_reaches_is_stopped_after_the_grace(world) -> None:
    w = world("blocked")  # rank 0 sleeps in C; the scenario's grace is 3 s
    pids = w.ready(timeout=300)
    t0 = time.monotonic()
    os.kill(pids["followers"][0], signal.SIGKILL)
    code = w.proc.wait(timeout=60)
    stopped = time.monotonic() - t0
    err = w.stderr()
    assert code == 1
    assert "rank 0 did not stop within 3 s of the failure of rank 1" in err, err[-3000:]
    assert 3.0 <= stopped < 3.0 + 10.0, stopped
    assert w.left_behind(within=5.0) == []


def test_ctrl_c_stops_the_world_from_rank_0_without_blaming_a_follower(world) -> None:
    w = world("rollout")
    w.ready(timeout=300)
    os.killpg(w.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: the whole process group
    code = w.proc.wait(timeout=60)
    err = w.stderr()
    assert code != 0
    assert "KeyboardInterrupt" in err and "error: rank 1" not in err, err[-3000:]
    assert w.left_behind(within=10.0) == []


TOL = 1e-3  # as tests/rollout/test_rollout_sync.py: fp32, max |logp_vllm - logp_trainer|


@pytest.mark.vllm
def test_own_process_vllm_syncs_beside_two_ranks_and_ends_with_a_killed_rank_0(world, tmp_path) -> None:
    """Rank 0 of a 2-rank gloo world starts vLLM with ``EngineSettings(own_process=True)`` (the
    multi-rank train stage's engine): the trainer's world is untouched (rank 1 meets rank 0 in a
    barrier afterwards), the engine is vLLM's multiprocessing client, and its log-probs equal the
    trainer's before an "update", differ after it (stale weights), and equal them again after the
    weight sync through a safetensors file (components.rollout.vllm_worker). Then rank 0, killed
    mid-generation, leaves neither its follower nor vLLM's processes behind."""
    w = world("vllm", str(tmp_path))
    w.ready(timeout=600)
    r = w.sync
    print(r)
    assert r["client"] != "InprocClient" and r["world"] == 2, r
    assert r["before"] <= TOL, r
    assert r["stale"] > 10 * TOL, f"the test cannot tell stale weights from synced ones: {r}"
    assert r["after"] <= TOL, r
    names = sorted(p.name() for p in w.tree)
    assert any("EngineCore" in n for n in names) and any("Worker" in n for n in names), names
    time.sleep(2.0)  # mid-generation
    os.kill(w.proc.pid, signal.SIGKILL)
    w.proc.wait()
    assert w.left_behind(within=30.0) == []
