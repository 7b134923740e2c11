"""The search task's episode metrics (the recipe's ``episode_metrics`` hook): EM, F1, queries, hit rate.

Reads step records (one per agent step). The environment writes its per-episode numbers as JSON into
the final step's ``task_metrics`` (see ``env.py``); an episode cut before its final answer has none
and counts as EM 0, F1 0, with its searches counted from ``n_valid_calls`` and no hit rate.

- ``em``, ``f1``: mean over episodes of exact match and token F1 of the answer;
- ``queries_per_episode``: valid search calls per episode;
- ``gold_hit_rate``: mean over episodes (with gold passages, that reached an answer) of the fraction
  of their gold passages that any search returned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from components.tasks.step_records import by_trajectory, final_numbers

__all__ = ["by_trajectory", "episode_metrics", "final_numbers"]


def episode_metrics(steps: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    by_traj = by_trajectory(steps)
    n = max(len(by_traj), 1)
    em = f1 = queries = 0.0
    hits: list[float] = []
    for traj in by_traj.values():
        final = final_numbers(traj)
        em += float(final.get("em", 0.0))
        f1 += float(final.get("f1", 0.0))
        queries += float(final.get("n_queries", sum(int(s.get("n_valid_calls", 0)) for s in traj)))
        hit = final.get("gold_hit")
        if hit is not None and not math.isnan(float(hit)):
            hits.append(float(hit))
    return {
        "em": em / n,
        "f1": f1 / n,
        "queries_per_episode": queries / n,
        "gold_hit_rate": sum(hits) / len(hits) if hits else 0.0,
    }
