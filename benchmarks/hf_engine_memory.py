"""Peak memory of the ``hf`` rollout engine's log-probs: per-step hook vs stacked full-vocabulary logits.

    python benchmarks/hf_engine_memory.py [--vocab 151936] [--seqs 64] [--tokens 256] [--methods hook,stacked]

A tiny random Qwen3 (hidden 64, 2 layers, tied embeddings) with a Qwen-size vocabulary samples
``--seqs`` sequences of ``--tokens`` new tokens each (temperature 1) from ``--prompt-len``-token
prompts. Each method runs in a fresh process, which prints its peak resident memory (ru_maxrss)
before and after generating, the increase, and tokens/s:

- ``hook``: ``HFEngine.generate`` as it is (one log-softmax step at a time, one float per token kept);
- ``stacked``: what the engine did before: ``generate(output_logits=True)``, every step's
  (seqs, vocab) logits kept, stacked and log-softmaxed: about 3 x seqs x tokens x vocab x 4 bytes
  (30 GB at the defaults; run it on a smaller ``--tokens``).

Prints figures; asserts nothing. CPU only (on a GPU the same arrays would sit in GPU memory).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's components


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_one(method: str, args: argparse.Namespace) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from components.rollout.base import SamplingConfig
    from components.rollout.hf_engine import HFEngine

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=args.vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=args.prompt_len + args.tokens + 8,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=2,
    )
    engine = object.__new__(HFEngine)
    engine.model = Qwen3ForCausalLM(config).eval()
    engine.stop_token_ids, engine.pad_id = [2], 0
    g = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(3, args.vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.seqs)
    ]
    sampling = SamplingConfig(max_tokens=args.tokens, temperature=1.0)
    before = _peak_mib()
    start = time.perf_counter()
    if method == "hook":
        out = engine.generate(prompts, sampling, seeds=[0])
        n_tokens = sum(len(g.token_ids) for gens in out for g in gens)
    else:  # the engine's code before this benchmark was written
        ids, mask = engine.prompt_batch(prompts)
        torch.manual_seed(0)
        with torch.no_grad():
            out = engine.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=args.tokens,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=None,
                eos_token_id=[2],
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
            )
            new = out.sequences[:, ids.size(1) :]
            logits = torch.stack(out.logits, dim=1).float()
            logps = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        n_tokens = int(logps.numel())
    elapsed = time.perf_counter() - start
    after = _peak_mib()
    print(
        f"{method:8s} peak RSS before {before:8.0f} MiB, after {after:8.0f} MiB, "
        f"increase {after - before:8.0f} MiB; {n_tokens} tokens in {elapsed:.1f}s ({n_tokens / elapsed:.0f} tok/s)",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--methods", default="hook,stacked")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args()
    if args.one:
        run_one(args.one, args)
        return
    print(
        f"vocab {args.vocab}, {args.seqs} sequences x {args.tokens} new tokens, prompts of {args.prompt_len}"
    )
    for method in args.methods.split(","):
        cmd = [sys.executable, __file__, "--one", method]
        cmd += ["--vocab", str(args.vocab), "--seqs", str(args.seqs), "--tokens", str(args.tokens)]
        cmd += ["--prompt-len", str(args.prompt_len)]
        if subprocess.run(cmd).returncode:
            print(f"{method:8s} failed (out of memory?)")


if __name__ == "__main__":
    main()
