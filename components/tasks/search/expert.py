"""Demonstrations of the search task: the messages after the user prompt, and their JSON form.

The expert makes one ``search`` call per hop (an assistant tool-call message, then the tool message the
real tool returns for it), then answers (``<answer>...</answer>``). A weaker demonstration answers from
memory: one assistant turn that recalls the passages it would have searched for, as text, then the
answer, with no search. The ``expert`` column holds the expert's messages as JSON, the ``weak`` column a
JSON list of weaker demonstrations (or null).
"""

from __future__ import annotations

from typing import Any

from components.tasks.demonstrations import (
    answer_message,
    demonstrations,
    encode,
    expert_messages,
    tool_call_message,
)
from components.tasks.demonstrations import tool_message as _tool_message

__all__ = [
    "answer_message",
    "call_message",
    "demonstrations",
    "encode",
    "expert_messages",
    "memory_message",
    "tool_message",
]


def call_message(query: str) -> dict[str, Any]:
    return tool_call_message("search", {"query": query})


def tool_message(result: str) -> dict[str, Any]:
    return _tool_message("search", result)


def memory_message(recalled: list[str], answer: str) -> dict[str, Any]:
    """A weaker demonstrator's one turn: the recalled passages, one per line, then the answer."""
    return {"role": "assistant", "content": "\n".join([*recalled, f"<answer>{answer}</answer>"])}
