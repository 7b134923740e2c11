"""The babyai task's episode metrics (the recipe's ``episode_metrics`` hook).

Reads step records; the environment writes each step's numbers as JSON into ``task_metrics``
(``success``, ``invalid_action``).

- ``success_rate``: episodes that completed the mission;
- ``steps_to_success``: mean agent turns of the successful episodes, invalid ones included (0 when
  none succeeded);
- ``invalid_action_rate``: invalid actions per agent turn (unparseable or unknown actions);
- ``return``: mean over episodes of the summed step rewards (minigrid's reward on success, the
  invalid-action penalties).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["episode_metrics"]


def _invalid(step: Mapping[str, Any]) -> float:
    raw = step.get("task_metrics")
    if not raw:
        return 0.0
    numbers = json.loads(raw) if isinstance(raw, str) else dict(raw)
    return float(numbers.get("invalid_action", 0.0))


def episode_metrics(steps: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    by_traj: dict[str, list[Mapping[str, Any]]] = {}
    for i, s in enumerate(steps):
        if "traj_id" not in s or "step" not in s:
            raise ValueError(f"step record {i} has no 'traj_id' or 'step' (keys: {sorted(s)})")
        by_traj.setdefault(str(s["traj_id"]), []).append(s)
    n = max(len(by_traj), 1)
    solved, turns_solved, invalid, turns, ret = 0, 0, 0.0, 0, 0.0
    for traj in by_traj.values():
        success = any(bool(s.get("correct")) for s in traj)
        solved += success
        turns_solved += len(traj) if success else 0
        invalid += sum(_invalid(s) for s in traj)
        turns += len(traj)
        ret += sum(float(s.get("reward", 0.0)) for s in traj)
    return {
        "success_rate": solved / n,
        "steps_to_success": turns_solved / solved if solved else 0.0,
        "invalid_action_rate": invalid / max(turns, 1),
        "return": ret / n,
    }
