"""The sokoban task's environment: a Gymnasium ``SokobanEnv`` and its text codec, driven by GymTextEnv.

``SokobanEnv`` is a plain ``gymnasium.Env``: ``reset(options={"level": <XSB text>})`` loads a level (a
task row's ``level`` column), ``Discrete(4)`` actions (0 up, 1 down, 2 left, 3 right), observations
are the grid as an (H, W) array of cell codes. Rewards are RAGEN's (after gym-sokoban): every move
``step_penalty``; pushing a box onto a target ``box_on_target``, off one ``box_off_target``; all boxes on
targets ``success_reward`` and the episode terminates; a move that changed nothing (into a wall, or a
box that cannot move) adds ``noop_penalty`` (0 by default: RAGEN has none). ``info`` has
``boxes_on_target``, ``moved``, ``blocked`` and ``is_success``.

The text codec shows the grid with RAGEN's symbols (``render`` in level.py), after the line "Nothing
moved." when the last move changed nothing (``blocked_note``, off by default), then (``offsets``, on by
default) one line per unplaced box saying where it is from the player and where its nearest target is
from it, and parses an action written
as ``<action>up</action>`` (case-insensitive; up, down, left, right). Anything else is an invalid action:
the model is told why and sees the unchanged grid, the step costs ``step_penalty + invalid_penalty``.
With ``repeat_hint`` the system prompt ends with BALROG's line against repeating an action that
changed nothing (components.tasks.prompts.REPEAT_HINT). The state key of a step is the grid state (player and boxes), GiGPO's anchor state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from components.envs.gym_text import GymTextEnv, InvalidAction, TextCodec
from components.tasks.prompts import with_repeat_hint
from components.tasks.sokoban.level import (
    ACTIONS,
    SYMBOLS,
    Level,
    State,
    apply,
    crop_walls,
    draw,
    parse_xsb,
    render,
)
from components.tasks.sokoban.prompts import SYSTEM_PROMPT, intro

__all__ = ["CODEC", "SokobanEnv", "codec", "make_env", "parse_action", "tools"]

# The reward settings prepare saves beside the task tables (from the tasks.sokoban section).
ENV_FILE = "env.json"
# Cell codes of the observation array.
WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = range(7)

_ACTION_RE = re.compile(r"<action>\s*([A-Za-z]{1,16})\s*</action>")


class SokobanEnv(gym.Env):
    """Sokoban on a given level (``reset(options={"level": xsb})``); see the module docstring."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        *,
        step_penalty: float = -0.1,
        box_on_target: float = 1.0,
        box_off_target: float = -1.0,
        success_reward: float = 10.0,
        noop_penalty: float = 0.0,
        max_size: int = 16,
    ) -> None:
        self.step_penalty = step_penalty
        self.noop_penalty = noop_penalty
        self.box_on_target = box_on_target
        self.box_off_target = box_off_target
        self.success_reward = success_reward
        self.action_space = gym.spaces.Discrete(len(ACTIONS))
        self.observation_space = gym.spaces.Box(0, PLAYER_ON_TARGET, (max_size, max_size), dtype=np.int8)
        self.max_size = max_size
        self.level: Level | None = None
        self.state: State | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if not options or "level" not in options:
            raise ValueError("SokobanEnv.reset needs options={'level': <XSB text>}")
        self.level, self.state = parse_xsb(str(options["level"]))
        if max(self.level.height, self.level.width) > self.max_size:
            raise ValueError(f"level is {self.level.height}x{self.level.width}, larger than {self.max_size}")
        self.observation_space = gym.spaces.Box(
            0, PLAYER_ON_TARGET, (self.level.height, self.level.width), dtype=np.int8
        )
        return self._obs(), self._info(moved=False, stepped=False)

    def step(self, action: int):
        if self.level is None or self.state is None:
            raise RuntimeError("step() called before reset()")
        before = len(self.state.boxes & self.level.targets)
        self.state, moved = apply(self.level, self.state, ACTIONS[int(action)])
        after = len(self.state.boxes & self.level.targets)
        reward = self.step_penalty
        reward += self.box_on_target * max(after - before, 0) + self.box_off_target * max(before - after, 0)
        if not moved:
            reward += self.noop_penalty
        success = after == len(self.state.boxes)
        if success:
            reward += self.success_reward
        return self._obs(), reward, success, False, self._info(moved=moved, stepped=True)

    def _obs(self) -> np.ndarray:
        assert self.level is not None and self.state is not None
        grid = np.full((self.level.height, self.level.width), FLOOR, dtype=np.int8)
        for r, c in self.level.targets:
            grid[r, c] = TARGET
        for r, c in self.level.walls:
            grid[r, c] = WALL
        for r, c in self.state.boxes:
            grid[r, c] = BOX_ON_TARGET if (r, c) in self.level.targets else BOX
        r, c = self.state.player
        grid[r, c] = PLAYER_ON_TARGET if (r, c) in self.level.targets else PLAYER
        return grid

    def _info(self, *, moved: bool, stepped: bool) -> dict[str, Any]:
        assert self.level is not None and self.state is not None
        on = len(self.state.boxes & self.level.targets)
        return {
            "boxes_on_target": on,
            "moved": moved,
            "blocked": stepped and not moved,  # a move that changed nothing
            "is_success": on == len(self.state.boxes),
            "state_key": self.state.key(),
        }

    def render(self) -> str:  # Gymnasium's ansi render mode
        assert self.level is not None and self.state is not None
        return render(self.level, self.state)


def parse_action(text: str) -> int:
    """The action index of a reply ``<action>up</action>``; InvalidAction (with the reason) otherwise."""
    found = _ACTION_RE.findall(text)
    if not found:
        raise InvalidAction("reply with one of <action>up</action>, <action>down</action>, "
                            "<action>left</action>, <action>right</action>")  # fmt: skip
    if len(found) > 1:
        raise InvalidAction(f"{len(found)} actions in one reply; give exactly one <action>...</action>")
    name = found[0].lower()
    if name not in ACTIONS:
        raise InvalidAction(f"unknown action {found[0][:16]!r}; the actions are up, down, left, right")
    return ACTIONS.index(name)


def _render_obs(
    obs: Any, info: Mapping[str, Any], *, with_offsets: bool = True, blocked_note: bool = False
) -> str:
    """The observation array as text, exactly as ``level.render`` draws the same state (with its note
    after a move that changed nothing, when ``blocked_note``)."""
    order = ("wall", "floor", "target", "box", "box_on_target", "player", "player_on_target")
    symbols = [SYMBOLS[name] for name in order]  # indexed by cell code
    rows = [[symbols[int(v)] for v in row] for row in np.asarray(obs)]
    blocked = blocked_note and bool(info.get("blocked", False))
    return draw(crop_walls(rows), with_offsets=with_offsets, blocked=blocked)


def codec(*, with_offsets: bool = True, blocked_note: bool = False) -> TextCodec:
    """The text codec: the grid (and, with ``with_offsets``, the box/target offset lines; with
    ``blocked_note``, "Nothing moved." after a move that changed nothing) and ``<action>...</action>``
    replies; the state key is the grid state (player and boxes)."""
    return TextCodec(
        render=lambda obs, info: _render_obs(obs, info, with_offsets=with_offsets, blocked_note=blocked_note),
        parse=parse_action,
        state_key=lambda obs, info: info.get("state_key"),
        metrics=lambda obs, info: {
            "boxes_on_target": float(info.get("boxes_on_target", 0)),
            "success": float(bool(info.get("is_success", False))),
        },
    )


CODEC = codec()


def make_env(
    row: Mapping[str, Any] | None = None,
    *,
    malformed_penalty: float = 0.0,
    data_dir: str | Path | None = None,
    step_penalty: float = -0.1,
    box_on_target: float = 1.0,
    box_off_target: float = -1.0,
    success_reward: float = 10.0,
    blocked_note: bool = False,
    repeat_hint: bool = False,
    noop_penalty: float = 0.0,
    tool_parser: str = "hermes",
) -> GymTextEnv:
    """A fresh sokoban environment (``row`` and ``tool_parser`` are accepted for the common factory
    signature: reset() takes the row, and actions are text, not tool calls). ``malformed_penalty`` (train.malformed_penalty, <= 0) is added to the step penalty
    of an invalid action. The reward settings and ``blocked_note`` given here are the settings when
    ``data_dir`` holds no prepare output (the generator, tests); when it does, ``data_dir/env.json``
    (written from ``tasks.sokoban``) replaces them: the data were made with its settings."""
    settings = {
        "step_penalty": step_penalty,
        "box_on_target": box_on_target,
        "box_off_target": box_off_target,
        "success_reward": success_reward,
        "blocked_note": blocked_note,
        "repeat_hint": repeat_hint,
        "noop_penalty": noop_penalty,
    }
    if data_dir is not None and (Path(data_dir) / ENV_FILE).is_file():
        saved = json.loads((Path(data_dir) / ENV_FILE).read_text())
        # data prepared before the note and the remedies: none of them
        settings.update({"blocked_note": False, "repeat_hint": False, "noop_penalty": 0.0, **saved})
    invalid_penalty = float(settings.pop("invalid_penalty", 0.0))
    with_offsets = bool(settings.pop("offsets", True))
    blocked_note = bool(settings.pop("blocked_note"))
    hint = bool(settings.pop("repeat_hint"))
    env = SokobanEnv(**settings)
    return GymTextEnv(
        env,
        codec(with_offsets=with_offsets, blocked_note=blocked_note),
        with_repeat_hint(SYSTEM_PROMPT, hint),
        intro=lambda row, text: intro(text),
        reset_kwargs=lambda row: {"options": {"level": str(row["level"])}},
        invalid_reward=env.step_penalty + invalid_penalty + malformed_penalty,
    )


def tools() -> list[dict[str, Any]]:
    """Sokoban has no tools: the model writes its move as text."""
    return []
