"""BabyAI as text, GLAM-style: a minigrid observation as a few short sentences, a reply as an action.

An observation (minigrid's ``gen_obs``: the agent's 7x7 partial view ``image`` as (object, color,
state) codes, rotated so that the agent stands at the bottom middle facing up; the ``mission``) reads:

    goal: go to the red ball
    a red ball 2 steps forward and 1 step left
    a locked blue door 3 steps forward and 2 steps right
    a wall 4 steps forward
    a wall 1 step left
    you carry a grey key

one line per visible object (key, ball, box, door with its state, goal, lava), nearest first, its
position counted in steps forward and to the side of the agent; then the nearest wall straight ahead,
to the left and to the right, where the agent sees one; then what it carries, if anything. Cells the
agent cannot see (behind a wall or a closed door) say nothing.

A reply names one action inside a tag, ``<action>go forward</action>``; the actions are minigrid's
first six, by name: turn left, turn right, go forward, pick up, drop, toggle (its ``done`` is unused
by BabyAI and not offered). Anything else raises :class:`InvalidAction` with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT

from components.envs.gym_text import InvalidAction

__all__ = ["ACTIONS", "action_text", "describe", "parse_action", "where"]

# minigrid's Actions 0..5 (left, right, forward, pickup, drop, toggle), by the names the model writes.
ACTIONS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")
# Objects described by name; walls are described by direction only; empty and unseen cells not at all.
_THINGS = ("door", "key", "ball", "box", "goal", "lava")
_DOOR_STATES = ("open", "closed", "locked")
_ACTION_RE = re.compile(r"<action>([^<>]{0,40})</action>", re.IGNORECASE)


def action_text(action: int) -> str:
    """The reply that names ``action`` (an index into :data:`ACTIONS`)."""
    return f"<action>{ACTIONS[int(action)]}</action>"


def parse_action(text: str) -> int:
    """The action index of a reply ``<action>go forward</action>`` (case and spacing inside the tag
    are free); :class:`InvalidAction` with the reason otherwise."""
    found = _ACTION_RE.findall(text)
    if not found:
        raise InvalidAction("reply with one action in a tag, e.g. <action>go forward</action>; the actions are "
                            + ", ".join(ACTIONS))  # fmt: skip
    if len(found) > 1:
        raise InvalidAction(f"{len(found)} actions in one reply; give exactly one <action>...</action>")
    name = " ".join(found[0].lower().split())
    if name not in ACTIONS:
        raise InvalidAction(f"unknown action {found[0][:20]!r}; the actions are " + ", ".join(ACTIONS))
    return ACTIONS.index(name)


def _steps(n: int, direction: str) -> str:
    return f"{n} step{'s' if n != 1 else ''} {direction}"


def where(forward: int, right: int) -> str:
    """A position relative to the agent in words: "2 steps forward and 1 step left"."""
    parts = [_steps(forward, "forward")] if forward else []
    if right:
        parts.append(_steps(abs(right), "right" if right > 0 else "left"))
    return " and ".join(parts)


def _name(obj: int, color: int, state: int) -> str:
    kind = IDX_TO_OBJECT[int(obj)]
    words = [IDX_TO_COLOR[int(color)], kind] if kind not in ("goal", "lava") else [kind]
    if kind == "door":
        words.insert(0, _DOOR_STATES[int(state)])
    article = "an" if words[0][0] in "aeiou" else "a"
    return " ".join([article, *words])


def describe(obs: Mapping[str, Any]) -> str:
    """The text of one observation (see the module docstring)."""
    image = np.asarray(obs["image"])  # (view, view, 3), indexed [column, row]; row 0 is farthest
    size = image.shape[0]
    me = (size // 2, size - 1)  # the agent's cell: bottom middle, facing up (row 0)
    lines = [f"goal: {obs['mission']}"]
    things = []
    for i in range(size):
        for j in range(size):
            if (i, j) == me:
                continue
            obj, color, state = (int(v) for v in image[i, j])
            if IDX_TO_OBJECT.get(obj) in _THINGS:
                forward, right = me[1] - j, i - me[0]
                things.append((forward + abs(right), forward, right, _name(obj, color, state)))
    for _, forward, right, name in sorted(things):
        lines.append(f"{name} {where(forward, right)}")
    rays = {"forward": [(me[0], j) for j in range(me[1] - 1, -1, -1)],
            "left": [(i, me[1]) for i in range(me[0] - 1, -1, -1)],
            "right": [(i, me[1]) for i in range(me[0] + 1, size)]}  # fmt: skip
    for direction, cells in rays.items():
        for n, (i, j) in enumerate(cells, start=1):
            if IDX_TO_OBJECT.get(int(image[i, j, 0])) == "wall":
                lines.append(f"a wall {_steps(n, direction)}")
                break
    carried = image[me[0], me[1]]
    if IDX_TO_OBJECT.get(int(carried[0])) in _THINGS:
        lines.append(f"you carry {_name(*carried)}")
    return "\n".join(lines)
