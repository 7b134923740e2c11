"""The completion marker of a steprl checkpoint directory, shared by every writer and reader.

A writer fills a temporary sibling directory, then :func:`seal` lists its files and sizes in
``steprl_complete.json`` (written LAST, fsynced) and renames it into place, keeping the old checkpoint
until the new one is in. A directory without an intact marker is never taken for a whole checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

MARKER_FILE = "steprl_complete.json"
MARKER_FORMAT = "steprl-hf-checkpoint/1"


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or used; the message names the directory and the reason."""


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sizes(root: Path) -> dict[str, int]:
    """fsync every file and folder under ``root``; return {relative posix path: size in bytes}."""
    sizes = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())
        sizes[path.relative_to(root).as_posix()] = path.stat().st_size
    for sub in sorted(p for p in root.rglob("*") if p.is_dir()):
        fsync_dir(sub)
    return sizes


def check_target(out: Path) -> None:
    """Refuse to replace anything at ``out`` but an empty directory or a checkpoint."""
    if out.exists():
        if not out.is_dir():
            raise CheckpointError(f"cannot save checkpoint to {out}: it exists and is not a directory")
        looks_like_checkpoint = (out / MARKER_FILE).exists() or (out / "config.json").exists()
        if any(out.iterdir()) and not looks_like_checkpoint:
            raise CheckpointError(
                f"refusing to replace {out}: it is a non-empty directory that is not a checkpoint"
            )


def seal(tmp: Path, out: Path, old: Path, metadata: dict[str, Any]) -> None:
    """Write the marker of the filled directory ``tmp``, then swap it in at ``out`` (an existing
    checkpoint is renamed to ``old`` first, restored if the swap fails, deleted after it)."""
    marker = {"format": MARKER_FORMAT, "files": file_sizes(tmp), "metadata": metadata}
    with open(tmp / MARKER_FILE, "w") as fh:
        json.dump(marker, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    fsync_dir(tmp)
    if out.exists():
        os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        if old.exists() and not out.exists():
            os.rename(old, out)
        raise
    fsync_dir(out.parent)
    shutil.rmtree(old, ignore_errors=True)


def incomplete_reason(path: Path) -> str | None:
    """Why ``path`` is not a complete checkpoint, or None if it is."""
    if not path.is_dir():
        return "it does not exist" if not path.exists() else "it is not a directory"
    marker_path = path / MARKER_FILE
    if not marker_path.is_file():
        return f"it has no {MARKER_FILE} (the write was interrupted, or it is not a steprl checkpoint)"
    try:
        marker = json.loads(marker_path.read_text())
        files = marker["files"]
        if marker.get("format") != MARKER_FORMAT or not isinstance(files, dict):
            raise ValueError(f"unknown format {marker.get('format')!r}")
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        return f"its {MARKER_FILE} is unreadable ({err})"
    for name, size in files.items():
        f = path / name
        if not f.is_file():
            return f"file {name} listed in {MARKER_FILE} is missing"
        if f.stat().st_size != size:
            return f"file {name} has {f.stat().st_size} bytes, {MARKER_FILE} says {size}"
    return None
