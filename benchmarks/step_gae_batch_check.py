"""Recompute StepPO's step GAE by hand on the stored batches of a run, against the stored columns.

    python benchmarks/step_gae_batch_check.py runs/steppo-s0 [--iter 3]

For each ``iter_<k>/batch.parquet`` of the run directory (or only ``--iter k``), with plain Python
loops over each trajectory's steps (docs/algorithms.md, ``step_gae``): V_t is the row's stored value
(the critic at the last prompt token of step t), V_T = 0 after the last step,

    delta_t = r_t + gamma V_{t+1} - V_t,   A_t = delta_t + gamma lam A_{t+1},   R_t = A_t + V_t,

then A whitened over the batch's step rows: (A - mean) / (std + 1e-8), std unbiased. Prints, per
batch, the max |difference| to the stored ``advantages`` and ``returns`` (every token of a step holds
its step's value) and to the stored per-step ``returns``. gamma and lam are read from the run's
``fingerprint.json`` (``train.gamma``, ``train.lam``). Rewards are the rows' ``reward``: a batch with
a ``token_rewards`` column (KL penalty in the reward) or process rewards is refused.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import polars as pl

WHITEN_EPS = 1e-8


def step_gae_by_hand(rows: list[dict], gamma: float, lam: float) -> tuple[list[float], list[float]]:
    """(A_t whitened, R_t) per row, in the rows' order."""
    by_traj: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_traj.setdefault(str(r["traj_id"]), []).append(i)
    adv = [0.0] * len(rows)
    ret = [0.0] * len(rows)
    for idx in by_traj.values():
        idx = sorted(idx, key=lambda i: rows[i]["step"])
        steps = [rows[i]["step"] for i in idx]
        if steps != list(range(len(idx))):
            raise ValueError(f"trajectory {rows[idx[0]]['traj_id']}: steps {steps} are not 0..T-1")
        a_next, v_next = 0.0, 0.0  # after the last step: V_T = 0, A_T = 0
        for i in reversed(idx):
            r = float(rows[i]["reward"])
            v = float(rows[i]["values"][0])
            delta = r + gamma * v_next - v
            a = delta + gamma * lam * a_next
            adv[i], ret[i] = a, a + v
            a_next, v_next = a, v
    n = len(adv)
    mean = sum(adv) / n
    std = math.sqrt(sum((a - mean) ** 2 for a in adv) / (n - 1)) if n > 1 else 1.0
    return [(a - mean) / (std + WHITEN_EPS) for a in adv], ret


def check_batch(path: Path, gamma: float, lam: float) -> dict[str, float]:
    df = pl.read_parquet(path)
    for col in ("token_rewards", "process_reward"):
        if col in df.columns and df[col].drop_nulls().len() > 0:
            raise SystemExit(f"{path}: column {col!r} is set; this check covers outcome rewards only")
    rows = df.to_dicts()
    adv, ret = step_gae_by_hand(rows, gamma, lam)
    d_adv = max(abs(a - x) for r, a in zip(rows, adv) for x in r["advantages"])
    d_ret = max(abs(g - x) for r, g in zip(rows, ret) for x in r["returns"])
    return {"rows": len(rows), "trajectories": df["traj_id"].n_unique(), "max_abs_diff_A": d_adv,
            "max_abs_diff_R": d_ret, "A_range": max(adv) - min(adv)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a StepPO run directory, e.g. runs/steppo-s0")
    ap.add_argument("--iter", type=int, default=None, help="only iter_<k> (default: every stored batch)")
    a = ap.parse_args()
    stamp = a.run_dir / "fingerprint.json"
    if not stamp.is_file():
        sys.exit(f"{a.run_dir}: no fingerprint.json (not a run directory of flows.train)")
    dep = json.loads(stamp.read_text())["depends_on"]
    estimator = dep["algo"].get("estimator") or dep["algo"].get("preset")
    gamma, lam = float(dep["train"]["gamma"]), float(dep["train"]["lam"])
    print(f"{a.run_dir}: estimator/preset {estimator}, gamma {gamma}, lam {lam}")
    pattern = f"iter_{a.iter:04d}/batch.parquet" if a.iter is not None else "iter_*/batch.parquet"
    batches = sorted(a.run_dir.glob(pattern))
    if not batches:
        sys.exit(f"{a.run_dir}: no {pattern}")
    for path in batches:
        m = check_batch(path, gamma, lam)
        print(
            f"{path.parent.name}: {m['rows']} step rows, {m['trajectories']} trajectories, "
            f"max |A_hand - A_stored| {m['max_abs_diff_A']:.2e}, "
            f"max |R_hand - R_stored| {m['max_abs_diff_R']:.2e} (A spread {m['A_range']:.3f})"
        )


if __name__ == "__main__":
    main()
