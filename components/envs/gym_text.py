"""GymTextEnv: any Gymnasium environment as a steprl AgentEnv, through a text codec.

Gymnasium's ``Env`` (``reset(seed=, options=) -> (obs, info)``, ``step(action) -> (obs, reward,
terminated, truncated, info)``) is the ecosystem's standard interface; this adapter adds only what an
LLM agent needs around it, in a :class:`TextCodec`:

- ``render(obs, info) -> str``: the observation as the text of a user message;
- ``parse(text) -> action``: the model's response as an action of the env's ``action_space``, raising
  :class:`InvalidAction` with feedback for the model when the text names none;
- ``state_key(obs, info) -> str | None``: a key of the environment state (GiGPO's anchor states), or None.

An invalid action (unparseable text, or a parsed action outside ``action_space``) does not reach the
env: the model gets the reason and the unchanged observation, the step's reward is ``invalid_reward``,
and the episode goes on (``info["invalid_action"]``, ``info["format_error"]``). Whatever the model writes,
``step`` never raises. ``terminated`` ends the episode; the env's own ``truncated`` (e.g. a TimeLimit
wrapper) ends it as truncated. A success is ``info["is_success"]`` (Gymnasium's convention) or the
codec's ``success(obs, reward, terminated, info)``; it is the step's ``correct``. ``codec.metrics``
(optional) gives per-step task numbers, stored as JSON in ``info["task_metrics"]``.

Does not: count turns (the agent loop's ``max_steps``), or render tokens (the chat template does).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from components.envs.base import AgentEnv, StepOutcome

__all__ = ["GymTextEnv", "InvalidAction", "TextCodec"]


class InvalidAction(ValueError):
    """The model's text names no valid action; the message is shown to the model."""


@dataclass(frozen=True)
class TextCodec:
    render: Callable[[Any, Mapping[str, Any]], str]
    parse: Callable[[str], Any]
    state_key: Callable[[Any, Mapping[str, Any]], str | None] | None = None
    success: Callable[[Any, float, bool, Mapping[str, Any]], bool] | None = None
    metrics: Callable[[Any, Mapping[str, Any]], Mapping[str, float]] | None = None


def _reset_kwargs(row: Mapping[str, Any]) -> dict[str, Any]:
    """``seed`` and ``options`` of ``env.reset`` from a task row: its ``seed`` column (int) and its
    ``options`` column (a JSON object), where present."""
    kwargs: dict[str, Any] = {}
    if row.get("seed") is not None:
        kwargs["seed"] = int(row["seed"])
    raw = row.get("options")
    if raw:
        options = json.loads(raw) if isinstance(raw, str) else dict(raw)
        if not isinstance(options, dict):
            raise ValueError(f"task row {row.get('id')!r}: column 'options' is not a JSON object")
        kwargs["options"] = options
    return kwargs


class GymTextEnv(AgentEnv):
    """A Gymnasium env driven by text: see the module docstring."""

    def __init__(
        self,
        env: gym.Env,
        codec: TextCodec,
        system_prompt: str,
        *,
        intro: Callable[[Mapping[str, Any], str], str] | None = None,
        reset_kwargs: Callable[[Mapping[str, Any]], dict[str, Any]] = _reset_kwargs,
        invalid_reward: float = 0.0,
        max_action_chars: int = 4096,
    ) -> None:
        if not isinstance(env, gym.Env):
            raise TypeError(f"env must be a gymnasium.Env, got {type(env).__name__}")
        if not math.isfinite(invalid_reward):
            raise ValueError(f"invalid_reward must be finite, got {invalid_reward}")
        self.env = env
        self.codec = codec
        self.system_prompt = system_prompt
        self.intro = intro or (lambda row, obs_text: obs_text)
        self.reset_kwargs = reset_kwargs
        self.invalid_reward = float(invalid_reward)
        self.max_action_chars = max_action_chars
        self.tools: list[dict[str, Any]] = []
        self._obs: Any = None
        self._info: Mapping[str, Any] = {}
        self._done = True

    def reset(self, row: Mapping[str, Any]) -> list[dict[str, Any]]:
        self._obs, self._info = self.env.reset(**self.reset_kwargs(row))
        self._done = False
        text = self.codec.render(self._obs, self._info)
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self.intro(row, text)},
        ]

    def state_key(self) -> str | None:
        if self.codec.state_key is None or self._obs is None:
            return None
        return self.codec.state_key(self._obs, self._info)

    def step(self, action_text: str) -> StepOutcome:
        if self._obs is None:
            raise RuntimeError("step() called before reset()")
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        try:
            action = self._parse(action_text)
        except InvalidAction as err:
            info = {"invalid_action": True, "format_error": True, "correct": False}
            self._add_metrics(info, invalid=True)
            text = f"Invalid action: {err}\n{self.codec.render(self._obs, self._info)}"
            return StepOutcome([{"role": "user", "content": text}], self.invalid_reward, False, info)
        obs, reward, terminated, truncated, env_info = self.env.step(action)
        reward = float(reward)
        if not math.isfinite(reward):
            raise ValueError(f"{type(self.env).__name__}.step returned a non-finite reward {reward!r}")
        self._obs, self._info = obs, env_info
        self._done = bool(terminated or truncated)
        success = bool(env_info.get("is_success", False))
        if self.codec.success is not None:
            success = bool(self.codec.success(obs, reward, bool(terminated), env_info))
        info: dict[str, Any] = {"invalid_action": False, "format_error": False, "correct": success}
        self._add_metrics(info, invalid=False)
        messages = [] if self._done else [{"role": "user", "content": self.codec.render(obs, env_info)}]
        return StepOutcome(messages, reward, self._done, info, truncated=bool(truncated and not terminated))

    def _parse(self, text: str) -> Any:
        if not isinstance(text, str):
            raise InvalidAction(f"expected text, got {type(text).__name__}")
        if len(text) > self.max_action_chars:
            raise InvalidAction(f"the reply is {len(text)} characters long (at most {self.max_action_chars})")
        action = self.codec.parse(text)
        if not self.env.action_space.contains(action):
            raise InvalidAction(f"{action!r} is not an action of this environment")
        return action

    def _add_metrics(self, info: dict[str, Any], *, invalid: bool) -> None:
        if self.codec.metrics is None:
            return
        metrics = dict(self.codec.metrics(self._obs, self._info))
        metrics["invalid_action"] = float(invalid)
        info["task_metrics"] = json.dumps(metrics)
