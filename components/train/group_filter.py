"""Which sampled prompt groups an iteration trains on: a reward-std filter and dynamic sampling.

A group is every trajectory sampled from one prompt (``group_id``). Under a group baseline (GRPO,
GiGPO) a group whose trajectories all earn the same return has zero advantage everywhere: it costs an
update and teaches nothing. Two remedies of the multi-turn RL literature pick the groups to train on:

- **Reward-std filter** (RAGEN's StarPO-S, arXiv 2504.20073): sample ``ceil(need / keep)`` groups and
  keep the ``need`` whose trajectory returns vary most within the group (highest in-group standard
  deviation). RAGEN keeps the top 25% and reports that it delays the collapse ("Echo Trap").
- **Dynamic sampling** (DAPO, arXiv 2503.14476): drop the groups whose returns are all equal and sample
  more prompts until the batch holds ``need`` groups, for at most ``max_rounds`` rounds of sampling.

Both act on the trajectory return (the sum of a trajectory's step rewards). :func:`fill_batch` runs the
rounds with a ``play`` callback that samples prompts from a stream and plays them; everything else
here is a pure function of the played rows.

Departures: 1. DAPO samples a whole generation batch each extra round; here an extra round samples the
groups still missing divided by the share of informative groups seen so far, at most the first
round's count, so ``(max_rounds - 1) * first-round groups`` bounds the extra rollouts. 2. When the
rounds end with fewer informative groups than ``need``, the batch is what was found (DAPO's verl
raises instead); ``filter/batch_fill`` logs the share filled.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GroupStats:
    group_id: str
    returns: tuple[float, ...]  # one per trajectory of the group, in first-seen order

    @property
    def std(self) -> float:
        """Unbiased standard deviation of the returns (0 for a group of one)."""
        return statistics.stdev(self.returns) if len(self.returns) >= 2 else 0.0

    @property
    def informative(self) -> bool:
        """Not every trajectory earned the same return (a group of one never is)."""
        return len(self.returns) >= 2 and max(self.returns) - min(self.returns) > 1e-9


def group_stats(rows: Sequence[dict[str, Any]]) -> list[GroupStats]:
    """Per group (first-seen order) the return of each of its trajectories (sum of its rows' ``reward``)."""
    returns: dict[str, dict[str, float]] = {}
    for r in rows:
        traj = returns.setdefault(str(r["group_id"]), {})
        traj[str(r["traj_id"])] = traj.get(str(r["traj_id"]), 0.0) + float(r["reward"])
    return [GroupStats(g, tuple(t.values())) for g, t in returns.items()]


def select_groups(stats: Sequence[GroupStats], need: int, *, top_std: bool, drop_equal: bool) -> list[str]:
    """The ids of the groups to train on: at most ``need``, without the all-equal ones if ``drop_equal``,
    the highest in-group return std first if ``top_std`` (ties: first sampled first), else the first
    sampled. Returned in sampling order."""
    candidates = [s for s in stats if s.informative] if drop_equal else list(stats)
    if top_std:
        chosen = {s.group_id for s in sorted(candidates, key=lambda s: -s.std)[:need]}  # stable sort
    else:
        chosen = {s.group_id for s in candidates[:need]}
    return [s.group_id for s in stats if s.group_id in chosen]


@dataclass(frozen=True)
class GroupFilter:
    """How an iteration picks its groups. ``keep`` in (0, 1]: the reward-std filter's kept share (1 =
    off); ``dynamic``: DAPO's dynamic sampling, with at most ``max_rounds`` rounds of sampling."""

    keep: float = 1.0
    dynamic: bool = False
    max_rounds: int = 1

    def __post_init__(self) -> None:
        if not 0.0 < self.keep <= 1.0:
            raise ValueError(f"keep={self.keep!r} must be in (0, 1]")
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds={self.max_rounds!r} must be >= 1")

    @property
    def active(self) -> bool:
        return self.keep < 1.0 or self.dynamic

    def first_round(self, need: int) -> int:
        """Groups the first round samples: ``ceil(need / keep)``."""
        return math.ceil(need / self.keep - 1e-9)

    def bound(self, need: int) -> int:
        """The most groups :func:`fill_batch` ever samples."""
        rounds = self.max_rounds if self.dynamic else 1
        return rounds * self.first_round(need)


def fill_batch(
    play: Callable[[int, int], list[dict[str, Any]]], need: int, rule: GroupFilter
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Sample and pick an iteration's groups: the kept rows (sampling order) and the ``filter/*`` metrics.

    ``play(start, count)`` samples ``count`` groups (prompts ``start .. start + count - 1`` of the
    iteration's prompt stream) and returns their step rows; it is called once per round. Without
    ``rule.active`` this is one round of ``need`` groups, all kept."""
    first = rule.first_round(need)
    rows = play(0, first)
    first_rows, played, rounds = len(rows), first, 1
    while rule.dynamic and rounds < rule.max_rounds:
        found = sum(s.informative for s in group_stats(rows))
        missing = need - found
        if missing <= 0:
            break
        rate = max(found / played, 1.0 / played)  # informative share so far (at least one in `played`)
        count = min(math.ceil(missing / rate), first)
        rows = rows + play(played, count)
        played += count
        rounds += 1
    stats = group_stats(rows)
    kept = set(select_groups(stats, need, top_std=rule.keep < 1.0, drop_equal=rule.dynamic))
    kept_rows = [r for r in rows if str(r["group_id"]) in kept]
    kept_stats = [s for s in stats if s.group_id in kept]
    metrics = {
        "filter/groups_sampled": float(len(stats)),
        "filter/groups_kept": float(len(kept_stats)),
        "filter/rounds": float(rounds),
        "filter/extra_trajectories": float(len({str(r["traj_id"]) for r in rows[first_rows:]})),
        "filter/batch_fill": len(kept_stats) / need,
        "filter/equal_return_groups": sum(not s.informative for s in stats) / max(len(stats), 1),
        "filter/sampled_reward_std": _mean(s.std for s in stats),
        "filter/kept_reward_std": _mean(s.std for s in kept_stats),
    }
    return kept_rows, metrics


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0
