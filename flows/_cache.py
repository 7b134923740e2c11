"""Prefect cache keys from content: the hash of the files a task reads, its other inputs, its code.

A task decorated with ``cache_key_fn=content_key("rollouts")`` is keyed on the bytes of the file at
its ``rollouts`` parameter (a path), the JSON of its other parameters and its source code, so a rerun
after a crash reuses exactly the tasks whose inputs did not change.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def file_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    p = Path(path)
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    for f in files:
        h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def source_digest(*dirs: str | Path) -> str:
    """SHA-256 of the ``*.py`` files under ``dirs`` (paths and bytes): the code a result depends on."""
    h = hashlib.sha256()
    for d in map(Path, dirs):
        for f in sorted(d.rglob("*.py")):
            h.update(str(f.relative_to(d.parent)).encode() + f.read_bytes())
    return h.hexdigest()


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump()
    return value


def content_key(*file_params: str, ignore: tuple[str, ...] = ()) -> Callable[[Any, dict[str, Any]], str]:
    """The key of a task: its source, the bytes at its ``file_params`` (a file parameter may be None:
    no file), its other parameters but ``ignore`` (those that do not change its result, e.g. the run
    it is called from)."""

    def key(context: Any, parameters: dict[str, Any]) -> str:
        h = hashlib.sha256()
        h.update(inspect.getsource(context.task.fn).encode())
        for name in file_params:
            path = parameters[name]
            h.update(name.encode() + (b"\0none" if path is None else file_digest(path).encode()))
        rest = {k: _plain(v) for k, v in parameters.items() if k not in file_params + ignore}
        h.update(json.dumps(rest, sort_keys=True, default=str).encode())
        return f"{context.task.name}-{h.hexdigest()[:32]}"

    return key
