"""run_episodes steps the environments of one turn side by side when they allow it (``concurrent_steps``),
one after another otherwise, and the records do not depend on which."""

from __future__ import annotations

import threading
import time

import pytest
from agent_helpers import ScriptedEngine, answer, call, row

from components.agent.loop import Episode, run_episodes
from components.envs.base import AgentEnv, StepOutcome

QUESTIONS = [f"What is {a} + {a}?" for a in (11, 22, 33, 44, 55, 66)]
LOOSE = dict(max_steps=3, max_prompt_len=2048, max_response_len=128, temperature=1.0, seed=3)


class Gauge:
    """Counts the steps running right now and the most that ever ran at once."""

    def __init__(self, meet: int = 0) -> None:
        self.lock = threading.Lock()
        self.now = self.peak = 0
        # steps wait here in pairs: a second step must be running while the first one is
        self.barrier = threading.Barrier(meet, timeout=60) if meet else None

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def __exit__(self, *exc) -> None:
        with self.lock:
            self.now -= 1


class WaitingEnv(AgentEnv):
    """A tool env whose step waits (as on a sandbox's answer): a call gets "ok", an answer ends it."""

    tools: list = []

    def __init__(self, gauge: Gauge, concurrent_steps: int) -> None:
        self.gauge, self.concurrent_steps, self.calls = gauge, concurrent_steps, 0

    def reset(self, r):
        self.question, self.calls = r["question"], 0
        return [
            {"role": "system", "content": "Use the calculator."},
            {"role": "user", "content": r["question"]},
        ]

    def step(self, action_text: str) -> StepOutcome:
        with self.gauge:
            if self.gauge.barrier is not None:
                self.gauge.barrier.wait()
            else:
                time.sleep(0.02)  # room for another step to start, were the steps threaded
        if "<answer>" in action_text:
            return StepOutcome([], 1.0, True, {"correct": True})
        self.calls += 1
        return StepOutcome(
            [{"role": "tool", "name": "calculator", "content": f"ok {self.calls}"}], 0.0, False
        )

    def state_key(self) -> str:
        return f"{self.question}|{self.calls}"


def play(tok, renderer, gauge: Gauge, concurrent_steps: int, env=None) -> list[dict]:
    """Every question's episode (a tool call, then the answer) on ``env`` (WaitingEnv by default)."""
    engine = ScriptedEngine(tok, {q: [call("1 + 1"), answer("2")] for q in QUESTIONS})
    env = env or WaitingEnv
    eps = [
        Episode(f"q{i}-0", f"q{i}", env(gauge, concurrent_steps), row(f"q{i}", q, "2"))
        for i, q in enumerate(QUESTIONS)
    ]
    return run_episodes(engine, renderer, eps, **LOOSE)


def test_steps_of_one_turn_run_side_by_side_when_the_envs_allow_it(tok, renderer):
    # each step waits at a barrier of two: one at a time, the first step would wait there until the
    # barrier's timeout breaks it (BrokenBarrierError); side by side, pairs meet and go on
    gauge = Gauge(meet=2)
    steps = play(tok, renderer, gauge, concurrent_steps=2)
    assert gauge.peak == 2  # never more than the envs allow
    assert len(steps) == 2 * len(QUESTIONS) and all(s["correct"] for s in steps if s["done"])


def test_steps_run_one_at_a_time_by_default(tok, renderer):
    gauge = Gauge()
    play(tok, renderer, gauge, concurrent_steps=1)
    assert gauge.peak == 1


@pytest.mark.parametrize("workers", [3, 6])
def test_records_do_not_depend_on_how_many_steps_run_at_once(tok, renderer, workers):
    one_by_one = play(tok, renderer, Gauge(), concurrent_steps=1)
    threaded = play(tok, renderer, Gauge(), concurrent_steps=workers)
    assert threaded == one_by_one
    # the state a step responds to is the env's state before its own action
    assert [s["obs_key"] for s in threaded if s["traj_id"] == "q0-0"] == [
        f"{QUESTIONS[0]}|0",
        f"{QUESTIONS[0]}|1",
    ]
    assert [s["feedback"] for s in threaded if s["traj_id"] == "q0-0"] == ["ok 1", ""]


class FailingEnv(WaitingEnv):
    def step(self, action_text: str) -> StepOutcome:
        if self.question == QUESTIONS[2]:
            raise RuntimeError("env of q2 broke")
        return super().step(action_text)


def test_an_env_that_fails_in_a_thread_fails_the_rollout_with_its_own_error(tok, renderer):
    gauge = Gauge()
    with pytest.raises(RuntimeError, match="env of q2 broke"):
        play(tok, renderer, gauge, concurrent_steps=4, env=FailingEnv)
    assert gauge.now == 0  # no step is left running
