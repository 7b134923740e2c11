"""Atomic writes of tables and JSON: a crash mid-write never leaves a file that looks whole.

Each writer writes a temporary sibling and renames it into place (``os.replace`` is atomic on one
filesystem), so a reader sees either the old file, the new file, or nothing.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def tmp_sibling(path: Path) -> Path:
    """An empty temporary file next to ``path``, with the permissions a plain ``open(path, "w")``
    would give (mkstemp makes it owner-only, 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_umask())
    os.close(fd)
    return Path(tmp)


def write_atomic(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """Call ``write(tmp)`` on a temporary sibling of ``path``, then rename it to ``path``."""
    path = Path(path)
    tmp = tmp_sibling(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_parquet(df: pl.DataFrame, path: str | Path) -> Path:
    return write_atomic(path, df.write_parquet)


def write_json(obj: Any, path: str | Path) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n"))


def write_text(text: str, path: str | Path) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(text))
