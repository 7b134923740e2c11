"""The babyai task's episode metrics (the recipe's ``episode_metrics`` hook).

Reads step records; the environment writes each step's numbers as JSON into ``task_metrics``
(``success``, ``invalid_action``).

- ``success_rate``: episodes that completed the mission;
- ``steps_to_success``: mean agent turns of the successful episodes, invalid ones included (0 when
  none succeeded);
- ``invalid_action_rate``: invalid actions per agent turn (unparseable or unknown actions);
- ``loop_rate``, ``revisit_rate``, ``looping_episodes``: how much the episodes loop (a reply that
  changed nothing sent again, a state seen again; components/tasks/step_records.py);
- ``return``: mean over episodes of the summed step rewards (minigrid's reward on success, the
  invalid-action penalties).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from components.tasks.step_records import by_trajectory, loop_metrics, step_numbers

__all__ = ["episode_metrics"]


def episode_metrics(steps: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    by_traj = by_trajectory(steps)
    n = max(len(by_traj), 1)
    solved, turns_solved, invalid, turns, ret = 0, 0, 0.0, 0, 0.0
    for traj in by_traj.values():
        success = any(bool(s.get("correct")) for s in traj)
        solved += success
        turns_solved += len(traj) if success else 0
        invalid += sum(float(step_numbers(s).get("invalid_action", 0.0)) for s in traj)
        turns += len(traj)
        ret += sum(float(s.get("reward", 0.0)) for s in traj)
    return {
        "success_rate": solved / n,
        "steps_to_success": turns_solved / solved if solved else 0.0,
        "invalid_action_rate": invalid / max(turns, 1),
        "return": ret / n,
        **loop_metrics(steps),
    }
