"""The calc task's params section, ``tasks.calc`` in params.yaml, and how it makes the splits."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from pydantic import Field, model_validator

from components.tasks.calc.generator import generate_splits
from components.tasks.calc.gsm8k import load_splits
from components.tasks.recipe import TaskParams, user_file

__all__ = ["CalcParams", "make_splits"]


class CalcParams(TaskParams):
    # Calculator calls each generated problem needs (each call is one agent step).
    min_calls: int = Field(1, ge=1, le=8)
    max_calls: int = Field(2, ge=1, le=8)
    # Largest operand that appears in a generated question.
    max_operand: int = Field(99, ge=2, le=10**6)
    # Weaker demonstrations beside the expert's (train split): the weaker demonstrator answers problems
    # of at most weak_max_calls operations from mental arithmetic (no tool call); weak_per_question of
    # its demonstrations per such question on average (0 = none).
    weak_max_calls: int = Field(0, ge=0, le=8)
    weak_per_question: float = Field(0.0, ge=0, le=16)
    # A GSM8K-style file (parquet or jsonl with question/answer) instead of generated problems;
    # relative paths are from the repo root. None = generate.
    source_path: str | None = None

    @model_validator(mode="after")
    def _calls_ordered(self) -> CalcParams:
        if self.min_calls > self.max_calls:
            raise ValueError(f"min_calls={self.min_calls} > max_calls={self.max_calls}")
        return self

    def generates_train_rows(self) -> bool:
        return self.source_path is None

    def turns_needed(self) -> int | None:
        return self.max_calls + 1 if self.source_path is None else None  # one call per operation, the answer


def make_splits(
    p: CalcParams,
    *,
    seed: int,
    n_train: int,
    n_val: int,
    n_test: int,
    root: Path,
    data_dir: Path | None = None,
) -> dict[str, pl.DataFrame]:
    """The three splits: loaded from ``source_path`` when given, else generated (calc saves nothing
    besides the tables, so ``data_dir`` is unused)."""
    if p.source_path is not None:
        path = user_file(p.source_path, "tasks.calc.source_path", root)
        return load_splits(path, seed=seed, n_train=n_train, n_val=n_val, n_test=n_test)
    return generate_splits(
        seed=seed,
        n_train=n_train,
        n_val=n_val,
        n_test=n_test,
        min_calls=p.min_calls,
        max_calls=p.max_calls,
        max_operand=p.max_operand,
        weak_max_calls=p.weak_max_calls,
        weak_per_question=p.weak_per_question,
    )
