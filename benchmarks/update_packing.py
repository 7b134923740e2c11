"""Actor log-prob pass (forward + backward) on real multi-turn step rows, packed vs one sequence per step.

    python benchmarks/update_packing.py [--batch runs/grpo/iter_0000/batch.parquet] [--model models/sft]
                                        [--micro 16] [--repeats 3]

Reads an iteration's batch.parquet (exact prompt/response ids of every agent step), splits it into
trajectory-whole micro-batches as the update does, and times ``response_logprobs`` + backward with
packing (each trajectory forwarded once) and without (each step row forwarded with its own
prompt). Prints tokens forwarded, seconds and the speed-up; checks that both give the same
log-probs. Shared 2-core machines are noisy: compare figures from the same run.
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
    args = ap.parse_args()

    rows = pl.read_parquet(args.batch).to_dicts()
    model = AutoModelForCausalLM.from_pretrained(args.model)
    chunks = [[rows[i] for i in idx] for idx in trajectory_chunks(rows, args.micro)]
    print(
        f"{len(rows)} step rows, {len({r['traj_id'] for r in rows})} trajectories, {len(chunks)} micro-batches"
    )
    results = {}
    for pack in (False, True):
        batches = [
            make_token_batch([r["prompt_ids"] for r in c], [r["response_ids"] for r in c], 0, pack=pack)
            for c in chunks
        ]
        tokens = sum(int(b.attention_mask.sum()) for b in batches)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for b in batches:
                logp, _ = response_logprobs(model, b)
                logp.sum().backward()
            times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            results[pack] = [response_logprobs(model, b)[0] for b in batches]
        name = "packed" if pack else "per step"
        print(f"{name:>9}: {tokens:7d} tokens forwarded, best of {args.repeats}: {min(times):.2f} s")
        results[f"t{pack}"] = min(times)
    diff = max((a - b).abs().max().item() for a, b in zip(results[False], results[True]))
    print(f"speed-up {results['tFalse'] / results['tTrue']:.2f}x, max |logp difference| {diff:.1e}")


if __name__ == "__main__":
    main()
