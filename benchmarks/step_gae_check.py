"""StepPO's step GAE recomputed by hand from one stored batch, against what the train stage stored.

    python benchmarks/step_gae_check.py runs/steppo-s0/iter_0000/batch.parquet [--gamma 1.0] [--lam 1.0]

A train stage of a step-critic algorithm (steppo) writes each iteration's batch to
runs/<run>/iter_<k>/batch.parquet: per step row its ``traj_id``, ``step``, ``reward``, the critic's
``values`` (one per step: the value at the last prompt token), and the estimator's ``advantages`` (one
per response token, the step's advantage broadcast) and ``returns`` (one per step). This script
recomputes both with plain Python loops from docs/algorithms.md: per trajectory, with V_T = 0,

    delta_t = r_t + gamma V_{t+1} - V_t,   A_t = delta_t + gamma lam A_{t+1},   R_t = A_t + V_t,

then A whitened over every step row of the batch ((A - mean) / (std + 1e-8), std unbiased), and prints
the largest absolute difference to the stored advantages (every token) and returns. Pass the run's
``train.gamma`` and ``train.lam`` (the profiles and the default: 1.0, 1.0). It reads the environment's
step rewards: a batch with the KL penalty in the reward (a ``token_rewards`` column) or trained with
process rewards (``train.process_reward_weight`` > 0) had other step rewards, and is refused or
disagrees.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's components

WHITEN_EPS = 1e-8


def step_gae_by_hand(
    rows: Sequence[Mapping[str, Any]], gamma: float, lam: float
) -> list[tuple[float, float]]:
    """(whitened A_t, R_t) of every row, in the rows' order (module docstring)."""
    if any("token_rewards" in r for r in rows):
        raise ValueError(
            "the batch has token_rewards (the KL penalty in the reward): the check reads rewards without it"
        )
    by_traj: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_traj[str(r["traj_id"])].append(i)
    adv, ret = [0.0] * len(rows), [0.0] * len(rows)
    for traj_id, idx in by_traj.items():
        idx = sorted(idx, key=lambda i: int(rows[i]["step"]))
        next_value, next_adv = 0.0, 0.0
        for i in reversed(idx):
            values = list(rows[i]["values"])
            if len(values) != 1:
                raise ValueError(
                    f"row {i} ({traj_id} step {rows[i]['step']}): {len(values)} values, a step critic has 1"
                )
            v = float(values[0])
            delta = float(rows[i]["reward"]) + gamma * next_value - v
            adv[i] = delta + gamma * lam * next_adv
            ret[i] = adv[i] + v
            next_value, next_adv = v, adv[i]
    mean = sum(adv) / len(adv)
    std = math.sqrt(sum((a - mean) ** 2 for a in adv) / (len(adv) - 1)) if len(adv) > 1 else 1.0
    return [((a - mean) / (std + WHITEN_EPS), r) for a, r in zip(adv, ret)]


def max_differences(rows: Sequence[Mapping[str, Any]], gamma: float, lam: float) -> dict[str, float]:
    """The largest |hand - stored| over every token's advantage and every row's return."""
    hand = step_gae_by_hand(rows, gamma, lam)
    adv = max(abs(a - float(x)) for (a, _), r in zip(hand, rows) for x in r["advantages"])
    ret = max(abs(R - float(r["returns"][0])) for (_, R), r in zip(hand, rows))
    return {"rows": float(len(rows)), "advantages": adv, "returns": ret}


def main(argv: list[str] | None = None) -> int:
    import polars as pl

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("batch", type=Path, help="runs/<run>/iter_<k>/batch.parquet of a steppo run")
    ap.add_argument("--gamma", type=float, default=1.0)
    ap.add_argument("--lam", type=float, default=1.0)
    args = ap.parse_args(argv)
    rows = pl.read_parquet(args.batch).to_dicts()
    d = max_differences(rows, args.gamma, args.lam)
    print(
        f"{args.batch}: {int(d['rows'])} step rows, gamma {args.gamma:g}, lam {args.lam:g}: "
        f"max |hand - stored| advantage {d['advantages']:.3g}, return {d['returns']:.3g}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
