"""The search task's params section, ``tasks.search`` in params.yaml, and how it makes its data.

:func:`make_splits` generates the knowledge base and its questions (or loads a HotpotQA-format file
and a corpus), builds the BM25 index, and, given the task's data directory (``data/processed/search``),
saves the index there under ``index/`` with the tool's settings (``tool.json``), where
:func:`components.tasks.search.env.make_env` finds them.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
from pydantic import Field, model_validator

from components.io import write_text
from components.tasks.recipe import TaskParams, user_file
from components.tasks.search.generator import generate
from components.tasks.search.hotpotqa import load_splits
from components.tasks.search.index import SearchIndex

__all__ = ["INDEX_DIR", "TOOL_FILE", "SearchParams", "make_splits", "save_index"]

INDEX_DIR = "index"
TOOL_FILE = "tool.json"


class SearchParams(TaskParams):
    # Generated knowledge base: entities (40% people, 25% companies, 25% cities, 10% countries), one
    # short passage each; at most 460 (the name pools).
    n_entities: int = Field(450, ge=8, le=460)
    # Hops (searches) per generated question: "Where was the founder of Bolt Co born?" is 2.
    min_hops: int = Field(1, ge=1, le=3)
    max_hops: int = Field(3, ge=1, le=3)
    # Weaker demonstrations beside the expert's (train split): questions of at most weak_max_hops hops
    # answered from memory (the recalled passages as text, then the answer; no search);
    # weak_per_question of them per such question on average (0 = expert demonstrations only).
    weak_max_hops: int = Field(1, ge=0, le=3)
    weak_per_question: float = Field(1.0, ge=0, le=16)
    # The search tool: passages per result, and the most characters of one result.
    top_k: int = Field(2, ge=1, le=20)
    max_result_chars: int = Field(400, ge=50, le=8000)
    # Real data instead of the generated knowledge base: a HotpotQA-format .json/.jsonl file
    # (question, answer, supporting_facts, context) and optionally a corpus .jsonl of passages
    # ({"id", "title", "text"}); without a corpus the questions' context paragraphs are indexed.
    # Relative paths are from the repo root; null = generate. Nothing is downloaded.
    questions_path: str | None = None
    corpus_path: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> SearchParams:
        if self.min_hops > self.max_hops:
            raise ValueError(f"min_hops={self.min_hops} > max_hops={self.max_hops}")
        if self.corpus_path is not None and self.questions_path is None:
            raise ValueError("corpus_path is set but questions_path is null (a corpus needs its questions)")
        return self

    def generates_train_rows(self) -> bool:
        return self.questions_path is None

    def turns_needed(self) -> int | None:
        return self.max_hops + 1 if self.questions_path is None else None  # one search per hop, the answer


def save_index(index: SearchIndex, data_dir: str | Path, *, top_k: int, max_result_chars: int) -> Path:
    """Write the index and the tool settings under ``data_dir/index``."""
    out = index.save(Path(data_dir) / INDEX_DIR)
    write_text(json.dumps({"top_k": top_k, "max_result_chars": max_result_chars}) + "\n", out / TOOL_FILE)
    return out


def make_splits(
    p: SearchParams,
    *,
    seed: int,
    n_train: int,
    n_val: int,
    n_test: int,
    root: Path,
    data_dir: str | Path | None = None,
) -> dict[str, pl.DataFrame]:
    """The three splits (and, with ``data_dir``, the saved index): loaded when ``questions_path`` is set."""
    if p.questions_path is not None:
        corpus = user_file(p.corpus_path, "tasks.search.corpus_path", root) if p.corpus_path else None
        splits, index = load_splits(
            user_file(p.questions_path, "tasks.search.questions_path", root),
            corpus,
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
            top_k=p.top_k,
            max_result_chars=p.max_result_chars,
        )
    else:
        data = generate(
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
            n_entities=p.n_entities,
            min_hops=p.min_hops,
            max_hops=p.max_hops,
            weak_max_hops=p.weak_max_hops,
            weak_per_question=p.weak_per_question,
            top_k=p.top_k,
            max_result_chars=p.max_result_chars,
        )
        splits, index = data.splits, data.index
    if data_dir is not None:
        save_index(index, data_dir, top_k=p.top_k, max_result_chars=p.max_result_chars)
    return splits
