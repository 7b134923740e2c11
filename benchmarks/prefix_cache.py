"""vLLM prefix caching on the rollout: hit rate and seconds with it on and off (GRPO-style sampling).

    python benchmarks/prefix_cache.py [--model models/sft] [--data data/processed/calc/train.parquet]
                                      [--prompts 16] [--samples 8] [--tokens 64] [--rounds 2]

Builds the rollout engine (``components.rollout.vllm_engine.VLLMEngine``) with prefix caching on and
off and, ``--rounds`` times, samples ``--samples`` responses of at most ``--tokens`` tokens for
each of ``--prompts`` task prompts (the real chat template, system prompt and tool schema), one
request per sample as the agent loop sends them. Between rounds it syncs the (unchanged) weights,
which resets the cache, as the train stage does after every update. Prints the prefix-cache queries
and hits (prompt tokens, vLLM's own counters) and the seconds per round. Shared machines are noisy:
compare figures of the same run.
"""

from __future__ import annotations

import argparse
import time

import polars as pl
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import flows  # noqa: F401  (process defaults for vLLM)
from components.agent.render import ChatRenderer
from components.envs import get_task
from components.rollout import EngineSettings, SamplingConfig
from components.rollout.vllm_engine import VLLMEngine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/sft")
    ap.add_argument("--task", default="calc")
    ap.add_argument("--data", default=None, help="default: data/processed/<task>/train.parquet")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    spec = get_task(args.task)
    tok = AutoTokenizer.from_pretrained(args.model)
    renderer = ChatRenderer(tok, spec.tools(), stop_token=tok.eos_token)
    data = args.data or f"data/processed/{args.task}/train.parquet"
    rows = pl.read_parquet(data).head(args.prompts).to_dicts()
    prompts = [renderer.prompt(spec.make_env(r, malformed_penalty=0.0).reset(r)) for r in rows]
    requests = [p for p in prompts for _ in range(args.samples)]
    seeds = list(range(len(requests)))
    state = AutoModelForCausalLM.from_pretrained(args.model).state_dict()
    print(
        f"{len(prompts)} prompts x {args.samples} samples, prompts of {min(map(len, prompts))}-"
        f"{max(map(len, prompts))} tokens, at most {args.tokens} new tokens, {args.model}"
    )
    print(
        f"{'prefix caching':15} {'round':>5} {'seconds':>8} {'prompt tokens':>13} {'cache hits':>10} {'hit rate':>8}"
    )
    for caching in (True, False):
        engine = VLLMEngine(
            args.model,
            EngineSettings(max_model_len=1024),
            stop_token_ids=[tok.eos_token_id],
            prefix_caching=caching,
            log_stats=True,
        )
        try:
            for k in range(args.rounds):
                before = engine.prefix_cache_stats()
                t0 = time.perf_counter()
                engine.generate(
                    requests, SamplingConfig(max_tokens=args.tokens, temperature=1.0), seeds=seeds
                )
                seconds = time.perf_counter() - t0
                after = engine.prefix_cache_stats()
                queries = sum(map(len, requests))
                hits = after["hits"] - before["hits"]
                print(
                    f"{'on' if caching else 'off':15} {k:5d} {seconds:8.2f} {queries:13d} {hits:10.0f} "
                    f"{hits / max(queries, 1):8.1%}",
                    flush=True,
                )
                engine.sync_weights(state)  # as after an update: the cache is reset
        finally:
            engine.close()


if __name__ == "__main__":
    main()
