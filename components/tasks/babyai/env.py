"""The babyai task's environment: a BabyAI level made by minigrid, driven as text by GymTextEnv.

The level is ``gymnasium.make(level)``, stepped by minigrid as it ships: its layouts, dynamics,
partial view, time limit and reward (``1 - 0.9 * steps / max_steps`` on success, 0 otherwise). A
task row's ``seed`` is the ``reset`` seed, which makes the level. :class:`WorldState` is a Gymnasium
wrapper that only reads: it adds to ``info`` the world state GiGPO groups steps by (``state_key``),
``is_success`` and the agent's position, and changes nothing minigrid returns.

The text codec (``text.py``) writes the observation as short sentences and parses
``<action>go forward</action>``; anything else is an invalid action: the model is told why and sees
the unchanged observation, the world does not step, and the turn costs ``invalid_penalty`` (plus
``train.malformed_penalty``). :class:`NoopPenalty` marks a valid action after which the world state is
unchanged (``info["blocked"]``) and adds ``noop_penalty`` to its reward (0 by default); with
``repeat_hint`` the system prompt ends with BALROG's line against repeating such an action.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import minigrid  # noqa: F401  (registers the BabyAI-* environments)
from minigrid.envs.babyai.core import roomgrid_level

from components.envs.gym_text import GymTextEnv, TextCodec
from components.tasks.babyai.prompts import SYSTEM_PROMPT, intro
from components.tasks.babyai.text import describe, parse_action
from components.tasks.prompts import with_repeat_hint

__all__ = [
    "CODEC",
    "ENV_FILE",
    "NoopPenalty",
    "WorldState",
    "make_env",
    "make_level",
    "quiet_level_generation",
    "state_key",
    "tools",
]

# The settings prepare saves beside the task tables (from the tasks.babyai section).
ENV_FILE = "env.json"
DEFAULT_LEVEL = "BabyAI-GoToLocalS8N4-v0"


def _progress(instr: Any) -> list[bool]:
    """How far a sequence instruction (``A, then B``, ``A and B``, ``A after you B``) has got: whether
    its verifier's ``a_done`` / ``b_done`` is "success", recursively; [] for a single instruction.

    Only "success" is progress: the verifier holds False before the first step and "continue" after
    it (and "failure" ends the episode), so a revisited state must not see the difference."""
    if hasattr(instr, "instr_a"):
        return [getattr(instr, "a_done", None) == "success", getattr(instr, "b_done", None) == "success",
                *_progress(instr.instr_a), *_progress(instr.instr_b)]  # fmt: skip
    return []


def state_key(env: gym.Env) -> str:
    """The world state that decides what happens next: the agent's position and direction, what it
    carries, every cell of the grid (objects, their colours, doors open / closed / locked), and how far
    a sequence instruction has got. Not the text: two views of one state share a key."""
    u = env.unwrapped
    carrying = u.carrying.encode() if u.carrying is not None else None
    grid = hashlib.sha1(u.grid.encode().tobytes()).hexdigest()[:16]
    x, y = (int(v) for v in u.agent_pos)
    return f"{x},{y},{int(u.agent_dir)}|{carrying}|{grid}|{_progress(u.instrs)}"


@contextlib.contextmanager
def quiet_level_generation() -> Iterator[None]:
    """Silence the line minigrid's BabyAI level generator prints for each layout it rejects while
    making a level ("Sampling rejected: unreachable object at (5, 1)", now and then several per level).

    It calls the builtin ``print``, which a Prefect flow with ``log_prints`` replaces by its run logger,
    so redirecting stdout does not stop the lines reaching the stage logs: for the duration, the
    generator's module gets a ``print`` of its own that drops them (restored on exit)."""
    module = vars(roomgrid_level)
    had, old = "print" in module, module.get("print")
    module["print"] = lambda *args, **kwargs: None
    try:
        yield
    finally:
        if had:
            module["print"] = old
        else:
            del module["print"]


class WorldState(gym.Wrapper):
    """Adds ``state_key``, ``is_success`` and ``agent`` (x, y, direction) to minigrid's ``info``;
    ``reset`` makes the level without minigrid's rejected-layout lines (:func:`quiet_level_generation`)."""

    def reset(self, **kwargs):
        with quiet_level_generation():
            obs, info = self.env.reset(**kwargs)
        return obs, self._info(info, success=False)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, self._info(info, success=bool(terminated and reward > 0))

    def _info(self, info: Mapping[str, Any], *, success: bool) -> dict[str, Any]:
        u = self.env.unwrapped
        x, y = (int(v) for v in u.agent_pos)
        return {
            **info,
            "state_key": state_key(self.env),
            "is_success": success,
            "agent": (x, y, int(u.agent_dir)),
        }


class NoopPenalty(gym.Wrapper):
    """Over :class:`WorldState`: ``info["blocked"]`` when an action left the world state (its
    ``state_key``) as it was, and ``penalty`` (<= 0) added to that step's reward."""

    def __init__(self, env: gym.Env, penalty: float = 0.0) -> None:
        super().__init__(env)
        self.penalty = float(penalty)
        self._key: str | None = None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._key = info["state_key"]
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        blocked = info["state_key"] == self._key
        self._key = info["state_key"]
        return (
            obs,
            reward + (self.penalty if blocked else 0.0),
            terminated,
            truncated,
            {**info, "blocked": blocked},
        )


def make_level(level: str = DEFAULT_LEVEL, env_max_steps: int | None = None) -> WorldState:
    """The BabyAI level ``level`` as minigrid makes it (``env_max_steps``: its time limit; None = the
    level's own), wrapped in :class:`WorldState`."""
    kwargs = {} if env_max_steps is None else {"max_steps": int(env_max_steps)}
    return WorldState(gym.make(level, **kwargs))


CODEC = TextCodec(
    render=lambda obs, info: describe(obs),
    parse=parse_action,
    state_key=lambda obs, info: info.get("state_key"),
    metrics=lambda obs, info: {"success": float(bool(info.get("is_success", False)))},
)


def _reset_kwargs(row: Mapping[str, Any]) -> dict[str, Any]:
    if row.get("seed") is None:
        raise KeyError(f"babyai task row {row.get('id')!r} has no 'seed' (the level's reset seed)")
    return {"seed": int(row["seed"])}


def make_env(
    row: Mapping[str, Any] | None = None,
    *,
    malformed_penalty: float = 0.0,
    data_dir: str | Path | None = None,
    level: str = DEFAULT_LEVEL,
    env_max_steps: int | None = None,
    invalid_penalty: float = -0.1,
    repeat_hint: bool = False,
    noop_penalty: float = 0.0,
    tool_parser: str = "hermes",
) -> GymTextEnv:
    """A fresh babyai environment (``row`` and ``tool_parser`` are accepted for the common factory
    signature: reset() takes the row, and actions are text, not tool calls). ``level``, ``env_max_steps`` and ``invalid_penalty`` are the settings when ``data_dir``
    holds no prepare output (the generator, tests); when it does, ``data_dir/env.json`` (written from
    ``tasks.babyai``) replaces them: the data were made with its settings. ``malformed_penalty``
    (train.malformed_penalty, <= 0) is added to an invalid action's penalty."""
    settings: dict[str, Any] = {
        "level": level,
        "env_max_steps": env_max_steps,
        "invalid_penalty": invalid_penalty,
        "repeat_hint": repeat_hint,
        "noop_penalty": noop_penalty,
    }
    if data_dir is not None and (Path(data_dir) / ENV_FILE).is_file():
        # data prepared before the remedies: none of them
        settings.update({"repeat_hint": False, "noop_penalty": 0.0})
        settings.update(json.loads((Path(data_dir) / ENV_FILE).read_text()))
    env = NoopPenalty(make_level(str(settings["level"]), settings["env_max_steps"]), settings["noop_penalty"])
    return GymTextEnv(
        env,
        CODEC,
        with_repeat_hint(SYSTEM_PROMPT, bool(settings["repeat_hint"])),
        intro=lambda row, text: intro(text),
        reset_kwargs=_reset_kwargs,
        invalid_reward=float(settings["invalid_penalty"]) + malformed_penalty,
    )


def tools() -> list[dict[str, Any]]:
    """BabyAI has no tools: the model writes its action as text."""
    return []
