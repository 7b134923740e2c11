"""Demonstrations of the search task: the messages after the user prompt, and their JSON form.

The expert makes one ``search`` call per hop (an assistant tool-call message, then the tool message the
real tool returns for it), then answers (``<answer>...</answer>``). A weaker demonstration answers from
memory: one assistant turn that recalls the passages it would have searched for, as text, then the
answer, with no search. The ``expert`` column holds the expert's messages as JSON, the ``weak`` column a
JSON list of weaker demonstrations (or null).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

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
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": query}}}],
    }


def tool_message(result: str) -> dict[str, Any]:
    return {"role": "tool", "name": "search", "content": result}


def answer_message(answer: str) -> dict[str, Any]:
    return {"role": "assistant", "content": f"<answer>{answer}</answer>"}


def memory_message(recalled: list[str], answer: str) -> dict[str, Any]:
    """A weaker demonstrator's one turn: the recalled passages, one per line, then the answer."""
    return {"role": "assistant", "content": "\n".join([*recalled, f"<answer>{answer}</answer>"])}


def encode(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def expert_messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The expert messages of a task row (decoded from its ``expert`` column)."""
    raw = row.get("expert")
    if raw is None:
        raise ValueError(f"task row {row.get('id')!r} has no expert trajectory (column 'expert' is null)")
    messages = json.loads(raw)
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError(f"task row {row.get('id')!r}: column 'expert' is not a JSON list of messages")
    return messages


def demonstrations(row: Mapping[str, Any]) -> list[list[dict[str, Any]]]:
    """Every demonstration of a task row: the expert's, then the weaker ones of its ``weak`` column."""
    demos = [expert_messages(row)]
    raw = row.get("weak")
    if raw:
        weak = json.loads(raw)
        if not isinstance(weak, list) or not all(isinstance(d, list) for d in weak):
            raise ValueError(f"task row {row.get('id')!r}: column 'weak' is not a JSON list of message lists")
        demos += weak
    return demos
