"""What the tasks' prompts share: the initial messages of an episode (the task's system prompt, then
the row's question as the user message, which a task may first render, e.g. sokoban's grid), and the
``<answer>...</answer>`` a final answer is given in (:func:`answer_content`; each task judges it), and
BALROG's line against repeating an action that changed nothing (:data:`REPEAT_HINT`, :func:`with_repeat_hint`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["REPEAT_HINT", "answer_content", "question_messages", "with_repeat_hint"]

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
# BALROG's BabyAI instruction prompt, word for word: a remedy for greedy agents that repeat a move
# that changed nothing (tasks.sokoban.repeat_hint, tasks.babyai.repeat_hint).
REPEAT_HINT = (
    "It doesn't make sense to repeat the same action over and over if the observation doesn't change."
)


def with_repeat_hint(system_prompt: str, on: bool) -> str:
    """``system_prompt`` with :data:`REPEAT_HINT` as its last sentence when ``on``."""
    return f"{system_prompt} {REPEAT_HINT}" if on else system_prompt


def question_messages(
    system_prompt: str, render: Callable[[str], str] = str
) -> Callable[[Mapping[str, Any]], list[dict[str, str]]]:
    """A recipe's ``initial_messages(row)``: ``[system, user]``, the user message being
    ``render(row["question"])``; a row without a ``question`` is a KeyError naming its columns."""

    def initial_messages(row: Mapping[str, Any]) -> list[dict[str, str]]:
        """``[system, user]`` messages for a task row (its ``question``)."""
        if "question" not in row:
            raise KeyError(f"task row has no 'question' column (columns: {sorted(row)})")
        return [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": render(str(row["question"]))},
        ]

    return initial_messages


def answer_content(text: str) -> str | None:
    """The raw content of the last complete ``<answer>...</answer>`` of ``text`` (model output, any
    string); None if there is none. Linear time: ``str.rfind``, never a regex."""
    text = str(text)
    end = text.rfind(ANSWER_CLOSE)
    start = text.rfind(ANSWER_OPEN, 0, max(end, 0))
    if end < 0 or start < 0:
        return None
    return text[start + len(ANSWER_OPEN) : end]
