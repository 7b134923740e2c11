"""The search task's system prompt and the initial messages (system + user) of a task row."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["SYSTEM_PROMPT", "initial_messages"]

# Short on purpose: a tiny model sees it at every step, and the chat template adds the tool schema.
SYSTEM_PROMPT = (
    "Answer the question. Use the search tool to look up each name you need, one search at a time. "
    "When you know the answer, reply with <answer>ANSWER</answer>."
)


def initial_messages(row: Mapping[str, Any]) -> list[dict[str, str]]:
    """``[system, user]`` messages for a task row (its ``question``)."""
    if "question" not in row:
        raise KeyError(f"task row has no 'question' column (columns: {sorted(row)})")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": str(row["question"])}]
