"""GPU smoke test: one SFT step and one RL iteration per rollout engine, on CUDA (`make gpu-smoke`).

    python benchmarks/gpu_smoke.py [--model models/base] [--engines hf,vllm] [--params params.yaml]

On the base model (the embedded default or ``model.path``, written by the base_model stage): one
DeepSpeed SFT step on random token rows, then for each rollout engine an RLSession (actor, critic,
reference, rollout engine, with params.yaml's deepspeed and rollout settings) that generates,
annotates (old/ref log-probs, critic values), updates actor and critic (the vLLM engine asleep when
``rollout.sleep_during_update``) and syncs the weights. Prints the device, the dtypes, and per
stage the seconds, tokens/s and peak GPU memory. Exits 1 with a clear message when there is no CUDA.
Asserts only that nothing raised and the losses are finite.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's components

import torch


def _stage(name: str, tokens: int, fn, *args, **kwargs):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    torch.cuda.synchronize()
    s = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"  {name:10s} {s:7.2f}s  {tokens / s:9.0f} tok/s  peak {peak:6.2f} GiB allocated", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--model", default="models/base")
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit(
            "gpu-smoke: no CUDA device (torch.cuda.is_available() is False): this needs a GPU machine "
            "set up with `make setup EXTRA=gpu`; nothing was run."
        )
    if not (Path(args.model) / "config.json").is_file():
        sys.exit(f"gpu-smoke: {args.model} is not a model directory (run the base_model stage first)")

    import flows  # noqa: F401  (process defaults for vLLM/DeepSpeed)
    from components.device import stage_device
    from components.model.tiny import load_hf
    from components.precision import resolve_rollout_dtype, resolve_train_dtype
    from components.rollout.base import SamplingConfig
    from components.train.engine import build_engine, train_step
    from components.train.rl_session import RLSession, SessionConfig
    from components.train.rl_update import ActorSettings, CriticSettings
    from components.train.sft import sft_loss_fn
    from flows._stage import read_params

    p = read_params(args.params)
    ds, r = p.deepspeed, p.rollout
    print(
        f"device {stage_device()} ({torch.cuda.get_device_name()}), train dtype "
        f"{resolve_train_dtype(ds.dtype)}, rollout dtype {resolve_rollout_dtype(r.dtype)}, "
        f"fp32 matmul precision {torch.get_float32_matmul_precision()} (before the engines)"
    )
    model, _ = load_hf(args.model, dtype=torch.float32)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (args.seqs, 2 * args.tokens), generator=g)
    batch = {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}
    kw = dict(weight_decay=0.0, zero_stage=ds.zero_stage, dtype=ds.dtype, grad_clip=1.0, warmup_steps=0)
    engine = build_engine(model, lr=1e-5, micro_batch_size=args.seqs, grad_accum_steps=1, total_steps=1, **kw)
    print(f"SFT (fp32 matmul precision now {torch.get_float32_matmul_precision()}):")
    n = float(ids[:, 1:].numel())
    m = _stage("sft step", ids.numel(), train_step, engine, [batch], partial(sft_loss_fn, normaliser=n))
    assert math.isfinite(m["loss"]), m
    engine = model = None  # free the GPU for the RL sessions

    for name in args.engines.split(","):
        cfg = SessionConfig(
            critic="token",
            use_ref=True,
            actor_lr=1e-6,
            critic_lr=1e-5,
            zero_stage=ds.zero_stage,
            dtype=ds.dtype,
            grad_clip=1.0,
            warmup_steps=0,
            adam_eps=1e-8,
            micro_batch_size=args.seqs,
            rollout=replace(r.engine_settings(0, updates=True), engine=name, max_model_len=4 * args.tokens),
            seed=0,
            old_logprobs="recompute",
        )
        print(f"RL iteration, rollout engine {name}:")
        session = RLSession(args.model, cfg, tools=None)
        prompts = [ids[i, : args.tokens].tolist() for i in range(args.seqs // 4)]
        sampling = SamplingConfig(max_tokens=args.tokens, temperature=1.0, n=4)
        gens = session.rollout_engine.generate(prompts, sampling, seeds=list(range(len(prompts))))
        rows = []
        for i, (prompt, group) in enumerate(zip(prompts, gens)):
            for j, gen in enumerate(group):
                k = len(gen.token_ids)
                adv = 1.0 if j % 2 else -1.0
                rows.append(
                    dict(
                        prompt_ids=prompt,
                        response_ids=gen.token_ids,
                        response_logprobs=gen.logprobs,
                        advantages=[adv] * k,
                        returns=[adv] * k,
                        traj_id=f"{i}-{j}",
                        group_id=str(i),
                    )
                )
        generated = sum(len(x["response_ids"]) for x in rows)
        _stage("rollout", generated, session.rollout_engine.generate, prompts, sampling, [0] * len(prompts))
        forwarded = sum(len(x["prompt_ids"]) + len(x["response_ids"]) for x in rows)
        rows = _stage("annotate", forwarded, session.annotate, rows)
        update = dict(epochs=1, mini_batch_size=len(rows), micro_batch_size=args.seqs)
        actor = ActorSettings(
            policy_loss="ppo",
            loss_agg="token-mean",
            clip_low=0.2,
            clip_high=0.2,
            clip_ratio_c=3.0,
            kl_coef=0.01,
            kl_kind="low_var_kl",
            entropy_coef=0.0,
            norm_const=float(args.tokens),
            temperature=1.0,
            **update,
        )
        critic = CriticSettings(value_clip=0.2, **update)
        m = _stage("update", forwarded, session.update, rows, actor=actor, critic=critic, seed=0)
        assert all(math.isfinite(v) for v in m.values()), m
        _stage("sync", 0, session.sync)
        session.close()
        session = None
        torch.cuda.empty_cache()
    print("gpu-smoke: OK")


if __name__ == "__main__":
    main()
