"""How fast the critic learns state values: a fit on the step rows a run logged.

    python benchmarks/critic_fit.py --run runs/ppo-s0 [--model models/sft] [--train-iters 0,1,2]
        [--heldout-iter 4] [--steps 40] [--lr 1e-3] [--head zero|normal] [--targets raw|standardized]
        [--sample rows|trajectories]

A critic as the train stage builds it (``build_critic`` on ``--model``) regresses each step's return
(the value at the last prompt token, as step_gae reads it) on the ``batch.parquet`` rows of
``--train-iters`` of a run of a critic-based algorithm, 128 random rows per AdamW step (``--sample
trajectories``: whole trajectories up to 128 rows, as the stage's mini-batches take them; plain torch,
no DeepSpeed, no value clip), and every 10 steps prints the training loss and, on 256 rows of
``--heldout-iter``, the explained variance 1 - Var(R - V) / Var(R) and the spread (std) of the values
across states. ``--head normal``: transformers' random head instead of the zero head; ``--targets
standardized``: (R - mean) / std of the training rows' returns. A critic whose values do not depend on
the state shows explained variance ~0 and a value std near 0, whatever its loss.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's components

import numpy as np
import polars as pl
import torch

from components.train.critic import build_critic
from components.train.policy import critic_values, make_token_batch
from components.train.rl_update import trajectory_chunks


def _rows(run: Path, iters: list[int]) -> tuple[list, list, np.ndarray, list]:
    b = pl.concat(
        pl.read_parquet(run / f"iter_{i:04d}" / "batch.parquet").select(
            "traj_id", "prompt_ids", "response_ids", "returns"
        )
        for i in iters
    )
    returns = np.array([r[0] for r in b["returns"].to_list()], dtype=np.float32)
    return b["prompt_ids"].to_list(), b["response_ids"].to_list(), returns, b["traj_id"].to_list()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--model", type=Path, default=Path("models/sft"))
    ap.add_argument("--train-iters", default="0,1,2")
    ap.add_argument("--heldout-iter", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--head", choices=["zero", "normal"], default="zero")
    ap.add_argument("--targets", choices=["raw", "standardized"], default="raw")
    ap.add_argument("--sample", choices=["rows", "trajectories"], default="rows")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    prompts, responses, R, trajs = _rows(a.run, [int(i) for i in a.train_iters.split(",")])
    hp, hr, hR, _ = (x[:256] for x in _rows(a.run, [a.heldout_iter]))
    traj_rows = trajectory_chunks([{"traj_id": t} for t in trajs], 1)  # one chunk per trajectory
    if a.targets == "standardized":
        mu, sd = R.mean(), R.std()
        R, hR = (R - mu) / sd, (hR - mu) / sd
    critic = build_critic(a.model)
    if a.head == "normal":
        torch.nn.init.normal_(critic.score.weight, std=critic.config.initializer_range)
    opt = torch.optim.AdamW(critic.parameters(), lr=a.lr, weight_decay=0.0)

    def values(p: list, r: list) -> torch.Tensor:
        return critic_values(critic, make_token_batch(p, r, pad_id=0), per_step=True)

    rng = np.random.default_rng(a.seed)
    print(f"{len(R)} training rows (returns mean {R.mean():.2f}, std {R.std():.2f}), {len(hR)} held out")
    start = time.perf_counter()
    for step in range(1, a.steps + 1):
        if a.sample == "rows":
            idx = rng.choice(len(R), size=min(128, len(R)), replace=False)
        else:  # whole trajectories up to 128 rows, as the train stage's mini-batches take them
            idx = []
            for t in rng.permutation(len(traj_rows)):
                if len(idx) + len(traj_rows[t]) > 128:
                    break
                idx += traj_rows[t]
        v = values([prompts[i] for i in idx], [responses[i] for i in idx])
        loss = 0.5 * ((v - torch.from_numpy(R[idx])) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(critic.parameters(), 1.0)
        opt.step()
        if step % 10 == 0 or step == a.steps:
            with torch.no_grad():
                hv = torch.cat(
                    [values(hp[i : i + 128], hr[i : i + 128]) for i in range(0, len(hp), 128)]
                ).numpy()
            ev = 1.0 - np.var(hR - hv) / np.var(hR)
            print(
                f"step {step:4d}  loss {loss.item():7.3f}  held-out explained variance {ev:7.4f}  "
                f"value std {hv.std():.4f}  ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
