"""BabyAI splits: every kept level done by minigrid's bot, demonstrations that replay, the bot's tally,
episode metrics by hand, the params section."""

from __future__ import annotations

import json
import logging
import random

import pytest
from minigrid.utils.baby_ai_bot import BabyAIBot
from pydantic import ValidationError

from components.tasks.babyai import generator, initial_messages, make_env
from components.tasks.babyai.generator import bot_episode, make_splits
from components.tasks.babyai.metrics import episode_metrics
from components.tasks.babyai.params import BabyAIParams


def replay(demo: list[dict], row: dict, data_dir) -> object:
    """Step ``demo``'s replies through a fresh environment; each observation must be the demo's next
    user message. Returns the last step's outcome."""
    env = make_env(data_dir=data_dir)
    assert env.reset(row) == initial_messages(row)
    out = None
    for i, m in enumerate(demo):
        if m["role"] != "assistant":
            continue
        assert out is None or not out.done
        out = env.step(m["content"])
        if i + 1 < len(demo):
            assert out.messages[0]["content"] == demo[i + 1]["content"] and not out.done
    return out


def test_the_bot_does_every_level_of_the_splits(tmp_path):
    p = BabyAIParams(weak_per_question=2.0)
    splits = make_splits(p, seed=1, n_train=30, n_val=5, n_test=5, data_dir=tmp_path)
    assert json.loads((tmp_path / "env.json").read_text()) == p.env_settings()
    seeds = [s for split in splits.values() for s in split["seed"].to_list()]
    assert len(seeds) == len(set(seeds)) == 40  # no level in two splits
    n_weak = 0
    for split in splits.values():
        for row in split.to_dicts():
            expert = json.loads(row["expert"])
            assert len(expert) == 2 * row["n_calls"] - 1 and row["n_calls"] <= p.max_moves
            assert row["answer"].count(",") == row["n_calls"] - 1
            for demo in [expert, *json.loads(row["weak"] or "[]")]:
                out = replay(demo, row, tmp_path)
                assert out.done and out.info["correct"] and 0 < out.reward <= 1
            n_weak += len(json.loads(row["weak"] or "[]"))
    assert n_weak >= 50  # two per train level on average, nearly all of them done
    tally = json.loads((tmp_path / "bot.json").read_text())
    assert tally["level"] == "BabyAI-GoToLocalS8N4-v0" and tally["within_max_moves"] == 40
    assert tally["tried"] >= 40 and tally["solved"] >= tally["within_max_moves"]
    assert tally["kept_rate"] == pytest.approx(40 / tally["tried"])


def test_levels_the_bot_needs_too_long_for_are_dropped_and_counted(tmp_path):
    splits = make_splits(BabyAIParams(max_moves=3), seed=0, n_train=10, n_val=2, n_test=2, data_dir=tmp_path)
    assert max(max(s["n_calls"].to_list()) for s in splits.values()) <= 3
    tally = json.loads((tmp_path / "bot.json").read_text())
    assert tally["within_max_moves"] == 14 and tally["solved"] > 14  # some needed more than 3 actions


def test_no_levels_the_bot_can_do_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(generator, "MAX_TRIES_PER_LEVEL", 2)
    monkeypatch.setattr(generator, "bot_episode", lambda *a, **k: None)
    with pytest.raises(ValueError, match=r"tasks\.babyai: the bot completed 0 of 2 .* test split"):
        make_splits(BabyAIParams(), seed=0, n_train=1, n_val=1, n_test=1)


def test_bot_episode_limits_and_detours():
    env = make_env()
    row = {"id": "r", "seed": 6}
    messages, actions = bot_episode(env, row, limit=100)
    assert len(actions) > 1 and bot_episode(env, row, limit=len(actions) - 1) is None
    assert bot_episode(env, row, limit=100, rng=random.Random(0), epsilon=0.0) == (messages, actions)
    detour = bot_episode(env, row, limit=100, rng=random.Random(3), epsilon=0.5)
    assert detour is not None and detour[1] != actions  # other actions, still done


def test_detours_as_context_only_change_the_labels_not_the_episode():
    """imitate_detours=False: the same episode (replies, observations, actions), with weight 0 on
    exactly the random moves that are not the bot's own choice (found by replaying the bot)."""
    env = make_env()
    row = {"id": "r", "seed": 6}
    imitated = bot_episode(env, row, limit=100, rng=random.Random(3), epsilon=0.5)
    messages, actions = bot_episode(
        env, row, limit=100, rng=random.Random(3), epsilon=0.5, imitate_detours=False
    )
    assert imitated is not None and actions == imitated[1]
    assert [{k: v for k, v in m.items() if k != "weight"} for m in messages] == imitated[0]
    weights = [m.get("weight", 1) for m in messages if m["role"] == "assistant"]
    # the bot's own choice at each turn, replayed on the actions taken
    env.reset(row)
    bot, taken, own = BabyAIBot(env.env), None, []
    for a in actions:
        own.append(int(bot.replan(taken)))
        env.env.step(a)
        taken = a
    assert weights == [1 if a == b else 0 for a, b in zip(actions, own)]
    assert 0 in weights and 1 in weights
    assert bot_episode(env, row, limit=100, imitate_detours=False) == bot_episode(env, row, limit=100)


def test_episode_metrics_by_hand():
    def step(traj, k, reward, correct=False, invalid=0.0):
        tm = json.dumps({"success": float(correct), "invalid_action": invalid})
        return {"traj_id": traj, "step": k, "reward": reward, "correct": correct, "task_metrics": tm}

    steps = [
        step("a", 0, 0.0),
        step("a", 1, 0.0, invalid=1.0),
        step("a", 2, 0.9578125, correct=True),
        step("b", 0, -0.1, invalid=1.0),
        step("b", 1, 0.0),
    ]
    assert episode_metrics(steps) == pytest.approx(
        {
            "success_rate": 0.5,
            "steps_to_success": 3.0,
            "invalid_action_rate": 2 / 5,
            "return": (0.9578125 - 0.1) / 2,
        }
    )
    with pytest.raises(ValueError, match="step record 0 has no 'traj_id'"):
        episode_metrics([{"step": 0}])
    without_step = [{k: v for k, v in s.items() if k != "step"} for s in steps]  # the loop metrics read it
    with pytest.raises(ValueError, match="step record 0 has no 'traj_id' or 'step'"):
        episode_metrics(without_step)


def test_params_name_what_is_wrong():
    with pytest.raises(
        ValidationError, match=r"'BabyAI-GoToNowhere-v0' is not a BabyAI level registered by minigrid"
    ):
        BabyAIParams(level="BabyAI-GoToNowhere-v0")
    with pytest.raises(ValidationError, match=r"env_max_steps=8 < max_moves=12"):
        BabyAIParams(env_max_steps=8)
    assert BabyAIParams(level="BabyAI-PickupLoc-v0").turns_needed() == 12


class _BrokenBot(BabyAIBot):
    """minigrid's bot after an API change: its replan raises TypeError on every ``every``-th level."""

    made = 0
    every = 1

    def __init__(self, env) -> None:
        super().__init__(env)
        type(self).made += 1
        self.broken = type(self).made % type(self).every == 0

    def replan(self, action_taken=None):
        if self.broken:
            raise TypeError("replan() got an unexpected keyword argument")
        return super().replan(action_taken)


def test_bot_errors_are_counted_apart_from_levels_not_done(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(generator, "BabyAIBot", type("SometimesBroken", (_BrokenBot,), {"every": 3}))
    with caplog.at_level(logging.WARNING, logger=generator.__name__):
        make_splits(BabyAIParams(), seed=0, n_train=6, n_val=2, n_test=2, data_dir=tmp_path)
    tally = json.loads((tmp_path / "bot.json").read_text())
    assert tally["bot_errors"] > 0 and tally["within_max_moves"] == 10
    assert tally["first_bot_error"].startswith("BabyAIBot raised TypeError: replan() got an unexpected")
    assert f"{tally['bot_errors']} bot errors in {tally['tried']} levels tried" in caplog.text


def test_a_bot_that_errors_on_every_level_fails_naming_the_error(monkeypatch):
    monkeypatch.setattr(generator, "BabyAIBot", _BrokenBot)
    monkeypatch.setattr(generator, "MAX_TRIES_PER_LEVEL", 3)
    with pytest.raises(
        RuntimeError, match=r"every one of the 3 .* levels played ended in a bot error.*TypeError"
    ):
        make_splits(BabyAIParams(), seed=0, n_train=1, n_val=1, n_test=1)
