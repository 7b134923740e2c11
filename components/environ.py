"""Environment variables changed for the length of a ``with`` block, then put back as they were."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

__all__ = ["patched_environ"]


@contextlib.contextmanager
def patched_environ(changes: Mapping[str, str | None]) -> Iterator[None]:
    """Set each variable of ``changes`` to its value (``None``: remove it) inside the block; on
    leaving, however it is left, every one of them is restored or removed as before."""
    saved = {k: os.environ.get(k) for k in changes}
    for k, v in changes.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
