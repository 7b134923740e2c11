"""Expert trajectories of the calc task: the messages after the user prompt, and their JSON form.

One assistant tool-call message + one tool message per calculator call, then the final
``<answer>N</answer>`` message, in the team's chat-message convention. The ``expert`` column of a task
table holds this list as JSON; :func:`expert_messages` decodes it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "answer_message",
    "call_message",
    "demonstrations",
    "encode_expert",
    "expert_messages",
    "tool_message",
]


def call_message(expression: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
        ],
    }


def tool_message(result: str) -> dict[str, Any]:
    return {"role": "tool", "name": "calculator", "content": result}


def answer_message(answer: str) -> dict[str, Any]:
    return {"role": "assistant", "content": f"<answer>{answer}</answer>"}


def encode_expert(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages, ensure_ascii=False)


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
