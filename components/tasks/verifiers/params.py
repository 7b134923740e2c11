"""The verifiers task's params section, ``tasks.verifiers`` in params.yaml.

Validating the section imports nothing (every params load validates every ``tasks.*`` section present):
the environment is loaded, and bad input refused, when prepare or an environment first needs it
(``components.tasks.verifiers.loader.load``). The last validated section is the one whose
environment's tools the recipe's ``tools()`` lists (it takes no arguments), and the one ``make_env``
builds without a prepare output.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from components.tasks.recipe import TaskParams

__all__ = ["DEFAULT_ENV", "VerifiersParams", "current"]

# The TextArena Mastermind environment shipped in this repo (a verifiers environment module).
DEFAULT_ENV = "components.tasks.verifiers.envs.mastermind"

_CURRENT: dict[str, Any] = {}


class VerifiersParams(TaskParams):
    # The verifiers environment: the module or package that exports its Taskset (and, for a game,
    # its Env) in __all__, as `vf-eval <id>` takes it (an installed package name, or a dotted module).
    env: str = Field(DEFAULT_ENV, min_length=1)
    # The taskset's config fields (its TasksetConfig subclass validates them; an unknown key is an
    # error naming it).
    args: dict[str, Any] = Field(default_factory=dict)
    # Model replies one episode may give the environment; at the last one the environment's turn is
    # ended (verifiers' own "max_turns" stop: its run() sees a terminated segment and is scored). An
    # environment that asks for a turn after that ends the episode with the error "turn_after_end".
    max_turns: int = Field(10, ge=1, le=1000)
    # Seconds the environment may take to answer one reply (its run() between two turns, a tool
    # call, or its scoring); past it the episode ends with the error "env_timeout".
    turn_timeout_s: float = Field(60.0, gt=0, le=3600)
    # An episode is "correct" when the rubric's weighted reward is at least this.
    success_reward: float = 1.0

    @model_validator(mode="after")
    def _remember(self) -> VerifiersParams:
        _CURRENT["section"] = self
        return self

    def turns_needed(self) -> int | None:
        return self.max_turns

    def generates_train_rows(self) -> bool:
        return True


def current() -> VerifiersParams:
    """The last validated section (the defaults when none was)."""
    return _CURRENT.get("section") or VerifiersParams()
