"""Shared small search-task data: a generated knowledge base, its splits and its saved index."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.tasks.search.generator import generate
from components.tasks.search.params import save_index

SMALL = dict(
    seed=0,
    n_train=200,
    n_val=20,
    n_test=40,
    n_entities=60,
    min_hops=1,
    max_hops=3,
    weak_max_hops=1,
    weak_per_question=1.0,
    top_k=2,
    max_result_chars=400,
)


@pytest.fixture(scope="session")
def small_data():
    return generate(**SMALL)


@pytest.fixture(scope="session")
def small_data_dir(small_data, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("search_data")
    save_index(small_data.index, d, top_k=2, max_result_chars=400)
    return d
