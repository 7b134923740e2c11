"""How rank 0's stage ends when a rank fails, decided in-process (components.train.launch.local_world
with a stand-in for the spawned ranks' ProcessContext, so that the order of events is the test's):

- rank 0's collective fails first (the peer's socket closed) and the watch sees the rank's death
  while rank 0 is leaving: the stage ends with RankFailed naming the rank, raised from the
  collective's error, as soon as the watch has seen it (not after the whole wait);
- the watch itself fails (its join): the stage ends with that error instead of taking the ranks
  for finished.

The same with real processes and signals: tests/train/test_rank_faults.py.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from torch.multiprocessing import ProcessExitedException

from components.train import launch, rank_watch
from components.train.rank_watch import RankFailed, RankWatch, WorldStopped


class Ranks:
    """The spawned ranks as the watch joins them: running until ``end`` is set, then ``error``."""

    processes: list = []

    def __init__(self, error: BaseException) -> None:
        self.error, self.end = error, threading.Event()

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        if self.end.wait(timeout):
            raise self.error
        return False


def _killed(pid: int = 4242) -> ProcessExitedException:
    return ProcessExitedException("process 0 terminated with signal SIGKILL", 0, pid, -9, "SIGKILL")


def _busy_until(stop: threading.Event, cap_s: float = 120.0) -> None:
    """Python code outside any collective (a rollout), until ``stop`` or ``cap_s``."""
    cap = time.monotonic() + cap_s
    while not stop.is_set() and time.monotonic() < cap:
        sum(i * i for i in range(1000))


@pytest.fixture
def ranks(monkeypatch):
    made: list[Ranks] = []

    def spawn(error: BaseException) -> Ranks:
        made.append(Ranks(error))
        monkeypatch.setattr(launch, "_spawn", lambda *a, **k: made[-1])
        return made[-1]

    yield spawn
    for r in made:
        r.end.set()


@pytest.mark.timeout(300)
def test_rank_0s_collective_failing_first_ends_the_stage_with_rank_failed_at_once(ranks, monkeypatch):
    # The wait ends when the watch has seen the failure: were it to run out instead, this test
    # would hit its timeout long before.
    monkeypatch.setattr(rank_watch, "SETTLE_S", 3600.0, raising=False)
    spawned = ranks(_killed(4242))
    killed = r"^rank 1 of 2 \(pid 4242\) was killed by SIGKILL$"
    with pytest.raises(RankFailed, match=killed) as caught, launch.local_world(2, print):
        spawned.end.set()  # the follower dies; rank 0's collective notices before the watch
        raise RuntimeError("[gloo] Connection closed by peer")
    assert caught.value.rank == 1 and caught.value.pid == 4242
    assert isinstance(caught.value.__cause__, (RuntimeError, WorldStopped))


def test_a_rank_failure_outside_any_collective_ends_the_stage_with_rank_failed(ranks) -> None:
    spawned = ranks(_killed(4343))
    never = threading.Event()
    killed = r"^rank 1 of 2 \(pid 4343\) was killed by SIGKILL$"
    with pytest.raises(RankFailed, match=killed) as caught, launch.local_world(2, print):
        spawned.end.set()
        _busy_until(never)
    assert isinstance(caught.value.__cause__, WorldStopped)


def test_an_error_of_the_watch_stops_the_stage_with_that_error(ranks, caplog) -> None:
    spawned = ranks(OSError("the join broke"))
    never = threading.Event()
    stage = launch.local_world(2, print)
    with caplog.at_level(logging.ERROR), pytest.raises(OSError, match="the join broke"), stage:
        spawned.end.set()
        _busy_until(never)  # the ranks are still working: rank 0 must not take them for finished
    assert "the rank watch failed (OSError: the join broke): stopping the stage" in caplog.text


def test_wait_for_ranks_raises_the_watchs_error_instead_of_returning() -> None:
    spawned = Ranks(OSError("the join broke"))
    watch = RankWatch(spawned, first_rank=1, world_size=2)
    watch.settle(RuntimeError("rank 0 is leaving"))  # from now on nothing is raised into this thread
    try:
        spawned.end.set()
        with pytest.raises(OSError, match="the join broke"):
            watch.wait_for_ranks()
    finally:
        watch.close()
