"""rollout.staleness bookkeeping (components.train.staleness): which version generates each rollout,
when each rollout can start, what a resume must keep, the engine's version counter and the thread
that generates ahead of the update."""

from __future__ import annotations

import contextvars
import threading
import time

import pytest
import torch

from components.train.staleness import (
    AheadWorker,
    VersionedEngine,
    behaviour_version,
    checkpoints_to_keep,
    due_rollouts,
    pending_versions,
    staleness_metrics,
)


def test_behaviour_version_is_the_weights_after_update_k_minus_1_minus_s():
    assert [behaviour_version(k, 0) for k in range(5)] == [0, 1, 2, 3, 4]  # synchronous
    assert [behaviour_version(k, 1) for k in range(5)] == [0, 0, 1, 2, 3]
    assert [behaviour_version(k, 2) for k in range(5)] == [0, 0, 0, 1, 2]
    with pytest.raises(ValueError):
        behaviour_version(-1, 1)


def _schedule(staleness: int, iterations: int, first: int = 0) -> dict[int, list[int]]:
    """The rollouts started at the beginning of each iteration (from ``first``, a resume)."""
    submitted, out = first, {}
    for k in range(first, iterations):
        out[k] = list(due_rollouts(k, staleness, iterations, submitted))
        submitted = max([submitted, *(j + 1 for j in out[k])])
    return out


@pytest.mark.parametrize("staleness", [0, 1, 2, 5])
@pytest.mark.parametrize("first", [0, 1, 3])
def test_every_rollout_starts_once_when_its_version_exists_and_before_its_update(staleness, first):
    iterations = 6
    schedule = _schedule(staleness, iterations, first)
    started = [j for k in schedule for j in schedule[k]]
    assert started == list(range(first, iterations))  # each once, in order
    for k, js in schedule.items():
        for j in js:
            assert j >= k  # started no later than the iteration that consumes it
            assert behaviour_version(j, staleness) <= k  # its weights exist (version k is the newest)
            assert k - behaviour_version(j, staleness) <= staleness or j == k
    # as early as the bound allows: rollout j starts at the first iteration that holds its version
    for k, js in schedule.items():
        for j in js:
            assert k == max(first, behaviour_version(j, staleness))


def test_synchronous_schedule_is_one_rollout_per_iteration_and_s1_runs_one_ahead():
    assert _schedule(0, 4) == {0: [0], 1: [1], 2: [2], 3: [3]}
    assert _schedule(1, 4) == {0: [0, 1], 1: [2], 2: [3], 3: []}
    assert _schedule(2, 4) == {0: [0, 1, 2], 1: [3], 2: [], 3: []}
    assert _schedule(1, 4, first=2) == {2: [2, 3], 3: []}  # a resume restarts what was in flight


def test_pending_versions_and_kept_checkpoints_cover_a_resume():
    assert pending_versions(0, 1, 5) == [0]
    assert pending_versions(3, 1, 5) == [2, 3]
    assert pending_versions(3, 2, 5) == [1, 2]  # rollouts 3, 4 (5 is past the run)
    assert pending_versions(5, 2, 5) == []  # every iteration finished
    for s in range(4):
        keep = checkpoints_to_keep(s)
        for first in range(1, 8):
            # finished iterations 0..first-1 keep the checkpoints of the last `keep` of them; a resume
            # restores iteration first-1's and reads version v >= 1 from iteration v-1's
            kept = set(range(max(0, first - keep), first))
            needed = {v - 1 for v in pending_versions(first, s, 8) if v >= 1} | {first - 1}
            assert needed <= kept, (s, first, needed, kept)
    assert checkpoints_to_keep(0) == 2 and checkpoints_to_keep(3) == 4


def test_staleness_metrics_are_the_lag_behind_the_updates_version():
    assert staleness_metrics([2, 2, 3], current=3) == {
        "staleness_mean": pytest.approx(2 / 3),
        "staleness_max": 1.0,
        "policy_version_min": 2.0,
    }
    assert staleness_metrics([], current=0) == {}
    with pytest.raises(ValueError, match="newer"):
        staleness_metrics([4], current=3)


class _Engine:
    def __init__(self) -> None:
        self.weights: dict | None = None
        self.synced: list[float] = []

    def sync_weights(self, state: dict) -> None:
        self.weights = {k: v.clone() for k, v in state.items()}
        self.synced.append(float(state["w"].flatten()[0]))


def test_versioned_engine_syncs_only_on_a_new_version_from_a_copy():
    engine = _Engine()
    held = VersionedEngine(engine, version=0)
    w = torch.zeros(2)
    held.keep(1, {"w": w + 1})
    live = w + 2
    held.keep(2, {"w": live})
    live += 100  # the model moves on: the kept copy does not
    assert held.hold(0) is False and engine.synced == []
    assert held.hold(1) is True and engine.synced == [1.0] and held.version == 1
    assert held.hold(1) is False and held.syncs == 1
    assert held.hold(2) is True and engine.synced == [1.0, 2.0]
    assert held.kept() == [2]  # older copies are forgotten: versions are asked for in order
    with pytest.raises(RuntimeError, match="version 2 and was asked for 1"):
        held.hold(1)


def test_ahead_worker_runs_jobs_in_order_in_one_thread_with_the_submitters_context():
    var = contextvars.ContextVar("run", default=None)
    var.set("flow-run")
    seen: list[tuple[int, str | None, str]] = []
    worker = AheadWorker()
    try:
        futures = [
            worker.submit(lambda i: seen.append((i, var.get(), threading.current_thread().name)) or i, i)
            for i in range(5)
        ]
        assert [f.result() for f in futures] == list(range(5))
        assert [s[0] for s in seen] == list(range(5)) and {s[1] for s in seen} == {"flow-run"}
        assert len({s[2] for s in seen}) == 1 and seen[0][2] != threading.current_thread().name

        def fail():
            raise RuntimeError("engine died")

        worker.submit(fail)
        with pytest.raises(RuntimeError, match="engine died"):
            worker.drain()
    finally:
        worker.close()


def _simulate(
    held: VersionedEngine, s: int, iterations: int, generate_s: float, update_s: float
) -> tuple[dict[int, tuple[int, float, float]], dict[int, tuple[float, float]]]:
    """The train stage's protocol at staleness ``s`` with a fake engine: at the start of iteration k
    start the due rollouts (each holds its behaviour version, then "generates" for ``generate_s``),
    wait for rollout k, "update" for ``update_s``, keep version k+1. Each rollout's (version it held,
    start, end) and each update's (start, end)."""
    worker = AheadWorker()
    generated: dict[int, tuple[int, float, float]] = {}
    updates: dict[int, tuple[float, float]] = {}

    def generate(j: int, v: int) -> int:
        held.hold(v)
        version, t0 = held.version, time.monotonic()
        time.sleep(generate_s)
        generated[j] = (version, t0, time.monotonic())
        return j

    futures, submitted = {}, 0
    try:
        for k in range(iterations):
            for j in due_rollouts(k, s, iterations, submitted):
                futures[j] = worker.submit(generate, j, behaviour_version(j, s))
                submitted = j + 1
            assert futures.pop(k).result() == k
            t0 = time.monotonic()
            time.sleep(update_s)
            updates[k] = (t0, time.monotonic())
            held.keep(k + 1, {"w": torch.tensor(float(k + 1))})
        worker.drain()
    finally:
        worker.close()
    return generated, updates


def test_a_simulated_run_generates_each_rollout_with_its_version_beside_the_update():
    """At s = 1: at the start of iteration k nothing new is kept (version k was kept after update
    k-1). Rollout k+1 runs while update k runs; each rollout by its version."""
    s, iterations = 1, 4
    engine = _Engine()
    generated, updates = _simulate(VersionedEngine(engine, version=0), s, iterations, 0.05, 0.1)
    assert {j: g[0] for j, g in generated.items()} == {0: 0, 1: 0, 2: 1, 3: 2}
    assert engine.synced == [1.0, 2.0]  # one sync per new version, none for rollout 1
    for k in range(iterations - 1):  # rollout k+1 overlaps update k
        (g0, g1), (u0, u1) = generated[k + 1][1:], updates[k]
        assert g0 < u1 and u0 < g1, (k, generated[k + 1], updates[k])


class _InflightEngine(_Engine):
    """Takes a version with its weights, as components.rollout.vllm_inflight does."""

    def __init__(self) -> None:
        super().__init__()
        self.versions: list[int] = []

    def sync_weights(self, state: dict, version: int | None = None) -> None:
        super().sync_weights(state)
        self.versions.append(version)


def test_an_inflight_engine_gets_each_version_when_it_is_kept_and_hold_only_checks():
    engine = _InflightEngine()
    held = VersionedEngine(engine, version=0, inflight=True)
    assert held.hold(0) is False and engine.synced == []
    held.keep(1, {"w": torch.ones(1)})
    assert engine.versions == [1] and held.version == 1 and held.kept() == []  # pushed, no copy kept
    assert held.hold(0) is False and held.hold(1) is False  # a rollout due to version 0 may use 1
    with pytest.raises(
        RuntimeError, match="holds policy version 1 and was asked for 2, which was never pushed"
    ):
        held.hold(2)
    with pytest.raises(RuntimeError, match="version 1 pushed to an engine holding version 1"):
        held.keep(1, {"w": torch.ones(1)})
    held.keep(2, {"w": torch.ones(1) * 2})
    assert engine.synced == [1.0, 2.0] and held.syncs == 2


def test_a_simulated_inflight_run_generates_each_rollout_with_its_version_or_a_newer_one():
    """As the simulated run above, with pushes: each rollout starts with the newest version there is,
    never older than its behaviour version max(0, j - s) nor newer than j."""
    s, iterations = 1, 5
    engine = _InflightEngine()
    generated, _ = _simulate(VersionedEngine(engine, version=0, inflight=True), s, iterations, 0.02, 0.05)
    started = {j: g[0] for j, g in generated.items()}
    assert engine.versions == list(range(1, iterations + 1))
    assert all(behaviour_version(j, s) <= v <= j for j, v in started.items()), started
