"""Atomic writers: whole files or nothing, with ordinary permissions."""

from __future__ import annotations

import os
import stat

import polars as pl
import pytest

from components.io import write_atomic, write_json, write_parquet, write_text


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_written_files_get_umask_permissions_not_owner_only(tmp_path, umask_022):
    for path in (
        write_parquet(pl.DataFrame({"a": [1]}), tmp_path / "t.parquet"),
        write_json({"a": 1}, tmp_path / "m.json"),
        write_text("hi", tmp_path / "r.md"),
    ):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = write_text("old", tmp_path / "r.md")

    def crash(tmp):
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_atomic(target, crash)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.md"]
