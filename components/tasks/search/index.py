"""The search task's retrieval index: BM25 (``bm25s``) over a table of passages, saved to a directory.

A passage table has columns ``id``, ``title``, ``text`` (:class:`PassageSchema`); each passage is
indexed as ``"title. text"``, tokenised by ``bm25s`` (lowercased, English stopwords removed, no
stemming). :meth:`SearchIndex.build` indexes a table, :meth:`SearchIndex.save` writes the index and the
passages to a directory (``passages.parquet`` plus bm25s's own files), :func:`load_index` reads one
back (cached per directory and modification time, so thousands of environments share one copy).

:meth:`SearchIndex.search` returns at most ``k`` passages with a positive BM25 score, best first
(ties broken by passage order): a query whose words are all stopwords or unknown finds nothing.
It does not check queries for size or type (the tool does).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from components.io import write_parquet
from components.schemas import validate_table
from components.tasks.search.schemas import PassageSchema

__all__ = ["Hit", "SearchIndex", "load_index"]


@functools.cache
def _bm25s() -> Any:
    """``bm25s``, imported without its optional numba backend.

    bm25s imports numba when it is installed (vLLM installs it), and numba's llvmlite objects in
    ``sys.modules`` make vLLM's engine start-up fail (its triton kernel scan calls ``vars()`` on them:
    "'_lib_fn_wrapper' object has no attribute 'get'"). Blocking the import while bm25s loads keeps it on
    its numpy backend, which is what this index uses anyway."""
    blocked = "numba" not in sys.modules
    if blocked:
        sys.modules["numba"] = None  # type: ignore[assignment]  # import numba -> ImportError
    try:
        return importlib.import_module("bm25s")
    finally:
        if blocked and sys.modules.get("numba", 0) is None:
            del sys.modules["numba"]


PASSAGES_FILE = "passages.parquet"
_BM25_DIR = "bm25"


@dataclass(frozen=True)
class Hit:
    id: str
    title: str
    text: str
    score: float


def _tokens(texts: list[str]) -> list[list[str]]:
    return _bm25s().tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


class SearchIndex:
    def __init__(self, passages: pl.DataFrame, retriever: Any) -> None:
        self.passages = passages
        self.retriever = retriever
        self._ids = passages["id"].to_list()
        self._titles = passages["title"].to_list()
        self._texts = passages["text"].to_list()

    @classmethod
    def build(cls, passages: pl.DataFrame, source: str = "passages") -> SearchIndex:
        """Index a passage table (validated against PassageSchema; ``source`` names it in errors)."""
        passages = validate_table(passages.select("id", "title", "text"), PassageSchema, source)
        if passages.height == 0:
            raise ValueError(f"{source}: no passages to index")
        retriever = _bm25s().BM25(backend="numpy")
        docs = [f"{t}. {x}" for t, x in zip(passages["title"], passages["text"])]
        retriever.index(_tokens(docs), show_progress=False)
        return cls(passages, retriever)

    def __len__(self) -> int:
        return len(self._ids)

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.retriever.save(str(directory / _BM25_DIR))
        write_parquet(self.passages, directory / PASSAGES_FILE)
        return directory

    def search(self, query: str, k: int) -> list[Hit]:
        """At most ``k`` passages with a positive score for ``query``, best first."""
        tokens = _tokens([query])[0]
        if not tokens or k < 1:
            return []
        k = min(k, len(self))
        docs, scores = self.retriever.retrieve([tokens], k=k, show_progress=False, n_threads=1)
        order = sorted(
            ((float(s), int(d)) for d, s in zip(docs[0], scores[0]) if np.isfinite(s) and s > 0),
            key=lambda pair: (-pair[0], pair[1]),
        )
        return [Hit(self._ids[d], self._titles[d], self._texts[d], s) for s, d in order]


@functools.lru_cache(maxsize=8)
def _load(directory: str, mtime_ns: int) -> SearchIndex:
    passages = pl.read_parquet(Path(directory) / PASSAGES_FILE)
    retriever = _bm25s().BM25.load(str(Path(directory) / _BM25_DIR))
    return SearchIndex(passages, retriever)


def load_index(directory: str | Path) -> SearchIndex:
    """The index saved in ``directory`` (one shared copy per directory and modification time)."""
    directory = Path(directory).resolve()
    passages = directory / PASSAGES_FILE
    if not passages.is_file() or not (directory / _BM25_DIR).is_dir():
        raise FileNotFoundError(f"{directory}: no search index (expected {PASSAGES_FILE} and {_BM25_DIR}/)")
    return _load(str(directory), os.stat(passages).st_mtime_ns)
