"""The batch mode's input: a jsonl file of questions, every line checked before any is asked.

Each non-blank line is a JSON object with a non-empty string ``question``; optional ``answer`` (a
string or number: the expected answer, then the trajectory records the task's reward and whether it
is correct) and ``id`` (a string or number, default the line number). Any other key is an error, so
a misspelt key is not silently ignored. Errors are ``ValueError``s naming the file and line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["read_questions"]

_KEYS = {"question", "answer", "id"}


def _row(obj: Any, where: str, lineno: int) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ValueError(
            f'{where}: expected a JSON object like {{"question": ...}}, got {type(obj).__name__}'
        )
    extra = sorted(set(obj) - _KEYS)
    if extra:
        raise ValueError(f"{where}: unknown key(s) {extra}; allowed: {sorted(_KEYS)}")
    q = obj.get("question")
    if not isinstance(q, str) or not q.strip():
        raise ValueError(f"{where}: 'question' must be a non-empty string, got {q!r}"[:300])
    for key in ("answer", "id"):
        v = obj.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (str, int, float))):
            raise ValueError(f"{where}: {key!r} must be a string or a number, got {type(v).__name__}")
    answer = obj.get("answer")
    return {
        "id": str(obj.get("id", lineno)),
        "question": q.strip(),
        "answer": None if answer is None else str(answer),
    }


def read_questions(path: str | Path) -> list[dict[str, Any]]:
    """The rows of ``path`` ({"id", "question", "answer" or None}); ValueError naming the bad line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ValueError(f"--questions {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--questions {path}: cannot read it ({err})") from None
    rows = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path} line {lineno}"
        try:
            obj = json.loads(line)
        except ValueError as err:
            raise ValueError(f"{where}: not valid JSON ({err})") from None
        rows.append(_row(obj, where, lineno))
    if not rows:
        raise ValueError(f"--questions {path}: no questions in it")
    ids = [r["id"] for r in rows]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"--questions {path}: duplicate id(s) {dup[:5]}")
    return rows
