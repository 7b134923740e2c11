"""Shared small search_calc data: the numeric knowledge base, its splits and its saved index."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.tasks.search.params import save_index
from components.tasks.search_calc.generator import generate

SMALL = dict(
    seed=0,
    n_train=300,
    n_val=20,
    n_test=60,
    n_entities=80,
    max_searches=2,
    weak_per_question=1.0,
    top_k=2,
    max_result_chars=400,
)


@pytest.fixture(scope="session")
def sc_data():
    return generate(**SMALL)


@pytest.fixture(scope="session")
def sc_data_dir(sc_data, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("search_calc_data")
    save_index(sc_data.index, d, top_k=2, max_result_chars=400)
    return d
