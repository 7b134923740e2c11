"""GymTextEnv drives a Gymnasium environment from outside this project (FrozenLake, shipped with
Gymnasium) through a text codec: observations rendered, actions parsed, ends and rewards carried."""

from __future__ import annotations

import gymnasium as gym
import pytest

from components.envs.gym_text import GymTextEnv, InvalidAction, TextCodec

NAMES = ("left", "down", "right", "up")  # FrozenLake's action order


def parse(text: str) -> int:
    word = text.strip().lower()
    if word not in NAMES:
        raise InvalidAction(f"say one of {', '.join(NAMES)}")
    return NAMES.index(word)


CODEC = TextCodec(
    render=lambda obs, info: f"You are on tile {int(obs)}.",
    parse=parse,
    state_key=lambda obs, info: str(int(obs)),
    success=lambda obs, reward, terminated, info: terminated and reward > 0,
)


def frozen_lake(max_episode_steps: int = 100) -> GymTextEnv:
    env = gym.make("FrozenLake-v1", map_name="4x4", is_slippery=False, max_episode_steps=max_episode_steps)
    return GymTextEnv(env, CODEC, "Reach the goal.")


def test_frozen_lake_solved_through_text():
    env = frozen_lake()
    messages = env.reset({"id": "x", "seed": 3})
    assert messages == [
        {"role": "system", "content": "Reach the goal."},
        {"role": "user", "content": "You are on tile 0."},
    ]
    assert env.state_key() == "0"
    # The safe path on the 4x4 map: down, down, right, right, down, right.
    outs = [env.step(a) for a in ("down", "down", "right", "right", "down")]
    assert [o.messages[0]["content"] for o in outs] == [f"You are on tile {t}." for t in (4, 8, 9, 10, 14)]
    assert all(o.reward == 0.0 and not o.done for o in outs)
    last = env.step("right")
    assert last.done and last.reward == 1.0 and last.info["correct"] and not last.truncated
    assert last.messages == []


def test_hole_terminates_without_success():
    env = frozen_lake()
    env.reset({"id": "x"})
    out = env.step("right")
    out = env.step("down")  # tile 5 is a hole
    assert out.done and not out.info["correct"] and out.reward == 0.0 and not out.truncated


def test_time_limit_is_a_truncation():
    env = frozen_lake(max_episode_steps=2)
    env.reset({"id": "x"})
    assert not env.step("left").done
    out = env.step("left")
    assert out.done and out.truncated and not out.info["correct"]


def test_invalid_text_reaches_the_model_not_the_env():
    env = frozen_lake()
    env.reset({"id": "x"})
    out = env.step("jump!")
    assert not out.done and out.info["invalid_action"] and out.reward == 0.0
    assert (
        out.messages[0]["content"] == "Invalid action: say one of left, down, right, up\nYou are on tile 0."
    )


def test_action_outside_the_space_is_invalid():
    codec = TextCodec(render=CODEC.render, parse=lambda text: 7)
    env = GymTextEnv(gym.make("FrozenLake-v1", is_slippery=False), codec, "s")
    env.reset({"id": "x"})
    out = env.step("anything")
    assert out.info["invalid_action"] and "7 is not an action" in out.messages[0]["content"]


def test_options_column_reaches_reset():
    seen = {}

    class Probe(gym.Env):
        action_space = gym.spaces.Discrete(2)
        observation_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            seen.update(seed=seed, options=options)
            return 0, {}

        def step(self, action):
            return 0, 0.0, False, False, {}

    env = GymTextEnv(Probe(), TextCodec(render=lambda o, i: "o", parse=int), "s")
    env.reset({"id": "x", "seed": 5, "options": '{"level": 2}'})
    assert seen == {"seed": 5, "options": {"level": 2}}
    with pytest.raises(TypeError, match="gymnasium.Env"):
        GymTextEnv(object(), CODEC, "s")  # type: ignore[arg-type]
