"""Rollout throughput of the two engines on the agent loop (prints figures; asserts nothing).

    python benchmarks/rollout_throughput.py [--model models/sft] [--episodes 64] [--engines vllm,hf]

Plays `--episodes` calc problems from the test split to the end (greedy and sampled) with each
engine and prints episodes/s, generated tokens/s and the engine start-up time. Shared 2-core
machines are noisy: compare figures from the same run.
"""

from __future__ import annotations

import argparse
import time

import polars as pl
from transformers import AutoTokenizer

import flows  # noqa: F401  (process defaults for vLLM/DeepSpeed)
from components.agent.loop import Episode, run_episodes
from components.agent.render import ChatRenderer
from components.envs import get_task
from components.rollout import EngineSettings
from components.rollout.factory import make_engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/sft")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--engines", default="vllm,hf")
    args = ap.parse_args()
    spec = get_task("calc")
    tok = AutoTokenizer.from_pretrained(args.model)
    rows = pl.read_parquet("data/processed/calc/test.parquet").head(args.episodes).to_dicts()
    print(f"{'engine':6} {'mode':8} {'start s':>8} {'episodes/s':>11} {'tokens/s':>9}")
    for name in args.engines.split(","):
        t0 = time.perf_counter()
        engine = make_engine(
            EngineSettings(name, max_model_len=576), args.model, stop_token_ids=[tok.eos_token_id]
        )
        start = time.perf_counter() - t0
        renderer = ChatRenderer(tok, spec.tools(), stop_token=tok.eos_token)
        for mode, temperature in (("greedy", 0.0), ("sampled", 1.0)):
            episodes = [Episode(f"b-{r['id']}", f"b-{r['id']}", spec.make_env(r), r) for r in rows]
            t1 = time.perf_counter()
            steps = run_episodes(
                engine,
                renderer,
                episodes,
                max_steps=4,
                max_prompt_len=512,
                max_response_len=64,
                temperature=temperature,
                seed=0,
                desc=f"{name} {mode}",
            )
            dt = time.perf_counter() - t1
            tokens = sum(len(s["response_ids"]) for s in steps)
            print(f"{name:6} {mode:8} {start:8.1f} {len(rows) / dt:11.1f} {tokens / dt:9.0f}", flush=True)
        engine.close()


if __name__ == "__main__":
    main()
