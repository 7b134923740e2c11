"""A LoRA actor's weights in vLLM on the CPU: merged into the base weights, or served as an adapter.

    python benchmarks/lora_vllm.py [--hidden 256] [--layers 4] [--rank 16] [--prompts 32] [--tokens 64]
                                   [--repeats 3] [--threads 2]

steprl sends vLLM the merged weights W + (alpha / rank) B A at every sync (components.train.lora,
``RLSession.sync``). vLLM also serves LoRA adapters itself (``LLM(enable_lora=True)``, a
``LoRARequest`` per generate; the CPU build computes them with its PyTorch punica ops,
``vllm/lora/punica_wrapper/punica_cpu.py``). This measures both on one random-weight Qwen3 of the
embedded default's shape at ``--hidden`` / ``--layers``, with rank ``--rank`` adapters on every
projection whose B is random (trained adapters), each mode in a fresh process:

- ``merged``: ``VLLMEngine.sync_weights(merged_state_dict(...))`` (the product's path), then generate;
- ``adapter``: the adapter saved with peft's ``save_pretrained`` (what a sync would write) and a new
  ``LoRARequest`` (a new id: what each sync would need), then generate with it; the first generate
  with a new adapter loads it, so the sync is the save plus that first generate's extra time.

Printed per mode: the sync (median of ``--repeats``), the generation of ``--prompts`` x ``--tokens``
sampled tokens (median, tokens/s), and max |logp_vllm - logp_trainer| over the sampled tokens against
the peft model in fp32 (both modes must give the trainer's log-probs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _setup(args, tmp: Path):
    import torch

    from components.model.tiny import build_tiny_model, save_hf
    from components.model.tokenizer import build_tokenizer
    from components.train.lora import LoraSettings, add_lora

    tok = build_tokenizer([f"add {a} and {a * 7}" for a in range(300)], vocab_size=400)
    model = build_tiny_model(
        tok,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_layers=args.layers,
        num_heads=max(1, args.hidden // 64),
        num_kv_heads=1,
        head_dim=64,
        max_position_embeddings=512,
        seed=0,
    )
    path = save_hf(model, tok, tmp / "base")
    peft_model = add_lora(model, LoraSettings(rank=args.rank, alpha=2.0 * args.rank, target_modules=TARGETS))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # trained adapters: B is 0 at the start
        for name, p in peft_model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    prompts = [tok.encode(f"add {a} and") for a in range(args.prompts)]
    return tok, path, peft_model, prompts


def _max_dlogp(peft_model, prompts, outputs, pad_id: int) -> float:
    import torch

    from components.train.policy import make_token_batch, response_logprobs

    gens = [o.outputs[0] for o in outputs]
    batch = make_token_batch(prompts, [list(c.token_ids) for c in gens], pad_id=pad_id)
    with torch.no_grad():
        logp, _ = response_logprobs(peft_model.get_base_model().eval(), batch)
    worst = 0.0
    for i, c in enumerate(gens):
        ids = list(c.token_ids)
        vllm_lp = torch.tensor([lp[t].logprob for t, lp in zip(ids, c.logprobs)])
        worst = max(worst, (logp[i, : len(ids)] - vllm_lp).abs().max().item())
    return worst


def child(args) -> dict:
    # flows' process defaults for vLLM, before vLLM is imported: an in-process engine, 1 GiB KV cache
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import torch
    from vllm import SamplingParams

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="steprl-lora-vllm-"))
    tok, path, peft_model, prompts = _setup(args, tmp)
    requests = [{"prompt_token_ids": p} for p in prompts]
    params = [
        SamplingParams(
            temperature=1.0, max_tokens=args.tokens, ignore_eos=True, logprobs=0, detokenize=False, seed=i
        )
        for i in range(len(prompts))
    ]
    generated = len(prompts) * args.tokens
    out: dict = {"mode": args.child}
    t0 = time.perf_counter()
    if args.child == "merged":
        from components.rollout import EngineSettings
        from components.rollout.factory import make_engine
        from components.train.lora import merged_state_dict

        engine = make_engine(
            EngineSettings("vllm", max_model_len=512, seed=0), str(path), stop_token_ids=[tok.eos_token_id]
        )
        out["engine_start_s"] = time.perf_counter() - t0
        syncs, gens = [], []
        for _ in range(args.repeats):
            t = time.perf_counter()
            engine.sync_weights(merged_state_dict(peft_model))
            syncs.append(time.perf_counter() - t)
            t = time.perf_counter()
            outputs = engine.llm.generate(requests, params, use_tqdm=False)
            gens.append(time.perf_counter() - t)
        out["sync_s"] = statistics.median(syncs)
        engine_close = engine.close
    else:
        from vllm import LLM
        from vllm.lora.request import LoRARequest

        llm = LLM(
            model=str(path),
            dtype="float32",
            max_model_len=512,
            enforce_eager=True,
            seed=0,
            max_num_batched_tokens=65536,
            enable_prefix_caching=True,
            block_size=32,
            enable_lora=True,
            max_lora_rank=args.rank,
            max_loras=1,
        )
        out["engine_start_s"] = time.perf_counter() - t0
        saves, firsts, gens = [], [], []
        for k in range(args.repeats):
            t = time.perf_counter()
            peft_model.save_pretrained(tmp / f"adapter{k}")
            saves.append(time.perf_counter() - t)
            request = LoRARequest(f"actor{k}", k + 1, str(tmp / f"adapter{k}"))
            t = time.perf_counter()
            llm.generate(requests, params, use_tqdm=False, lora_request=request)  # loads the adapter
            firsts.append(time.perf_counter() - t)
            t = time.perf_counter()
            outputs = llm.generate(requests, params, use_tqdm=False, lora_request=request)
            gens.append(time.perf_counter() - t)
        out["save_s"] = statistics.median(saves)
        out["first_generate_s"] = statistics.median(firsts)
        out["sync_s"] = out["save_s"] + max(0.0, out["first_generate_s"] - statistics.median(gens))
        engine_close = lambda: None  # noqa: E731
    out["generate_s"] = statistics.median(gens)
    out["tokens_per_s"] = generated / out["generate_s"]
    out["max_dlogp"] = _max_dlogp(peft_model, prompts, outputs, tok.pad_token_id)
    out["parameters"] = sum(
        p.numel() for p in peft_model.get_base_model().parameters() if not p.requires_grad
    )
    engine_close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", choices=("merged", "adapter"), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return
    results = []
    for mode in ("merged", "adapter"):
        argv = [sys.executable, __file__, "--child", mode]
        for k in ("hidden", "layers", "rank", "prompts", "tokens", "repeats", "threads"):
            argv += [f"--{k}", str(getattr(args, k))]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            raise SystemExit(f"{mode}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        results.append(json.loads(line.removeprefix("RESULT ")))
    n = results[0]["parameters"]
    print(
        f"LoRA rank {args.rank} in vLLM (CPU, fp32, {args.threads} threads): {n / 1e6:.1f}M-parameter Qwen3, "
        f"{args.prompts} prompts x {args.tokens} sampled tokens, median of {args.repeats}"
    )
    print("| mode | engine start s | sync s | generate s | tokens/s | max abs dlogp vs trainer |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['mode']} | {r['engine_start_s']:.1f} | {r['sync_s']:.3f} | {r['generate_s']:.2f} | "
            f"{r['tokens_per_s']:.0f} | {r['max_dlogp']:.1e} |"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
