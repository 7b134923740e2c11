"""The search_calc task's system prompt and the initial messages (system + user) of a task row."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["SYSTEM_PROMPT", "initial_messages"]

# Short on purpose: a tiny model sees it at every step, and the chat template adds the tool schemas.
SYSTEM_PROMPT = (
    "Answer the question. Search for each name you need, one search at a time, then use the "
    "calculator for the arithmetic. Reply with <answer>NUMBER</answer>."
)


def initial_messages(row: Mapping[str, Any]) -> list[dict[str, str]]:
    """``[system, user]`` messages for a task row (its ``question``)."""
    if "question" not in row:
        raise KeyError(f"task row has no 'question' column (columns: {sorted(row)})")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": str(row["question"])}]
