"""Load GSM8K-style files (parquet or jsonl with ``question`` and ``answer``) as calc task tables.

The ground truth is the number after ``####`` at the end of ``answer`` (thousands separators dropped).
Each ``<<expr=result>>`` calculator annotation becomes one calculator call of the expert trajectory;
the tool message holds what the real calculator returns for ``expr`` (so supervised data shows exactly
what the environment will say), and an annotation the calculator refuses is left out. A row without
annotations gets a direct-answer expert (just ``<answer>N</answer>``).

A bad row raises ``ValueError`` naming the file, the 1-based row and the column, e.g.
``gsm8k_sample.jsonl row 3: column 'answer' has no '#### <number>' final answer``.
It does not download anything.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import polars as pl

from components.schemas import TaskSchema, validate_table
from components.tasks.calc.calculator import calculate
from components.tasks.calc.expert import answer_message, call_message, encode_expert, tool_message
from components.tasks.calc.generator import TASK_DTYPES
from components.tasks.calc.reward import normalize_number

__all__ = ["load_gsm8k", "load_splits", "parse_gsm8k_answer"]

_FINAL = re.compile(r"####\s*(\S+)\s*$")
_ANNOTATION = re.compile(r"<<([^<>=]*)=([^<>]*)>>")
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}


def parse_gsm8k_answer(answer: str) -> tuple[str, list[str]] | None:
    """(final answer, annotation expressions) of a GSM8K answer; None without ``#### <number>``."""
    match = _FINAL.search(answer)
    final = normalize_number(match.group(1)) if match else None
    if final is None:
        return None
    return final, [expr.strip() for expr, _ in _ANNOTATION.findall(answer)]


def _read_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(1-based row number, row) pairs; a jsonl row number is its line number."""
    kind = _SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise ValueError(f"{path}: unsupported file type {path.suffix!r}; supported: {sorted(_SUFFIXES)}")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if kind == "parquet":
        df = pl.read_parquet(path)
        missing = [c for c in ("question", "answer") if c not in df.columns]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing} (columns: {df.columns})")
        return list(enumerate(df.select("question", "answer").to_dicts(), start=1))
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue  # blank lines are skipped; rows keep their line numbers
            try:
                obj = json.loads(line)
            except ValueError as err:
                raise ValueError(f"{path} row {number}: not valid JSON ({err})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path} row {number}: expected a JSON object, got {type(obj).__name__}")
            rows.append((number, obj))
    return rows


def _expert(expressions: list[str], final: str) -> tuple[list[dict], int]:
    messages: list[dict] = []
    for expr in expressions:
        result = calculate(expr)
        if not result.is_error:
            messages += [call_message(expr), tool_message(result.text)]
    return messages + [answer_message(final)], len(messages) // 2


def load_gsm8k(path: str | Path, *, split: str = "train") -> pl.DataFrame:
    """A TaskSchema table (plus ``n_calls``) of every row of a GSM8K-style parquet/jsonl file."""
    path = Path(path)
    out = []
    for number, row in _read_rows(path):
        for column in ("question", "answer"):
            value = row.get(column)
            if not isinstance(value, str) or not value.strip():
                what = (
                    "is missing" if value is None else f"is not a non-empty string (got {str(value)[:40]!r})"
                )
                raise ValueError(f"{path} row {number}: column {column!r} {what}")
        parsed = parse_gsm8k_answer(row["answer"])
        if parsed is None:
            raise ValueError(f"{path} row {number}: column 'answer' has no '#### <number>' final answer")
        final, expressions = parsed
        messages, n_calls = _expert(expressions, final)
        out.append(
            {
                "id": f"{path.stem}-{number:06d}",
                "question": row["question"].strip(),
                "answer": final,
                "expert": encode_expert(messages),
                "split": split,
                "n_calls": n_calls,
            }
        )
    if not out:
        raise ValueError(f"{path}: no rows")
    return validate_table(pl.DataFrame(out, schema=TASK_DTYPES), TaskSchema, str(path))


def load_splits(
    path: str | Path, *, seed: int, n_train: int, n_val: int, n_test: int
) -> dict[str, pl.DataFrame]:
    """Train/val/test tables from one file: unique questions, shuffled by ``seed``, test then val then train.

    Test and val get exactly ``n_test`` and ``n_val`` rows; train gets up to ``n_train`` of the rest.
    """
    df = load_gsm8k(path).unique(subset="question", keep="first", maintain_order=True)
    need = n_val + n_test + 1
    if df.height < need:
        raise ValueError(
            f"{path}: {df.height} unique questions, need n_val + n_test + 1 = {need} (at least one for train)"
        )
    order = list(range(df.height))
    random.Random(f"calc-file/{seed}").shuffle(order)
    bounds = {
        "test": (0, n_test),
        "val": (n_test, n_test + n_val),
        "train": (n_test + n_val, min(df.height, n_test + n_val + n_train)),
    }
    return {
        split: df[order[lo:hi]].with_columns(pl.lit(split).alias("split"))
        for split, (lo, hi) in ((s, bounds[s]) for s in ("train", "val", "test"))
    }
