"""Step records (one per agent step, as the rollout writes them) read back by the tasks' metrics hooks.

- :func:`by_trajectory`: the records grouped by ``traj_id``, in their order;
- :func:`step_numbers`: one record's ``task_metrics`` (the JSON its environment wrote) as a dict;
- :func:`final_numbers`: the ``task_metrics`` of a trajectory's last step that has them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["by_trajectory", "final_numbers", "step_numbers"]


def by_trajectory(
    steps: Sequence[Mapping[str, Any]], keys: tuple[str, ...] = ("traj_id",)
) -> dict[str, list[Mapping[str, Any]]]:
    """Step records grouped by ``traj_id``, in their order; ValueError naming a record that lacks one
    of ``keys`` (``traj_id`` and any other the caller reads)."""
    by_traj: dict[str, list[Mapping[str, Any]]] = {}
    for i, s in enumerate(steps):
        if any(k not in s for k in keys):
            named = " or ".join(repr(k) for k in keys)
            raise ValueError(f"step record {i} has no {named} (keys: {sorted(s)})")
        by_traj.setdefault(str(s["traj_id"]), []).append(s)
    return by_traj


def step_numbers(step: Mapping[str, Any]) -> dict[str, Any]:
    """The record's ``task_metrics`` (a JSON string or a mapping) as a dict; {} if it has none."""
    raw = step.get("task_metrics")
    if not raw:
        return {}
    return json.loads(raw) if isinstance(raw, str) else dict(raw)


def final_numbers(traj: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``task_metrics`` of the trajectory's last step that has them ({} if none)."""
    for s in reversed(traj):
        if s.get("task_metrics"):
            return step_numbers(s)
    return {}
