"""The search_calc task's system prompt and the initial messages (system + user) of a task row."""

from __future__ import annotations

from components.tasks.prompts import question_messages

__all__ = ["SYSTEM_PROMPT", "initial_messages"]

# Short on purpose: a tiny model sees it at every step, and the chat template adds the tool schemas.
SYSTEM_PROMPT = (
    "Answer the question. Search for each name you need, one search at a time, then use the "
    "calculator for the arithmetic. Reply with <answer>NUMBER</answer>."
)

initial_messages = question_messages(SYSTEM_PROMPT)
