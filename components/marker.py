"""The completion marker of a steprl checkpoint directory, shared by every writer and reader.

A writer lists the directory's files and sizes in ``steprl_complete.json`` and writes it LAST; a
directory without an intact marker is never taken for a whole checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

MARKER_FILE = "steprl_complete.json"
MARKER_FORMAT = "steprl-hf-checkpoint/1"


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
