"""Fixtures shared by tests/train: the data-parallel worlds (tests/train/rank_worlds.py), each world
size run once per test session for test_data_parallel, test_zero3 and test_torchrun."""

from __future__ import annotations

import pytest
from rank_worlds import RankWorlds


@pytest.fixture(scope="session")
def rank_worlds(tmp_path_factory) -> RankWorlds:
    return RankWorlds(tmp_path_factory.mktemp("rank_worlds"))
