"""The search_calc task's params section, ``tasks.search_calc`` in params.yaml, and how it makes its
data: the generated splits, and the BM25 index saved under ``data_dir/index`` with the search tool's
settings (the search task's ``save_index``), where ``env.make_env`` finds them."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from pydantic import Field

from components.tasks.recipe import TaskParams
from components.tasks.search.params import save_index
from components.tasks.search_calc.generator import generate

__all__ = ["SearchCalcParams", "make_splits"]


class SearchCalcParams(TaskParams):
    # Entities of the search task's generated knowledge base (people, companies, cities, countries);
    # people, companies and cities also get a number (year born, year founded, population).
    n_entities: int = Field(450, ge=16, le=460)
    # Searches a question needs at most (1 or 2); an episode is the searches, a calculator call and
    # the answer, so rollout.max_steps >= max_searches + 2 is checked at load.
    max_searches: int = Field(2, ge=1, le=2)
    # Weaker demonstrations beside the expert's (train split): the same searches, then the arithmetic
    # done in the head (no calculator call); this many per question on average (0 = expert only).
    weak_per_question: float = Field(1.0, ge=0, le=16)
    # The search tool: passages per result (BM25 top-k) and the most characters of one result.
    top_k: int = Field(2, ge=1, le=20)
    max_result_chars: int = Field(400, ge=50, le=8000)

    def turns_needed(self) -> int | None:
        return self.max_searches + 2  # the searches, one calculator call, the answer


def make_splits(
    p: SearchCalcParams,
    *,
    seed: int,
    n_train: int,
    n_val: int,
    n_test: int,
    root: Path,
    data_dir: str | Path | None = None,
) -> dict[str, pl.DataFrame]:
    """The three splits (and, with ``data_dir``, the saved index)."""
    data = generate(
        seed=seed,
        n_train=n_train,
        n_val=n_val,
        n_test=n_test,
        n_entities=p.n_entities,
        max_searches=p.max_searches,
        weak_per_question=p.weak_per_question,
        top_k=p.top_k,
        max_result_chars=p.max_result_chars,
    )
    if data_dir is not None:
        save_index(data.index, data_dir, top_k=p.top_k, max_result_chars=p.max_result_chars)
    return data.splits
