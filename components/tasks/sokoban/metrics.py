"""The sokoban task's episode metrics (the recipe's ``episode_metrics`` hook).

Reads step records; the environment writes each step's numbers as JSON into ``task_metrics``
(``boxes_on_target`` after the move, ``success``, ``invalid_action``).

- ``success_rate``: episodes that solved the level (every box on a target);
- ``steps_to_solve``: mean agent turns of the solved episodes (0 when none solved);
- ``invalid_action_rate``: invalid actions per agent turn (unparseable or unknown moves);
- ``boxes_on_target``: mean over episodes of the boxes on targets at the episode's end;
- ``loop_rate``, ``revisit_rate``, ``looping_episodes``: how much the episodes loop (a reply that
  changed nothing sent again, a state seen again; components/tasks/step_records.py);
- ``return``: mean over episodes of the summed step rewards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from components.tasks.step_records import by_trajectory, loop_metrics, step_numbers

__all__ = ["episode_metrics"]


def episode_metrics(steps: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    by_traj = by_trajectory(steps, ("traj_id", "step"))
    n = max(len(by_traj), 1)
    solved, turns_solved, invalid, turns, boxes, ret = 0, 0, 0.0, 0, 0.0, 0.0
    for traj in by_traj.values():
        traj = sorted(traj, key=lambda s: int(s["step"]))
        numbers = [step_numbers(s) for s in traj]
        success = any(bool(s.get("correct")) for s in traj)
        solved += success
        turns_solved += len(traj) if success else 0
        invalid += sum(float(m.get("invalid_action", 0.0)) for m in numbers)
        turns += len(traj)
        last = next((m for m in reversed(numbers) if "boxes_on_target" in m), {})
        boxes += float(last.get("boxes_on_target", 0.0))
        ret += sum(float(s.get("reward", 0.0)) for s in traj)
    return {
        "success_rate": solved / n,
        "steps_to_solve": turns_solved / solved if solved else 0.0,
        "invalid_action_rate": invalid / max(turns, 1),
        "boxes_on_target": boxes / n,
        "return": ret / n,
        **loop_metrics(steps),
    }
