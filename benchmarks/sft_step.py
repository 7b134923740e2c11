"""SFT optimizer steps on the real demonstrations, with the micro-batch's common prefix forwarded once
(what the sft stage runs) and without (one full forward per row).

    python benchmarks/sft_step.py [--model models/base] [--steps 10] [--repeats 3]

Needs the outputs of `prepare` and `base_model` (e.g. after `make repro`). Encodes the demonstrations
as the sft stage does, draws batches of ``sft.batch_size`` rows, and times DeepSpeed ``train_step``s
of the same batches in both modes; the modes alternate within each repeat, so they see the same
machine load. Prints tokens per batch (padded, forwarded), seconds per step of every repeat, and the
median speed-up. Shared 2-core machines are noisy: compare figures from the same run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from functools import partial

import torch

import flows  # noqa: F401  (process defaults)
from components.model.sft_data import collate
from components.model.tiny import load_hf
from components.train import sft
from components.train.engine import build_engine, train_step
from flows._stage import read_params
from flows.sft import encode_examples


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--model", default="models/base")
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per mode and repeat")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    params = read_params(args.params)
    model, tokenizer = load_hf(args.model, dtype=torch.float32)
    examples, _ = encode_examples(params, tokenizer)
    rng = random.Random(0)
    s = params.sft
    batches = [
        collate(rng.sample(examples, s.batch_size), tokenizer.pad_token_id)
        for _ in range(args.steps * args.repeats)
    ]
    padded = statistics.mean(b["attention_mask"].numel() for b in batches)
    real = statistics.mean(int(b["attention_mask"].sum()) for b in batches)
    shared = [sft.common_prefix(b) for b in batches]
    forwarded = statistics.mean(
        real if p is None else int(p.prefix_mask.sum() + p.suffix_mask.sum()) for p in shared
    )
    print(
        f"{len(examples)} demonstrations, batches of {s.batch_size}: {padded:.0f} padded tokens, "
        f"{real:.0f} real, {forwarded:.0f} forwarded with the common prefix once"
    )
    engine = build_engine(
        model,
        lr=1e-5,
        weight_decay=0.0,
        zero_stage=0,
        dtype="fp32",
        grad_clip=1.0,
        micro_batch_size=s.batch_size,
        grad_accum_steps=1,
        warmup_steps=0,
        total_steps=10**6,
    )
    common_prefix = sft.common_prefix
    seconds: dict[str, list[float]] = {"shared prefix": [], "plain": []}
    try:
        for rep in range(args.repeats):
            for mode in seconds:
                sft.common_prefix = (
                    common_prefix if mode == "shared prefix" else (lambda b, min_prefix=8: None)
                )
                start = time.perf_counter()
                for b in batches[rep * args.steps : (rep + 1) * args.steps]:
                    loss = partial(sft.sft_loss_fn, normaliser=sft.count_label_tokens(b["labels"]))
                    train_step(engine, [b], loss)
                seconds[mode].append((time.perf_counter() - start) / args.steps)
    finally:
        sft.common_prefix = common_prefix
    for mode, v in seconds.items():
        print(f"{mode:>13}: " + ", ".join(f"{x:.3f}" for x in v) + " s/step")
    speedup = statistics.median(seconds["plain"]) / statistics.median(seconds["shared prefix"])
    print(f"median speed-up {speedup:.2f}x")


if __name__ == "__main__":
    main()
