"""The search task's system prompt and the initial messages (system + user) of a task row."""

from __future__ import annotations

from components.tasks.prompts import question_messages

__all__ = ["SYSTEM_PROMPT", "initial_messages"]

# Short on purpose: a tiny model sees it at every step, and the chat template adds the tool schema.
SYSTEM_PROMPT = (
    "Answer the question. Use the search tool to look up each name you need, one search at a time. "
    "When you know the answer, reply with <answer>ANSWER</answer>."
)

initial_messages = question_messages(SYSTEM_PROMPT)
