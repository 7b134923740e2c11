"""GPU smoke test: one SFT step and one RL iteration per case and rollout engine, on CUDA (`make gpu-smoke`).

    python benchmarks/gpu_smoke.py [--model models/base] [--engines hf,vllm] [--cases default,zero3,lora]
                                   [--params params.yaml]

On the base model (the embedded default or ``model.path``, written by the base_model stage), for each
case: one DeepSpeed SFT step on random token rows, then for each rollout engine an RLSession (actor,
critic, reference, rollout engine, with params.yaml's deepspeed and rollout settings) that generates,
annotates (old/ref log-probs, critic values), updates actor and critic (the vLLM engine asleep when
``rollout.sleep_during_update``), syncs the weights and builds the final model. The cases (:data:`CASES`):
``default`` (params.yaml's deepspeed.zero_stage and model.lora), ``zero3`` (the same with ZeRO stage 3:
sharded parameters, gathered for the sync and the final model), ``lora`` (model.lora, or rank 16 on
its target modules when params.yaml has it off). Prints the device, the dtypes, and per stage the
seconds, tokens/s and peak GPU memory. Exits 1 with a clear message when there is no CUDA, before
loading anything. Asserts that nothing raised, the losses are finite and, with the hf engine, that
the weights it was synced with and the final model's equal the trainer's (gathered under ZeRO-3).
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

CASES = ("default", "zero3", "lora")


def case_settings(zero_stage: int, lora, target_modules) -> dict[str, tuple[int, object]]:
    """``{case: (ZeRO stage, LoraSettings or None)}`` for every case of :data:`CASES`: ``default`` is
    params.yaml's ``deepspeed.zero_stage`` and ``model.lora`` (``lora``), ``zero3`` the same at stage
    3, ``lora`` params.yaml's adapters or, when they are off, rank 16 on ``target_modules``."""
    from components.train.lora import LoraSettings

    on = lora or LoraSettings(rank=16, alpha=32.0, target_modules=tuple(target_modules))
    return {"default": (zero_stage, lora), "zero3": (3, lora), "lora": (zero_stage, on)}


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
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        sys.exit(f"gpu-smoke: --cases {args.cases}: unknown {unknown} (known: {', '.join(CASES)})")
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
    from components.train.lora import check_model_dir
    from components.train.rl_session import RLSession, SessionConfig
    from flows._stage import read_params
    from flows.train_settings import lora_settings

    p = read_params(args.params)
    ds, r = p.deepspeed, p.rollout
    print(
        f"device {stage_device()} ({torch.cuda.get_device_name()}), train dtype "
        f"{resolve_train_dtype(ds.dtype)}, rollout dtype {resolve_rollout_dtype(r.dtype)}, "
        f"fp32 matmul precision {torch.get_float32_matmul_precision()} (before the engines)"
    )
    settings = case_settings(ds.zero_stage, lora_settings(p), p.model.lora.target_modules)
    if any(settings[c][1] is not None for c in cases):
        try:
            check_model_dir(args.model, next(settings[c][1] for c in cases if settings[c][1]).target_modules)
        except ValueError as err:
            sys.exit(f"gpu-smoke: LoRA case: {err}")
    vocab = load_hf(args.model, dtype=torch.float32)[0].config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (args.seqs, 2 * args.tokens), generator=g)
    for case in cases:
        zero_stage, case_lora = settings[case]
        lora_note = f"LoRA rank {case_lora.rank}" if case_lora else "no LoRA"
        print(f"case {case}: ZeRO stage {zero_stage}, {lora_note}")
        _sft_step(args, ids, zero_stage, ds.dtype)
        for name in args.engines.split(","):
            cfg = SessionConfig(
                critic="token",
                use_ref=True,
                actor_lr=1e-6,
                critic_lr=1e-5,
                zero_stage=zero_stage,
                dtype=ds.dtype,
                grad_clip=1.0,
                warmup_steps=0,
                adam_eps=1e-8,
                micro_batch_size=args.seqs,
                rollout=replace(
                    r.engine_settings(0, updates=True), engine=name, max_model_len=4 * args.tokens
                ),
                seed=0,
                old_logprobs="recompute",
                lora=case_lora,
            )
            print(f"RL iteration, case {case}, rollout engine {name}:")
            session = RLSession(args.model, cfg, tools=None)
            _rl_iteration(args, session, ids, check_sync=name == "hf")
            session.close()
            session = None
            torch.cuda.empty_cache()
    print("gpu-smoke: OK")


def _sft_step(args, ids, zero_stage: int, dtype: str) -> None:
    from components.model.tiny import load_hf
    from components.train.engine import build_engine, train_step
    from components.train.sft import sft_loss_fn

    model, _ = load_hf(args.model, dtype=torch.float32)
    batch = {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}
    kw = dict(weight_decay=0.0, zero_stage=zero_stage, dtype=dtype, grad_clip=1.0, warmup_steps=0)
    engine = build_engine(model, lr=1e-5, micro_batch_size=args.seqs, grad_accum_steps=1, total_steps=1, **kw)
    print(f"SFT (fp32 matmul precision now {torch.get_float32_matmul_precision()}):")
    n = float(ids[:, 1:].numel())
    m = _stage("sft step", ids.numel(), train_step, engine, [batch], partial(sft_loss_fn, normaliser=n))
    assert math.isfinite(m["loss"]), m
    engine.destroy()
    del engine, model  # free the GPU for the RL sessions
    torch.cuda.empty_cache()


def _rl_iteration(args, session, ids, *, check_sync: bool) -> None:
    from components.rollout.base import SamplingConfig
    from components.train.rl_update import ActorSettings, CriticSettings

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
    final = _stage("final", 0, session.final_model).state_dict()
    if check_sync:  # the hf engine's weights, the final model's and the trainer's (gathered) agree
        trainer = session.actor_weights()
        synced = session.rollout_engine.model.state_dict()
        for key, w in trainer.items():
            assert torch.equal(synced[key].cpu(), w.cpu()), f"synced weight {key} differs from the trainer's"
            assert torch.equal(final[key].cpu(), w.cpu()), f"final weight {key} differs from the trainer's"
        print(f"  synced and final weights equal the trainer's ({len(trainer)} tensors)")


if __name__ == "__main__":
    main()
