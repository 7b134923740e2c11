"""The sokoban task's system prompt and the first user message (the legend and the start grid)."""

from __future__ import annotations

__all__ = ["SYSTEM_PROMPT", "intro"]

# Short on purpose: a tiny model reads it at every step.
SYSTEM_PROMPT = (
    "You are solving Sokoban. Push every box X onto a target O. # is a wall, _ is floor, P is you, "
    "* is a box on a target, S is you on a target; outside the grid is wall. You can push a box, not pull it. Each turn reply "
    "with one move: <action>up</action>, <action>down</action>, <action>left</action> or "
    "<action>right</action>."
)


def intro(grid: str) -> str:
    """The first user message: the start grid."""
    return grid
