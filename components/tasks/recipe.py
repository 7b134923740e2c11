"""TaskRecipe: everything a pipeline needs from a task, under one registered name.

A task is a plug-in: a module (a folder ``components/tasks/<name>/`` for a built-in task, or any
importable module listed in params ``plugins``) that builds one TaskRecipe and registers it with
``register_task(name, recipe)``. Flows look it up with ``get_task(params.task)`` and never import a
task directly. A recipe holds functions and its params model only:

- ``params_model``: a :class:`TaskParams` subclass, the task's own typed section ``tasks.<name>`` of
  params.yaml (validated at load with the rest; errors name ``tasks.<name>.<key>``; an omitted section
  means the model's defaults).
- ``make_splits(section, *, seed, n_train, n_val, n_test, root, data_dir)``: the
  ``{"train", "val", "test"}`` tables (TaskSchema: id, question, answer, expert, split, n_calls, plus
  any extra columns of the task); ``section`` is the validated params model; relative paths in it are
  from ``root``; ``data_dir`` (None outside the prepare stage) is the directory the splits are
  written to (``data/processed/<task>/``, a DVC output), where the task may save what its
  environment needs besides the tables (e.g. a retrieval index). Bad input raises ``ValueError``
  naming the key, file, row or column. Called through :meth:`TaskRecipe.prepare`.
- ``make_env(row=None, *, malformed_penalty=0.0, data_dir=None, tool_parser="hermes")``: a fresh
  environment (tools looked up by name in ``components.envs.TOOLS``); the flows pass ``data_dir`` (the
  prepare output) and ``tool_parser`` (``rollout.tool_parser``: the tool-call format its env reads,
  components.envs.tool_formats; a task without tools accepts and ignores it);
  ``tools()``: the tools' OpenAI schemas ([] for a task without tools, e.g. one whose actions are
  text); ``reward(final_text, answer)`` (optional: the outcome reward of a final answer, for tasks
  that end on one; an environment such as sokoban's rewards each step itself);
  ``initial_messages(row)``: [system, user]; ``expert_messages(row)``: the expert's messages after the
  user prompt; ``demonstrations(row)``: every demonstration SFT imitates (the expert's first).
- ``episode_metrics(steps) -> {name: float}`` (optional): task metrics of finished episodes, ``steps``
  being step records (the rows of a rollouts table: ``traj_id``, ``step``, ``action_text``,
  ``env_feedback``, ``reward``, ``outcome``, ``n_calls``, ...). ``evaluate`` writes them next to the
  generic metrics (accuracy, tool calls) in its metrics json and MLflow run; ``train`` logs them as
  ``task/<name>`` per iteration and ``val/<name>`` at validation. ``None`` = no task metrics.
- ``scores_tool_calls``: True when the task's environment scores each tool call
  (``AgentEnv.process_rewards``: process rewards, weighted by ``train.process_reward_weight``); the
  params check refuses a non-zero weight for a task that does not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import BaseModel, ConfigDict

from components.envs.base import AgentEnv

__all__ = ["TaskParams", "TaskRecipe", "split_sizes", "user_file"]


class TaskParams(BaseModel):
    """Base of a task's params section (``tasks.<name>``): unknown keys, wrong types and out-of-range
    values are errors, as everywhere in params.yaml. Subclass it with the task's own fields."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, validate_default=True)

    def generates_train_rows(self) -> bool:
        """True when the train split has exactly ``prepare.n_train`` rows (generated data), False when
        it comes from a file of unknown size; used to check that ``sft.rows`` leaves RL prompts."""
        return True

    def turns_needed(self) -> int | None:
        """Agent turns the expert's longest episode takes (its tool calls + the answer), when the
        params say (generated data); checked against ``rollout.max_steps`` at load. None: unknown."""
        return None


@dataclass(frozen=True)
class TaskRecipe:
    name: str
    params_model: type[TaskParams]
    make_splits: Callable[..., dict[str, pl.DataFrame]]
    make_env: Callable[..., AgentEnv]
    tools: Callable[[], list[dict[str, Any]]]
    initial_messages: Callable[[Mapping[str, Any]], list[dict[str, Any]]]
    expert_messages: Callable[[Mapping[str, Any]], list[dict[str, Any]]]
    demonstrations: Callable[[Mapping[str, Any]], list[list[dict[str, Any]]]]
    episode_metrics: Callable[[list[dict[str, Any]]], dict[str, float]] | None = None
    reward: Callable[[str, str], float] | None = None
    scores_tool_calls: bool = False

    def params(self, section: Mapping[str, Any] | TaskParams | None = None) -> TaskParams:
        """The validated params section (a mapping, an instance, or None for the defaults).
        Raises pydantic's ValidationError; components.config turns it into a ConfigError."""
        if isinstance(section, self.params_model):
            return section
        return self.params_model.model_validate(dict(section or {}))

    def prepare(
        self,
        section: Mapping[str, Any] | TaskParams | None,
        *,
        seed: int,
        n_train: int,
        n_val: int,
        n_test: int,
        root: str | Path | None = None,
        data_dir: str | Path | None = None,
    ) -> dict[str, pl.DataFrame]:
        """The three splits of this task from its params section (``tasks.<name>``); relative paths of
        the section are from ``root`` (default: the working directory); ``data_dir``: see make_splits."""
        return self.make_splits(
            self.params(section),
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
            root=Path(root) if root is not None else Path.cwd(),
            data_dir=Path(data_dir) if data_dir is not None else None,
        )

    def task_metrics(self, steps: list[dict[str, Any]]) -> dict[str, float]:
        """The task's own episode metrics of ``steps`` ({} without an ``episode_metrics`` hook)."""
        if self.episode_metrics is None or not steps:
            return {}
        return {str(k): float(v) for k, v in self.episode_metrics(steps).items()}


def user_file(value: str, key: str, root: Path) -> Path:
    """A user-supplied data file named by params key ``key`` (e.g. ``tasks.<task>.source_path``): an
    absolute path, or one relative to ``root`` (the repo); the error names the key when it is missing."""
    path = Path(value)
    path = path if path.is_absolute() else root / path
    if not path.is_file():
        raise ValueError(f"{key}: {value!r} does not exist")
    return path


def split_sizes(n_train: int, n_val: int, n_test: int) -> dict[str, int]:
    """``{"train": n_train, "val": n_val, "test": n_test}``; a negative size is a ValueError naming it."""
    sizes = {"train": n_train, "val": n_val, "test": n_test}
    for split, value in sizes.items():
        if value < 0:
            raise ValueError(f"n_{split} must be >= 0, got {value}")
    return sizes
