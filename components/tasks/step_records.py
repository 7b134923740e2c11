"""Step records (one per agent step, as the rollout writes them) read back by the tasks' metrics hooks.

- :func:`by_trajectory`: the records grouped by ``traj_id``, in their order;
- :func:`step_numbers`: one record's ``task_metrics`` (the JSON its environment wrote) as a dict;
- :func:`final_numbers`: the ``task_metrics`` of a trajectory's last step that has them;
- :func:`loop_steps` / :func:`episode_loops` / :func:`loop_metrics`: how much an episode loops;
  :func:`reply_key`: a reply as they compare it (the agent loop's no-op escape uses the same).

The loop metrics read each record's ``obs_key`` (the environment's state key before the step's
action) and ``action`` (the reply). Step t of an episode (t >= 1):

- *repeats a no-op* when step t - 1 changed nothing (the state before step t is the state before step
  t - 1) and step t's reply is step t - 1's (compared without surrounding white space and case): the
  agent saw that its action did nothing and sent it again;
- *revisits* when the state before it is the state before an earlier step of the episode (a no-op
  step, a step undone, a walk in a circle).

An episode's ``loop_rate`` is its no-op repeats over its steps, its ``revisit_rate`` its revisits over
its steps (0 for a one-step episode). A task whose environment gives no state keys ("") has neither.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "by_trajectory",
    "episode_loops",
    "final_numbers",
    "loop_metrics",
    "loop_steps",
    "reply_key",
    "step_numbers",
]


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


def reply_key(action: object) -> str:
    """A reply as the loop metrics compare it: without surrounding white space, case folded."""
    return str(action).strip().casefold()


def _reply(step: Mapping[str, Any]) -> str:
    return reply_key(step.get("action", ""))


def loop_steps(traj: Sequence[Mapping[str, Any]]) -> tuple[list[bool], list[bool]]:
    """Per step of one episode (records in step order): whether it repeats a no-op, whether it
    revisits a state (module docstring); ValueError naming the step when a record lacks ``obs_key``."""
    for s in traj:
        if "obs_key" not in s:
            raise ValueError(f"step record {s.get('traj_id')!r} step {s.get('step')!r} has no 'obs_key'")
    keys = [str(s["obs_key"]) for s in traj]
    repeats = [False] + [
        keys[t] == keys[t - 1] and _reply(traj[t]) == _reply(traj[t - 1]) for t in range(1, len(traj))
    ]
    revisits = [keys[t] in keys[:t] for t in range(len(traj))]
    return repeats, revisits


def episode_loops(steps: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """traj_id -> {``loop_rate``, ``revisit_rate``} of every episode of ``steps`` whose records carry
    state keys (an episode without any is left out)."""
    out = {}
    for traj_id, traj in by_trajectory(steps, ("traj_id", "step")).items():
        traj = sorted(traj, key=lambda s: int(s["step"]))
        if not any(s.get("obs_key") for s in traj):
            continue
        repeats, revisits = loop_steps(traj)
        out[traj_id] = {"loop_rate": sum(repeats) / len(traj), "revisit_rate": sum(revisits) / len(traj)}
    return out


def loop_metrics(steps: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Means over episodes of :func:`episode_loops` (``loop_rate``, ``revisit_rate``), and
    ``looping_episodes``: the share of episodes with at least one no-op repeat ({} without state keys)."""
    loops = list(episode_loops(steps).values())
    if not loops:
        return {}
    n = len(loops)
    return {
        "loop_rate": sum(e["loop_rate"] for e in loops) / n,
        "revisit_rate": sum(e["revisit_rate"] for e in loops) / n,
        "looping_episodes": sum(e["loop_rate"] > 0 for e in loops) / n,
    }
