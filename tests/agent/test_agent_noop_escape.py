"""The no-op escape in the agent loop (evaluate.noop_escape_protocols): a reply that already changed
nothing from the same state is resampled, greedy or sampled; the escape never touches a first no-op,
other states, or a run without it, and the loop metric of an escaped run counts no repeat."""

from __future__ import annotations

from typing import Any

import pytest
from agent_helpers import logprobs_for, row

from components.agent.loop import Episode, NoopEscape, episode_metrics, run_episodes
from components.envs.base import AgentEnv, StepOutcome
from components.model.tokenizer import EOS_TOKEN
from components.rollout.base import Generation, SamplingConfig
from components.tasks.step_records import loop_metrics

LIMITS = dict(max_steps=6, max_prompt_len=4096, max_response_len=32, seed=3)


class Corridor(AgentEnv):
    """Positions 0..2, start 0, goal 2: "right" moves on, "left" hits a wall (changes nothing); the
    state key is the position."""

    tools: list[dict[str, Any]] = []

    def reset(self, row):
        self.pos = 0
        return [{"role": "system", "content": "Walk."}, {"role": "user", "content": row["question"]}]

    def step(self, action_text):
        self.pos += action_text.strip() == "right"
        done = self.pos == 2
        return StepOutcome([] if done else [{"role": "user", "content": f"at {self.pos}"}], float(done), done)

    def state_key(self):
        return f"pos={self.pos}"


class WallEngine:
    """Greedy (temperature 0) always answers "left"; sampled, the reply is chosen by the seed's parity
    ("left" on even seeds, "right" on odd), or is always "left" with ``stubborn``: every call is kept."""

    def __init__(self, tok, stubborn: bool = False) -> None:
        self.tok, self.eos, self.stubborn = tok, tok.convert_tokens_to_ids(EOS_TOKEN), stubborn
        self.calls: list[tuple[float, list[int]]] = []

    def generate(self, prompts, sampling: SamplingConfig, seeds=None):
        self.calls.append((sampling.temperature, list(seeds)))
        out = []
        for seed in seeds:
            text = "left" if sampling.temperature == 0 or self.stubborn or seed % 2 == 0 else "right"
            ids = self.tok.encode(text, add_special_tokens=False) + [self.eos]
            out.append([Generation(ids, logprobs_for(ids), "stop")])
        return out


def _play(tok, renderer, escape, temperature=0.0, n=1, stubborn=False):
    eps = [Episode(f"w-{i}", "w", Corridor(), row("w", "Walk right.", "")) for i in range(n)]
    engine = WallEngine(tok, stubborn)
    steps = run_episodes(engine, renderer, eps, temperature=temperature, noop_escape=escape, **LIMITS)
    return steps, engine


def test_without_escape_greedy_walks_into_the_wall_every_turn(tok, renderer):
    steps, engine = _play(tok, renderer, None)
    assert [s["action"] for s in steps] == ["left"] * 6 and not any(s["correct"] for s in steps)
    assert "escapes" not in steps[0] and "noop_escapes_per_step" not in episode_metrics(steps)
    assert loop_metrics(steps)["loop_rate"] == pytest.approx(5 / 6)
    assert all(t == 0.0 for t, _ in engine.calls)


def test_escape_resamples_a_known_noop_and_the_episode_goes_on(tok, renderer):
    steps, engine = _play(tok, renderer, NoopEscape(tries=8, temperature=1.0))
    actions = [s["action"] for s in steps]
    # each state's first no-op is played (nothing is known of it yet), the repeat is resampled
    assert actions == ["left", "right", "left", "right"] and steps[-1]["done"]
    assert [s["obs_key"] for s in steps] == ["pos=0", "pos=0", "pos=1", "pos=1"]
    assert [s["escapes"] > 0 for s in steps] == [False, True, False, True]
    assert loop_metrics(steps)["loop_rate"] == 0.0
    m = episode_metrics(steps)
    assert m["noop_escapes_per_step"] == pytest.approx(sum(s["escapes"] for s in steps) / 4)
    resampled = [(t, seeds) for t, seeds in engine.calls if t == 1.0]
    assert resampled and len({s for _, seeds in resampled for s in seeds}) == len(resampled)


def test_a_failed_escape_plays_its_last_try(tok, renderer):
    """Every resample is "left" again: after its tries the last one is played, and counted."""
    steps, engine = _play(tok, renderer, NoopEscape(tries=2, temperature=1.0), stubborn=True)
    assert [s["action"] for s in steps] == ["left"] * 6
    assert [s["escapes"] for s in steps] == [0, 2, 2, 2, 2, 2]
    assert [t for t, _ in engine.calls] == [0.0] + [0.0, 1.0, 1.0] * 5


def test_sampled_episodes_escape_too(tok, renderer):
    steps, _ = _play(tok, renderer, NoopEscape(tries=8), temperature=0.7, n=4)
    assert loop_metrics(steps)["loop_rate"] == 0.0
    assert all(any(s["done"] for s in steps if s["traj_id"] == f"w-{i}") for i in range(4))


@pytest.mark.parametrize("bad", [dict(tries=0), dict(temperature=0.0)])
def test_bad_escape_settings_are_refused(bad):
    with pytest.raises(ValueError, match="NoopEscape"):
        NoopEscape(**bad)
