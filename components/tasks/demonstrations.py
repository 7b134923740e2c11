"""Demonstration messages every task shares: chat messages of a tool-using agent, their JSON form in a
task table, and the decoding of a row's demonstrations.

A task table holds its expert demonstration in the ``expert`` column (a JSON list of the messages
after the user prompt) and, optionally, weaker demonstrations in the ``weak`` column (a JSON list of
such lists). SFT imitates all of them (:func:`demonstrations`) but an assistant message marked
``"weight": 0``, which it reads as context only (:mod:`components.model.sft_data`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "answer_message",
    "as_context",
    "demonstrations",
    "encode",
    "expert_messages",
    "tool_call_message",
    "tool_message",
]


def tool_call_message(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn that only calls ``tool`` with ``arguments``."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": tool, "arguments": arguments}}],
    }


def tool_message(tool: str, result: str) -> dict[str, Any]:
    return {"role": "tool", "name": tool, "content": result}


def answer_message(answer: str) -> dict[str, Any]:
    return {"role": "assistant", "content": f"<answer>{answer}</answer>"}


def as_context(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` (an assistant turn) marked ``"weight": 0``: SFT reads it, never imitates it."""
    return {**message, "weight": 0}


def encode(value: Any) -> str:
    """The JSON form stored in the ``expert`` / ``weak`` columns."""
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
