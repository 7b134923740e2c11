"""Rollout-vs-trainer log-prob gap in fp32 and bf16, and what bf16 costs or saves on this CPU.

    python benchmarks/logprob_gap.py [--model models/sft] [--prompts 16] [--tokens 64]
                                     [--dtypes float32,bfloat16] [--threads 1]

Samples ``--tokens`` tokens for ``--prompts`` calc test prompts (the real system prompt and tool
schema) with the vLLM engine at each rollout dtype (``rollout.dtype``), then scores the same tokens
with the trainer (``components.train.policy.response_logprobs``) in fp32 and under bf16 autocast
(fp32 weights, bf16 matmuls), and prints max / mean |logp_rollout - logp_trainer| for every pair:
the error of ``train.old_logprobs: rollout`` in the PPO ratio. Also prints the rollout seconds of
each engine (median of repeats after a warm-up), the trainer forward+backward seconds in fp32 and
bf16 autocast, and whether this CPU has native bf16 matmuls (AVX-512 BF16 / AMX flags in
/proc/cpuinfo): without them bf16 is emulated and slower than fp32. Shared machines are noisy:
compare figures of the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import polars as pl
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import flows  # noqa: F401  (process defaults for vLLM)
from components import precision
from components.agent.render import ChatRenderer
from components.envs import get_task
from components.rollout import EngineSettings, SamplingConfig
from components.rollout.factory import make_engine
from components.train.policy import make_token_batch, response_logprobs


def trainer_logprobs(model, prompts, responses, pad_id: int, autocast: bool) -> list[list[float]]:
    batch = make_token_batch(prompts, responses, pad_id)
    with torch.no_grad(), precision.autocast("amp_bf16" if autocast else "fp32"):
        logp, _ = response_logprobs(model, batch)
    return [logp[i, : len(r)].tolist() for i, r in enumerate(responses)]


def train_seconds(model, prompts, responses, pad_id: int, autocast: bool, repeats: int = 2) -> float:
    batch = make_token_batch(prompts, responses, pad_id, share_prefix=True)
    times = []
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        with precision.autocast("amp_bf16" if autocast else "fp32"):
            logp, _ = response_logprobs(model, batch)
        logp.sum().backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/sft")
    ap.add_argument("--data", default="data/processed/calc/test.parquet")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--dtypes", default="float32,bfloat16", help="rollout dtypes (vLLM)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="rollout repeats (median of all but the first)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    spec = get_task("calc")
    tok = AutoTokenizer.from_pretrained(args.model)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    renderer = ChatRenderer(tok, spec.tools(), stop_token=tok.eos_token)
    rows = pl.read_parquet(args.data).head(args.prompts).to_dicts()
    prompts = [renderer.prompt(spec.make_env(r).reset(r)) for r in rows]
    native = precision.has_bf16("cpu")
    print(f"CPU native bf16: {'yes' if native else 'no (no avx512_bf16 / amx_bf16: bf16 is emulated)'}")
    print(
        f"{len(prompts)} prompts of {statistics.mean(map(len, prompts)):.0f} tokens on average, {args.model}"
    )

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    print(
        f"\n{'rollout dtype':14} {'rollout s':>9} {'tokens':>6}  {'trainer':16} {'max |dlogp|':>11} {'mean |dlogp|':>12}"
    )
    for dtype in args.dtypes.split(","):
        settings = EngineSettings("vllm", dtype=dtype, max_model_len=1024)
        engine = make_engine(settings, args.model, stop_token_ids=[tok.eos_token_id])
        try:
            times = []
            for _ in range(args.repeats):  # the same seeded requests: the first run includes warm-up
                t0 = time.perf_counter()
                gens = engine.generate(
                    prompts,
                    SamplingConfig(max_tokens=args.tokens, temperature=1.0),
                    seeds=list(range(len(prompts))),
                )
                times.append(time.perf_counter() - t0)
            seconds = statistics.median(times[1:] or times)
        finally:
            engine.close()
        responses = [g[0].token_ids for g in gens]
        sampled = [g[0].logprobs for g in gens]
        n = sum(map(len, responses))
        for autocast in (False, True):
            ref = trainer_logprobs(model, prompts, responses, pad_id, autocast)
            gaps = [abs(a - b) for s, r in zip(sampled, ref) for a, b in zip(s, r)]
            label = "bf16 autocast" if autocast else "fp32"
            print(
                f"{dtype:14} {seconds:9.2f} {n:6d}  {label:16} {max(gaps):11.2e} {statistics.mean(gaps):12.2e}",
                flush=True,
            )
    fp32 = train_seconds(model, prompts, responses, pad_id, autocast=False)
    bf16 = train_seconds(model, prompts, responses, pad_id, autocast=True)
    print(
        f"\ntrainer forward+backward of these {len(prompts)} sequences: fp32 {fp32:.2f} s, "
        f"bf16 autocast {bf16:.2f} s ({fp32 / bf16:.2f}x)"
    )


if __name__ == "__main__":
    main()
