"""pandera (polars) schemas of the tables that cross stages, and one-line validation errors.

- :class:`TaskSchema`: a task split (``prepare`` output): one row per problem.
- :class:`StepSchema`: rollout step rows (one row per agent step, exact token ids); extra
  analysis columns are allowed.
- :class:`ProblemSchema`: per-problem evaluation results (``evaluate`` output, read by ``compare``):
  one row per evaluated problem.

:func:`validate_table` validates lazily (every failure is collected) and raises a ``ValueError`` whose
first line names the source, the 1-based row, the column and the failed check, e.g.
``data/train.parquet row 3: column 'split' failed isin(['train', 'val', 'test']) (value: 'tst')``.
Both schemas coerce dtypes (an ``Int32`` token-id list or an all-null ``expert`` column is fine).

It does not read or write files.
"""

from __future__ import annotations

from typing import Any

import pandera.errors as pa_errors
import pandera.polars as pa
import polars as pl

__all__ = ["SPLIT_NAMES", "TASK_COLUMNS", "ProblemSchema", "StepSchema", "TaskSchema", "validate_table"]

SPLIT_NAMES = ["train", "val", "test"]
# The polars dtypes of TaskSchema's columns, in order: a task's table adds its own columns after them.
TASK_COLUMNS = {
    "id": pl.String,
    "question": pl.String,
    "answer": pl.String,
    "expert": pl.String,
    "split": pl.String,
}


class TaskSchema(pa.DataFrameModel):
    id: str = pa.Field(unique=True)
    question: str = pa.Field(str_length={"min_value": 1})
    answer: str
    # JSON list of the expert messages after the user prompt; null when there is none.
    expert: str = pa.Field(nullable=True)
    split: str = pa.Field(isin=SPLIT_NAMES)

    class Config:
        strict = False
        coerce = True


class StepSchema(pa.DataFrameModel):
    traj_id: str
    group_id: str
    step: int = pa.Field(ge=0)
    # The environment's state key before this step's action (AgentEnv.state_key; "" = none): gigpo's
    # step groups are the steps of one prompt group with equal keys.
    obs_key: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]
    reward: float
    done: bool
    truncated: bool
    feedback: str
    # The task's score of the step's tool calls (AgentEnv.process_rewards), kept apart from `reward`;
    # null where the task scores nothing. Optional: tables written before it existed have none.
    process_reward: float | None = pa.Field(nullable=True)
    # The policy version that generated the step (components.train.staleness: 0 = the initial
    # weights, v = the weights after update v-1). Only with rollout.staleness >= 1 or rollout.partial
    # (a carried step keeps the older version): a synchronous run's table has none (every row is its
    # iteration's version).
    policy_version: int | None = pa.Field(nullable=True, ge=0)

    class Config:
        strict = False
        coerce = True

    @pa.check("reward", name="finite")
    def reward_finite(cls, data: Any) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col(data.key).is_finite())

    @pa.dataframe_check(name="len(response_logprobs) == len(response_ids)")
    def logprobs_match_ids(cls, data: Any) -> pl.LazyFrame:
        return data.lazyframe.select(
            pl.col("response_logprobs").list.len() == pl.col("response_ids").list.len()
        )


class ProblemSchema(pa.DataFrameModel):
    """One evaluated problem: its greedy episode's correctness and the fraction of its sampled episodes
    that are correct (null when the evaluation sampled none: ``n_sampled`` = 0)."""

    id: str = pa.Field(unique=True)
    correct: int = pa.Field(isin=[0, 1])
    sampled_correct: float = pa.Field(ge=0, le=1, nullable=True)
    n_sampled: int = pa.Field(ge=0)
    # The greedy episode's summed step rewards and its number of steps.
    return_: float = pa.Field(alias="return")
    turns: int = pa.Field(ge=1)

    class Config:
        strict = False
        coerce = True

    @pa.check("sampled_correct", name="null exactly when n_sampled == 0")
    def sampled_null_iff_none(cls, data: Any) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col(data.key).is_null() == (pl.col("n_sampled") == 0))


# Dataframe-level checks, reported against the column they are about.
_CHECK_COLUMNS = {"len(response_logprobs) == len(response_ids)": "response_logprobs"}


def _describe(case: dict[str, Any], source: str, schema_name: str) -> tuple[tuple[int, int], str]:
    """(sort key, message line) of one pandera failure case."""
    check = str(case["check"])
    column = case["column"]
    if column == schema_name:
        column = _CHECK_COLUMNS.get(check, column)
    index = case["index"]
    value = case["failure_case"]
    if check == "column_in_dataframe":
        return (0, 0), f"{source}: missing column {value!r}"
    if index is None:
        if check.startswith("dtype(") or check.startswith("coerce_dtype("):
            return (1, 0), f"{source}: column {column!r} has dtype {value}, expected {check}"
        return (2, 0), f"{source}: column {column!r} failed {check}: {str(value)[:200]}"
    shown = "null" if value is None else repr(str(value)[:80])
    shown = "" if column in _CHECK_COLUMNS.values() else f" (value: {shown})"
    return (3, int(index)), f"{source} row {int(index) + 1}: column {column!r} failed {check}{shown}"


def validate_table(df: pl.DataFrame, schema: type[pa.DataFrameModel], source: str) -> pl.DataFrame:
    """Validate ``df`` (returns the validated, coerced frame); raise one clear ``ValueError`` if bad."""
    # Checked first: pandera's dtype coercion crashes on a missing column instead of reporting it.
    columns = schema.to_schema().columns
    missing = [c for c in columns if c not in df.columns and columns[c].required]
    if missing:
        raise ValueError(f"{source}: missing column(s) {missing} (columns: {df.columns})")
    try:
        return schema.validate(df, lazy=True)
    except pa_errors.SchemaErrors as err:
        name = getattr(schema.Config, "name", None) or schema.__name__
        cases = err.failure_cases.to_dicts()
        # A column of the wrong dtype is reported once, not again by each of its checks.
        bad_dtype = {c["column"] for c in cases if str(c["check"]).startswith(("dtype(", "coerce_dtype("))}
        cases = [
            c
            for c in cases
            if str(c["check"]).startswith("dtype(")
            or (c["column"] not in bad_dtype and not (bad_dtype and c["column"] == name))
        ]
        found = sorted(_describe(c, source, name) for c in cases)
        lines = list(dict.fromkeys(line for _, line in found))
        more = f" (and {len(lines) - 1} more problems)" if len(lines) > 1 else ""
        raise ValueError(lines[0] + more + "".join(f"\n  {line}" for line in lines[1:20])) from None
    except pa_errors.SchemaError as err:  # a non-lazy failure (e.g. coercion of the whole frame)
        raise ValueError(f"{source}: {str(err).splitlines()[0]}") from None
