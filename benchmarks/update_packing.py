"""Actor log-prob pass (forward + backward) on real step rows: one sequence per step, packed (one per
trajectory), and packed on shared prefixes (each group's shared prompt forwarded once).

    python benchmarks/update_packing.py [--batch runs/grpo/iter_0000/batch.parquet] [--model models/sft]
                                        [--micro 16] [--repeats 3] [--rows N]

Reads an iteration's batch.parquet (exact prompt/response ids of every agent step), splits it into
trajectory-whole micro-batches as the update does, and times ``response_logprobs`` + backward with
packing (each trajectory forwarded once) and without (each step row forwarded with its own
prompt), and packed with ``share_prefix=True`` (what the update runs). Modes alternate within each
repeat, so they see the same machine load. Prints tokens forwarded, seconds and the speed-up; checks
that all give the same log-probs. Shared 2-core machines are noisy: compare figures from the same run.
"""

from __future__ import annotations

import argparse
import time

import polars as pl
import torch
from transformers import AutoModelForCausalLM

import flows  # noqa: F401  (process defaults)
from components.train.policy import make_token_batch, response_logprobs
from components.train.rl_update import trajectory_chunks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="runs/grpo/iter_0000/batch.parquet")
    ap.add_argument("--model", default="models/sft")
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, default=None, help="only the first N step rows")
    args = ap.parse_args()

    rows = pl.read_parquet(args.batch).to_dicts()[: args.rows]
    model = AutoModelForCausalLM.from_pretrained(args.model)
    chunks = [[rows[i] for i in idx] for idx in trajectory_chunks(rows, args.micro)]
    print(
        f"{len(rows)} step rows, {len({r['traj_id'] for r in rows})} trajectories, {len(chunks)} micro-batches"
    )
    modes = {
        "per step": dict(pack=False),
        "packed": dict(pack=True),
        "shared prefix": dict(share_prefix=True),
    }
    batches = {
        name: [
            make_token_batch([r["prompt_ids"] for r in c], [r["response_ids"] for r in c], 0, **kw)
            for c in chunks
        ]
        for name, kw in modes.items()
    }
    times: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(args.repeats):
        for name, bs in batches.items():
            t0 = time.perf_counter()
            for b in bs:
                logp, _ = response_logprobs(model, b)
                logp.sum().backward()
            times[name].append(time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
    with torch.no_grad():
        logps = {name: [response_logprobs(model, b)[0] for b in bs] for name, bs in batches.items()}
    for name, bs in batches.items():
        tokens = sum(b.forwarded_tokens for b in bs)
        best = min(times[name])
        print(
            f"{name:>13}: {tokens:7d} tokens forwarded, best of {args.repeats}: {best:.2f} s "
            f"(all {' '.join(f'{t:.1f}' for t in times[name])}), "
            f"speed-up over per step {min(times['per step']) / best:.2f}x"
        )
    diff = max((a - b).abs().max().item() for name in modes for a, b in zip(logps["per step"], logps[name]))
    print(f"max |logp difference| between modes {diff:.1e}")


if __name__ == "__main__":
    main()
