"""Signs of collapse in multi-turn RL, per iteration, and how a run's trend reads.

RAGEN (arXiv 2504.20073, "the Echo Trap") found that multi-turn RL collapses after some steps, and
that the collapse is announced before the reward falls: the rollouts lose diversity, the in-group
standard deviation of the rewards drops, the policy's entropy drops, and the agent keeps answering
the same state with the same action. :func:`collapse_metrics` computes these from an iteration's
rollout rows (every sampled trajectory, before any group filter), so every algorithm gets the same
numbers:

- ``collapse/group_reward_std``: mean over prompt groups of >= 2 trajectories of the unbiased std of
  their returns (absent when every group has one trajectory);
- ``collapse/reward_std``: std of the trajectory returns over the whole batch;
- ``collapse/entropy``: the mean negative log-prob of the sampled response tokens, a Monte-Carlo
  estimate of the sampling policy's per-token entropy (no extra forward pass);
- ``collapse/distinct_actions``: over the anchor states visited at least twice in a prompt group (the
  steps GiGPO groups: same group, same environment state key), the mean number of distinct responses
  taken from one; ``collapse/anchor_states`` counts those states.

:func:`read_trend` compares a run's first and last iterations the way RAGEN reads them: a fall of the
reward std and the entropy while the success rate falls is a collapse; the same fall while success
rises is a policy converging. A fall is a drop of at least ``FALL`` (half) of the early value.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from components.train.advantage import step_group_keys
from components.train.group_filter import group_stats

FALL = 0.5


def collapse_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The ``collapse/*`` metrics (module docstring) of one iteration's rollout step rows: ``group_id``,
    ``traj_id``, ``reward``, ``response_ids``, ``response_logprobs`` and optionally ``obs_key``."""
    groups = group_stats(rows)
    returns = [x for g in groups for x in g.returns]
    logprobs = [lp for r in rows for lp in r["response_logprobs"]]
    out = {
        "collapse/reward_std": statistics.stdev(returns) if len(returns) >= 2 else 0.0,
        "collapse/entropy": -sum(logprobs) / len(logprobs) if logprobs else 0.0,
    }
    multi = [g.std for g in groups if len(g.returns) >= 2]
    if multi:
        out["collapse/group_reward_std"] = sum(multi) / len(multi)
    actions: dict[tuple, set[tuple[int, ...]]] = {}
    visits: dict[tuple, int] = {}
    for key, r in zip(step_group_keys(rows), rows):
        actions.setdefault(key, set()).add(tuple(r["response_ids"]))
        visits[key] = visits.get(key, 0) + 1
    revisited = [len(actions[k]) for k, n in visits.items() if n >= 2]
    out["collapse/anchor_states"] = float(len(revisited))
    if revisited:
        out["collapse/distinct_actions"] = sum(revisited) / len(revisited)
    return out


@dataclass(frozen=True)
class Trend:
    """The mean of a metric over a run's first and last ``window`` iterations."""

    first: float
    last: float

    @property
    def fell(self) -> bool:
        return self.first > 0 and self.last <= (1.0 - FALL) * self.first

    def __str__(self) -> str:
        return f"{self.first:.3g} -> {self.last:.3g}"


def trend(values: Sequence[float], window: int | None = None) -> Trend | None:
    """First-vs-last means of ``values`` (one per iteration); ``window`` defaults to a quarter of the
    run, at least 1. None for fewer than 2 values."""
    if len(values) < 2:
        return None
    w = window or max(1, len(values) // 4)
    w = min(w, len(values) // 2)
    return Trend(sum(values[:w]) / w, sum(values[-w:]) / w)


def read_trend(series: dict[str, Sequence[float]], window: int | None = None) -> str:
    """One sentence on a run's collapse signs from its per-iteration series ``group_reward_std`` (or
    ``reward_std``), ``entropy``, ``distinct_actions`` (optional) and ``success``."""
    spread = "group_reward_std" if series.get("group_reward_std") else "reward_std"
    signs = {
        f"{spread.replace('_', ' ')}": trend(series.get(spread, []), window),
        "entropy": trend(series.get("entropy", []), window),
        "distinct actions": trend(series.get("distinct_actions", []), window),
    }
    success = trend(series.get("success", []), window)
    fell = {name: t for name, t in signs.items() if t is not None and t.fell}
    if not fell:
        shown = ", ".join(f"{n} {t}" for n, t in signs.items() if t is not None)
        if not shown:
            return "too few iterations to read (at least 2)"
        return f"no sign of collapse ({shown})"
    what = ", ".join(f"{n} fell {t}" for n, t in fell.items())
    if success is not None and success.last < success.first:
        return f"collapsing: {what} while training success fell {success}"
    if success is None:
        moved = ""
    elif success.last > success.first:
        moved = f" while training success rose {success}"
    else:
        moved = f" while training success held at {success.last:.3g}"
    return f"{what}{moved}: converging rather than collapsing"
