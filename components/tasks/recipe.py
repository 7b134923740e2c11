"""TaskRecipe: everything a pipeline needs from a task, under one registered name.

A task folder builds one TaskRecipe and registers it (``register_task(name, recipe)``); flows look it
up with ``get_task(params.task)`` and never import a task directly. It holds functions only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from components.envs.base import AgentEnv

__all__ = ["TaskRecipe"]


@dataclass(frozen=True)
class TaskRecipe:
    name: str
    # (seed, n_train, n_val, n_test, min_calls, max_calls, max_operand, weak_max_calls, weak_per_question)
    #   -> {"train", "val", "test"} tables
    generate_splits: Callable[..., dict[str, pl.DataFrame]]
    # (path, *, seed, n_train, n_val, n_test) -> {"train", "val", "test"} tables from a file
    load_splits: Callable[..., dict[str, pl.DataFrame]]
    # (row=None, **options) -> a fresh environment; reset(row) starts an episode
    make_env: Callable[..., AgentEnv]
    # () -> OpenAI tool schemas
    tools: Callable[[], list[dict[str, Any]]]
    # (final_text, ground_truth_answer) -> outcome reward
    reward: Callable[[str, str], float]
    # row -> [system, user] messages
    initial_messages: Callable[[Mapping[str, Any]], list[dict[str, Any]]]
    # row -> expert messages after the user prompt
    expert_messages: Callable[[Mapping[str, Any]], list[dict[str, Any]]]
    # row -> every demonstration SFT imitates for the row (the expert's first, then any weaker ones)
    demonstrations: Callable[[Mapping[str, Any]], list[list[dict[str, Any]]]]

    def prepare(
        self,
        *,
        seed: int,
        n_train: int,
        n_val: int,
        n_test: int,
        min_calls: int,
        max_calls: int,
        max_operand: int,
        weak_max_calls: int = 0,
        weak_per_question: float = 0.0,
        source_path: str | Path | None = None,
    ) -> dict[str, pl.DataFrame]:
        """The three splits: generated, or loaded from ``source_path`` when given."""
        if source_path is not None:
            return self.load_splits(source_path, seed=seed, n_train=n_train, n_val=n_val, n_test=n_test)
        return self.generate_splits(
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
            min_calls=min_calls,
            max_calls=max_calls,
            max_operand=max_operand,
            weak_max_calls=weak_max_calls,
            weak_per_question=weak_per_question,
        )
