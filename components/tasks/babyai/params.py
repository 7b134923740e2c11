"""The babyai task's params section, ``tasks.babyai`` in params.yaml."""

from __future__ import annotations

import gymnasium as gym
import minigrid  # noqa: F401  (importing it registers the BabyAI-* environments with Gymnasium)
from pydantic import Field, field_validator, model_validator

from components.tasks.recipe import TaskParams

__all__ = ["BabyAIParams", "babyai_levels"]


def babyai_levels() -> list[str]:
    """The BabyAI environment ids that minigrid registers with Gymnasium (``BabyAI-GoToLocal-v0``, ...)."""
    return sorted(name for name in gym.registry if name.startswith("BabyAI-"))


class BabyAIParams(TaskParams):
    # The BabyAI level: a Gymnasium id that minigrid registers (BabyAI-GoToLocal-v0, BabyAI-PickupLoc-v0...).
    level: str = "BabyAI-GoToLocalS8N4-v0"
    # The level's own time limit (minigrid's max_steps, in its reward 1 - 0.9 * steps / max_steps);
    # null = the level's default (GoToLocal levels: 64).
    env_max_steps: int | None = Field(None, ge=1, le=10_000)
    # Levels the bot needs more than max_moves actions for are dropped (and counted); an episode needs up
    # to max_moves turns: rollout.max_steps >= max_moves is checked at load.
    max_moves: int = Field(12, ge=1, le=1000)
    # An invalid action (no step in the world) costs invalid_penalty; minigrid's own steps cost nothing.
    invalid_penalty: float = Field(-0.1, le=0)
    # Remedies for greedy agents that repeat an action that changed nothing (docs/evaluation.md), off by
    # default. repeat_hint: BALROG's line "It doesn't make sense to repeat the same action over and
    # over if the observation doesn't change." ends the system prompt of every episode (rollouts,
    # validation, evaluation; SFT's demonstrations keep the prompt without it). noop_penalty: added to
    # the reward of a valid action after which the world state (the state key) is unchanged (going
    # forward into a wall, picking up nothing); an unparseable reply costs invalid_penalty instead.
    # 0 = off.
    repeat_hint: bool = False
    noop_penalty: float = Field(0.0, le=0, ge=-10)
    # Weaker demonstrations beside the bot's (train split): the bot, but with probability weak_epsilon
    # each turn a random move (turn left, turn right, go forward) instead of its own action; the bot
    # replans from wherever that leaves it. Only episodes solved within max_moves + weak_extra_moves
    # are kept. weak_per_question per level on average (0 = the bot's demonstrations only).
    # imitate_detours: SFT imitates the random moves too (true), or reads them as context only (false:
    # the reply has weight 0, so SFT learns the bot's way back from where a detour left it, DAgger's
    # idea, and not the detour; a random move that is the bot's own choice stays a label).
    weak_per_question: float = Field(0.0, ge=0, le=16)
    weak_epsilon: float = Field(0.25, ge=0, le=1)
    weak_extra_moves: int = Field(4, ge=0, le=100)
    imitate_detours: bool = True

    @field_validator("level")
    @classmethod
    def _known_level(cls, level: str) -> str:
        known = babyai_levels()
        if level not in known:
            near = [k for k in known if level.lower().replace("babyai-", "")[:4] in k.lower()][:8]
            raise ValueError(
                f"{level!r} is not a BabyAI level registered by minigrid "
                f"({len(known)} known, e.g. {near or known[:8]})"
            )
        return level

    @model_validator(mode="after")
    def _bounds(self) -> BabyAIParams:
        if self.env_max_steps is not None and self.env_max_steps < self.max_moves:
            raise ValueError(
                f"env_max_steps={self.env_max_steps} < max_moves={self.max_moves}: the level would end "
                "before the bot's longest kept episode"
            )
        return self

    def turns_needed(self) -> int | None:
        return self.max_moves  # one action per turn: the bot's longest kept episode

    def env_settings(self) -> dict[str, str | int | float | None]:
        """The settings the environment reads (saved by prepare as env.json)."""
        return {
            "level": self.level,
            "env_max_steps": self.env_max_steps,
            "invalid_penalty": self.invalid_penalty,
            "repeat_hint": self.repeat_hint,
            "noop_penalty": self.noop_penalty,
        }
