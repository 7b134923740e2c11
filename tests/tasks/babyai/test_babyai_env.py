"""The babyai environment through GymTextEnv: minigrid's dynamics, the text, hand-pinned transitions,
hostile replies, state keys."""

from __future__ import annotations

import json
import random

import gymnasium as gym
import pytest
from minigrid.core.grid import Grid
from minigrid.core.world_object import Ball, Box, Door, Key
from minigrid.envs.babyai.core.verifier import GoToInstr, ObjDesc
from minigrid.utils.baby_ai_bot import BabyAIBot

from components.tasks.babyai import action_text, describe, initial_messages, make_env, parse_action, state_key

LEVEL = "BabyAI-GoToLocal-v0"


def row(seed: int) -> dict:
    return {"id": f"babyai-{seed}", "seed": seed, "question": "unused"}


@pytest.mark.parametrize("seed", [0, 6, 11])
def test_dynamics_are_minigrids(seed):
    """The same seed stepped through minigrid directly and through the task (actions as text) gives
    the same positions, directions, carried objects, rewards and ends: first the bot's actions (which
    end in success, minigrid's reward > 0), then random actions."""
    direct = gym.make(LEVEL)
    direct.reset(seed=seed)
    actions = []
    bot = BabyAIBot(direct)
    while True:
        a = int(bot.replan())
        _, r, term, trunc, _ = direct.step(a)
        actions.append(a)
        if term or trunc:
            break
    assert r > 0 and term
    rng = random.Random(seed)
    for plan in (actions, [rng.randrange(6) for _ in range(80)]):
        direct = gym.make(LEVEL)
        env = make_env(level=LEVEL)
        obs, _ = direct.reset(seed=seed)
        assert env.reset(row(seed))[1]["content"] == describe(obs)
        u, mine = direct.unwrapped, env.env.unwrapped
        for a in plan:
            obs, r, term, trunc, _ = direct.step(a)
            out = env.step(action_text(a))
            assert tuple(mine.agent_pos) == tuple(u.agent_pos) and mine.agent_dir == u.agent_dir
            assert (mine.carrying is None) == (u.carrying is None)
            assert out.reward == r and out.done == (term or trunc) and out.info["correct"] == (term and r > 0)
            if out.done:
                break
            assert out.messages == [{"role": "user", "content": describe(obs)}]
        if plan is actions:
            assert (
                out.done and out.info["correct"] and out.reward == pytest.approx(1 - 0.9 * len(actions) / 64)
            )


def test_first_observation_of_a_real_level_is_pinned():
    """GoToLocal seed 6 (minigrid's pprint_grid: W wall, K key, B box, A ball, then the colour; << is
    the agent at (3, 4) facing left, i.e. -x; its left is +y, its right is -y):

        WGWGWGWGWGWGWGWG
        WG          BBWG
        WG      KR    WG
        WG        AG  WG
        WGKB  <<      WG
        WG  BG        WG
        WG    BB  BYBRWG
        WGWGWGWGWGWGWGWG

    Ahead of it: the blue key at (1, 4) is 2 steps forward; the grey box at (2, 5) 1 forward and 1 to
    the left (+y); the blue box at (3, 6) 2 to the left, level with it. The red box (the goal) at (6, 6)
    and everything with x > 3 is behind it, out of its view. Walls: x = 0 is 3 steps forward, y = 7 is
    3 steps left, y = 0 is 4 steps right, beyond the 3 cells the view reaches to each side."""
    env = make_env(level=LEVEL)
    first = env.reset(row(6))[1]["content"]
    assert first == (
        "goal: go to the red box\n"
        "a blue box 2 steps left\n"
        "a grey box 1 step forward and 1 step left\n"
        "a blue key 2 steps forward\n"
        "a wall 3 steps forward\n"
        "a wall 3 steps left"
    )


def scene(agent, direction, objects, carrying=None, **settings):
    """A GoToLocal environment whose room is rebuilt by hand (8x8, walls around): the agent at
    ``agent`` facing ``direction`` (0 +x, 1 +y, 2 -x, 3 -y), ``objects`` by position, ``carrying``; the
    mission is to go to a purple ball at (6, 6), out of the way. ``settings`` go to make_env."""
    env = make_env(level=LEVEL, **settings)
    env.reset(row(0))
    u = env.env.unwrapped
    grid = Grid(8, 8)
    grid.wall_rect(0, 0, 8, 8)
    for (x, y), obj in {**objects, (6, 6): Ball("purple")}.items():
        grid.set(x, y, obj)
        obj.init_pos = obj.cur_pos = (x, y)
    u.grid, u.agent_pos, u.agent_dir, u.carrying = grid, agent, direction, carrying
    u.instrs = GoToInstr(ObjDesc("ball", "purple"))
    u.instrs.reset_verifier(u)
    u.mission = u.instrs.surface(u)
    return env, u


def test_text_of_a_hand_built_view():
    """Agent at (3, 5) facing up (-y): its left is -x, its right +x. An open green door at (5, 5) is 2
    right, a red ball at (2, 3) 2 forward and 1 left, a locked blue door at (3, 2) 3 forward (nearest
    first: 2, 3, 3 steps away; ties by steps forward); the purple ball at (6, 6) is behind (y > 5). Walls: y = 0 is 5 steps forward (minigrid's
    visibility reaches the wall cell behind the door from its open neighbours), x = 0 is 3 steps left,
    x = 7 is 4 right, beyond the 3 cells the view reaches to each side. It carries a yellow key."""
    objects = {(2, 3): Ball("red"), (3, 2): Door("blue", is_locked=True), (5, 5): Door("green", is_open=True)}
    _env, u = scene((3, 5), 3, objects, carrying=Key("yellow"))
    assert describe(u.gen_obs()) == (
        "goal: go to the purple ball\n"
        "an open green door 2 steps right\n"
        "a red ball 2 steps forward and 1 step left\n"
        "a locked blue door 3 steps forward\n"
        "a wall 5 steps forward\n"
        "a wall 3 steps left\n"
        "you carry a yellow key"
    )


def test_forward_into_a_wall_does_not_move():
    env, u = scene((1, 1), 3, {})  # facing up (-y), the wall y = 0 right ahead
    out = env.step(action_text(2))
    assert tuple(u.agent_pos) == (1, 1) and u.agent_dir == 3 and u.step_count == 1
    assert out.reward == 0.0 and not out.done and not out.info["invalid_action"]
    assert "a wall 1 step forward" in out.messages[0]["content"].split("\n")


def test_pick_up_the_object_ahead():
    env, u = scene((3, 3), 0, {(4, 3): Key("red")})  # facing +x, the red key right ahead
    out = env.step(action_text(3))
    assert u.carrying is not None and (u.carrying.type, u.carrying.color) == ("key", "red")
    assert u.grid.get(4, 3) is None and tuple(u.agent_pos) == (3, 3)
    lines = out.messages[0]["content"].split("\n")
    assert lines[-1] == "you carry a red key" and "a red key 1 step forward" not in lines
    env.step(action_text(3))  # hands full: a second pick up changes nothing
    assert u.carrying.color == "red"


def test_toggle_a_locked_door_without_its_key():
    door = Door("blue", is_locked=True)
    env, _u = scene((3, 3), 0, {(4, 3): door}, carrying=Key("red"))  # the wrong key
    out = env.step(action_text(5))
    assert door.is_locked and not door.is_open
    assert "a locked blue door 1 step forward" in out.messages[0]["content"].split("\n")
    env, _u = scene((3, 3), 0, {(4, 3): door}, carrying=Key("blue"))  # the right key opens it
    out = env.step(action_text(5))
    assert not door.is_locked and door.is_open
    assert "an open blue door 1 step forward" in out.messages[0]["content"].split("\n")


def test_drop_puts_the_carried_object_ahead():
    env, u = scene((3, 3), 1, {}, carrying=Box("green"))  # facing +y, (3, 4) free
    out = env.step(action_text(4))
    assert u.carrying is None and u.grid.get(3, 4).type == "box"
    lines = out.messages[0]["content"].split("\n")
    assert "a green box 1 step forward" in lines and not any(x.startswith("you carry") for x in lines)
    env, u = scene((1, 1), 3, {}, carrying=Box("green"))  # facing the wall: nowhere to drop it
    env.step(action_text(4))
    assert u.carrying is not None


HOSTILE = [
    "",
    " ",
    "<action></action>",
    "<action>go forward</action><action>turn left</action>",
    "<action>jump</action>",
    "<action>done</action>",
    "<action>forward</action>",
    "<action>" + "go forward " * 2000 + "</action>",
    "<action>go forward",
    "go forward</action>",
    "go forward",
    "<action>go\nforward<action>",
    "\x00\ud800<action>\u202ego forward</action>",
    "<action>__import__('os').system('echo pwned')</action>",
    "{" * 5000,
    "<action>" * 3000,
    "x" * 1_000_000,
    None,
    b"<action>go forward</action>",
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_replies_never_raise_nor_move_the_agent(text):
    env = make_env(level=LEVEL, malformed_penalty=-0.5)
    env.reset(row(6))
    u = env.env.unwrapped
    before = (tuple(u.agent_pos), u.agent_dir, u.step_count, env.state_key())
    out = env.step(text)
    assert not out.done and out.info["invalid_action"] and out.info["format_error"]
    assert out.reward == pytest.approx(-0.1 - 0.5)
    content = out.messages[0]["content"]
    assert content.startswith("Invalid action:") and len(content) < 500
    assert content.endswith("\na wall 3 steps forward\na wall 3 steps left")  # the unchanged view
    assert (tuple(u.agent_pos), u.agent_dir, u.step_count, env.state_key()) == before
    assert json.loads(out.info["task_metrics"]) == {"success": 0.0, "invalid_action": 1.0}


@pytest.mark.parametrize(
    ("text", "index"),
    [
        ("<action>turn left</action>", 0),
        ("<action> Turn  RIGHT </action>", 1),
        ("I will <action>go forward</action>", 2),
        ("<ACTION>pick up</ACTION>", 3),
        ("<action>drop</action>", 4),
        ("<action>toggle</action>", 5),
    ],
)
def test_parse_action_accepts_one_named_action(text, index):
    assert parse_action(text) == index


def test_state_key_is_the_world_not_the_text():
    env = make_env(level=LEVEL)
    env.reset(row(6))
    k0 = env.state_key()
    env.step(action_text(0))
    k1 = env.state_key()
    env.step(action_text(1))  # turned back: the same state again
    assert k1 != k0 and env.state_key() == k0
    env.step(action_text(2))
    assert env.state_key() != k0
    # what it carries is part of the state, though the agent has not moved
    env, _u = scene((3, 3), 0, {(4, 3): Key("red")})
    env.step(action_text(0))
    env.step(action_text(1))
    before = env.state_key()
    env.step(action_text(3))
    assert env.state_key() != before and env.state_key().split("|")[0] == before.split("|")[0]


@pytest.mark.parametrize("level", ["BabyAI-GoToSeqS5R2-v0", "BabyAI-SynthSeq-v0"])
def test_state_key_of_a_sequence_level_is_the_world_not_the_verifiers_flags(level):
    """On a sequence level ("A, then B", "A and B") the verifier's progress flags turn from False to
    'continue' at the first step though nothing was done: turning left then right comes back to the
    start state, and so must its key."""
    env = make_env(level=level)
    env.reset(row(1))
    k0 = env.state_key()
    env.step(action_text(0))
    assert env.state_key() != k0
    env.step(action_text(1))
    assert env.state_key() == k0
    u = env.env.unwrapped
    before = state_key(u)
    u.instrs.a_done = "success"  # a finished first part is progress
    assert state_key(u) != before


def test_level_generation_prints_nothing(monkeypatch, capsys):
    """GoToLocalS8N4 seed 349: minigrid rejects one layout and prints a line about it. A stage's
    Prefect flow replaces the builtin print by its logger (log_prints), so the line must not reach
    print at all, nor stdout; the generator's own print is back afterwards."""
    import builtins

    from minigrid.envs.babyai.core import roomgrid_level

    printed = []
    monkeypatch.setattr(builtins, "print", lambda *args, **kwargs: printed.append(args))
    direct = gym.make("BabyAI-GoToLocalS8N4-v0")
    direct.reset(seed=349)
    assert printed and str(printed[0][0]).startswith("Sampling rejected")  # what minigrid does alone
    printed.clear()
    env = make_env(level="BabyAI-GoToLocalS8N4-v0")
    env.reset(row(349))
    assert printed == [] and capsys.readouterr().out == ""
    assert "print" not in vars(roomgrid_level)


def test_reset_needs_a_seed_and_gives_the_prompt():
    env = make_env(level=LEVEL)
    with pytest.raises(KeyError, match="has no 'seed'"):
        env.reset({"id": "r"})
    messages = env.reset(row(6))
    assert messages == initial_messages({"question": messages[1]["content"]})


def test_settings_come_from_the_prepare_output(tmp_path):
    (tmp_path / "env.json").write_text(
        json.dumps({"level": "BabyAI-GoToObj-v0", "env_max_steps": 20, "invalid_penalty": -0.3})
    )
    env = make_env(data_dir=tmp_path)
    env.reset(row(1))
    assert env.env.unwrapped.max_steps == 20 and type(env.env.unwrapped).__name__ == "GoToObj"
    assert env.step("nonsense").reward == pytest.approx(-0.3)


def test_the_prepare_outputs_settings_replace_the_arguments(tmp_path):
    assert make_env(level=LEVEL, invalid_penalty=-0.5).invalid_reward == pytest.approx(-0.5)
    saved = {"level": "BabyAI-GoToLocalS8N4-v0", "env_max_steps": None, "invalid_penalty": -0.2}
    (tmp_path / "env.json").write_text(json.dumps(saved))
    env = make_env(data_dir=tmp_path, level=LEVEL, invalid_penalty=-0.5)
    assert env.invalid_reward == pytest.approx(-0.2)  # the data were made with env.json's settings
    assert env.env.spec.id == "BabyAI-GoToLocalS8N4-v0"


def test_noop_penalty_lands_on_an_action_that_changed_nothing_only():
    """Facing the top wall: turning changes the state (no penalty), going forward into the wall and
    picking up nothing do not (noop_penalty); an unparseable reply costs invalid_penalty instead."""
    env, u = scene((1, 1), 3, {}, noop_penalty=-0.5)
    assert env.step(action_text(1)).reward == 0.0  # turn right: faces +x (the scene's first step)
    assert env.step(action_text(0)).reward == 0.0  # turn left: faces the wall again
    assert env.step(action_text(2)).reward == pytest.approx(-0.5)  # forward into the wall
    assert env.step(action_text(3)).reward == pytest.approx(-0.5)  # pick up: nothing ahead
    assert env.step("nonsense").reward == pytest.approx(-0.1)  # invalid: invalid_penalty only
    assert env.step(action_text(1)).reward == 0.0 and u.agent_dir == 0
    off, _ = scene((1, 1), 3, {})
    off.step(action_text(1))
    off.step(action_text(0))
    assert off.step(action_text(2)).reward == 0.0  # off by default


def test_repeat_hint_ends_the_system_prompt_only_when_on(tmp_path):
    from components.tasks.babyai.params import BabyAIParams
    from components.tasks.prompts import REPEAT_HINT

    system = make_env(level=LEVEL).reset(row(1))[0]["content"]
    assert REPEAT_HINT not in system
    assert make_env(level=LEVEL, repeat_hint=True).reset(row(1))[0]["content"] == f"{system} {REPEAT_HINT}"
    settings = BabyAIParams(level=LEVEL, repeat_hint=True, noop_penalty=-0.2).env_settings()
    (tmp_path / "env.json").write_text(json.dumps(settings))
    assert make_env(data_dir=tmp_path).reset(row(1))[0]["content"].endswith(REPEAT_HINT)
    (tmp_path / "env.json").write_text(
        json.dumps({"level": LEVEL, "env_max_steps": None, "invalid_penalty": -0.1})
    )
    assert REPEAT_HINT not in make_env(data_dir=tmp_path).reset(row(1))[0]["content"]  # data before the hint
