"""The babyai task's system prompt and the first user message (the first observation)."""

from __future__ import annotations

__all__ = ["SYSTEM_PROMPT", "intro"]

# Short on purpose: a tiny model reads it at every step.
SYSTEM_PROMPT = (
    "You are in a grid world. Each turn you read your goal and what you see, in steps forward, left and "
    "right of you. Reply with one action: <action>turn left</action>, <action>turn right</action>, "
    "<action>go forward</action>, <action>pick up</action>, <action>drop</action> or "
    "<action>toggle</action>."
)


def intro(observation: str) -> str:
    """The first user message: the first observation."""
    return observation
