"""Per-op profile (torch.profiler) of the actor update and the old-log-prob pass on a real iteration.

    python benchmarks/update_profile.py --tree /tmp/bench/new [--iteration 0] [--top 25] [--threads 2]

``--tree`` is a copy kept by ``benchmarks/rl_iteration.py --keep`` (its params.yaml, models/sft and
runs/grpo-s0/iter_<k>/batch.parquet). The code profiled is this checkout's (run it from here), the
data and model the copy's. Builds the actor engine as the train stage does (``build_engine`` with the
copy's train settings), times one actor update (``actor_update``) and the recomputed old log-probs
(``RLSession.annotate``'s forward, ``response_logprobs`` under no_grad over trajectory chunks),
then profiles one more update and prints the top ops by self CPU time, the seconds, and the executed
FLOPs per second of each (6N per token forwarded on shared prefixes + causal attention, the
benchmark's count). What it does not do: rollouts, the critic, checkpoint saves.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import polars as pl
import torch

import flows  # noqa: F401  (process defaults)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", required=True, help="a copy kept by rl_iteration.py --keep")
    ap.add_argument("--run", default="grpo-s0")
    ap.add_argument("--iteration", type=int, default=0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    ap.add_argument("--rows", type=int, default=None, help="only the first N step rows")
    ap.add_argument("--no-profile", action="store_true", help="timings only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    from components.config import load_params
    from components.train.engine import autocast_for, build_engine
    from components.train.policy import make_token_batch, response_logprobs
    from components.train.rl_update import actor_update, trajectory_chunks
    from flows.train_settings import actor_settings

    tree = Path(args.tree)
    params = load_params(tree / "params.yaml")
    rows = pl.read_parquet(
        tree / "runs" / args.run / f"iter_{args.iteration:04d}" / "batch.parquet"
    ).to_dicts()[: args.rows]
    settings = actor_settings(params, "grpo")
    model = AutoModelForCausalLM.from_pretrained(tree / "models" / "sft")
    n = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    n += model.get_output_embeddings().weight.numel()  # tied: the head's matmul still runs
    cfg = model.config
    width = cfg.num_attention_heads * getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
    engine = build_engine(
        model,
        lr=params.algorithms["grpo"].lr,
        weight_decay=0.0,
        zero_stage=params.deepspeed.zero_stage,
        dtype=params.deepspeed.dtype,
        grad_clip=params.train.grad_clip,
        micro_batch_size=settings.micro_batch_size,
        grad_accum_steps=1,
        warmup_steps=0,
        total_steps=1,
        lr_schedule="constant",
    )
    # Executed FLOPs: tokens forwarded on shared prefixes, attention over each whole sequence.
    chunks = trajectory_chunks(rows, settings.micro_batch_size)
    forwarded, attn = 0, 0.0
    for idx in chunks:
        b = make_token_batch(
            [rows[i]["prompt_ids"] for i in idx], [rows[i]["response_ids"] for i in idx], 0, share_prefix=True
        )
        forwarded += b.forwarded_tokens
        lengths = b.attention_mask.sum(1).tolist()
        attn += sum(4.0 * cfg.num_hidden_layers * width * t * (t + 1) / 2 for t in lengths)
    update_flops = 6 * n * forwarded + 3 * attn
    fwd_flops = 2 * n * forwarded + attn
    print(f"{len(rows)} rows, {len(chunks)} micro-batches, {forwarded} tokens forwarded, N = {n / 1e6:.1f}M")

    def old_logprobs() -> None:
        engine.eval()
        with torch.no_grad(), autocast_for(engine):
            for idx in trajectory_chunks(rows, 32):
                b = make_token_batch(
                    [rows[i]["prompt_ids"] for i in idx],
                    [rows[i]["response_ids"] for i in idx],
                    0,
                    share_prefix=True,
                )
                response_logprobs(engine.module, b, temperature=settings.temperature)

    def update() -> None:
        actor_update(engine, rows, settings, pad_id=0, seed=0)

    for name, fn, flops in (("old log-probs", old_logprobs, fwd_flops / 1), ("update", update, update_flops)):
        fn()  # warm-up
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        print(f"{name}: {dt:.2f} s, {flops / 1e9:.0f} GFLOP executed, {flops / dt / 1e9:.1f} GFLOP/s")
    if args.no_profile:
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        update()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
