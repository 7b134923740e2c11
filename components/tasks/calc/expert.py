"""Expert trajectories of the calc task: the messages after the user prompt, and their JSON form.

One assistant tool-call message + one tool message per calculator call, then the final
``<answer>N</answer>`` message, in the team's chat-message convention. The ``expert`` column of a task
table holds this list as JSON; :func:`expert_messages` decodes it.
"""

from __future__ import annotations

from typing import Any

from components.tasks.demonstrations import answer_message, demonstrations, expert_messages, tool_call_message
from components.tasks.demonstrations import encode as encode_expert
from components.tasks.demonstrations import tool_message as _tool_message

__all__ = [
    "answer_message",
    "call_message",
    "demonstrations",
    "encode_expert",
    "expert_messages",
    "tool_message",
]


def call_message(expression: str) -> dict[str, Any]:
    return tool_call_message("calculator", {"expression": expression})


def tool_message(result: str) -> dict[str, Any]:
    return _tool_message("calculator", result)
