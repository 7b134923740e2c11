"""How long the vLLM rollout engine takes to start on the embedded default model, and on what.

    python benchmarks/engine_start.py                         # 3 fresh processes, params.yaml's rollout
    python benchmarks/engine_start.py --repeats 5 --kv-cache-gib 1 0.25

Builds a model of params.yaml's ``model`` sizes (a BPE tokenizer trained on a small arithmetic corpus,
the seeded tiny Qwen3 model: what the base_model stage builds, on another corpus) into a temporary
folder, then for each repeat and each ``--kv-cache-gib`` (in turn, so a neighbour's load falls on all
alike) starts :class:`components.rollout.vllm_engine.VLLMEngine` with params.yaml's rollout settings in
a fresh process (vLLM reads its environment once per process), as a stage does. Prints per setting
the median and spread of: ``import vllm``, the engine's construction, one greedy generation, and
vLLM's own timing lines of the start (model load, KV cache, warm-up) from its INFO log. Shared
machines are noisy: read the parts' shares, and repeat on a quiet machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# vLLM INFO lines that time a part of the start (worded as in vllm 0.32)
_TIMING_LINE = re.compile(r"(took|seconds|init engine|Memory profiling|KV cache|warm)", re.I)


def build_model(out: Path) -> None:
    from components.config import load_params
    from components.model.tiny import build_tiny_model, save_hf
    from components.model.tokenizer import build_tokenizer

    m = load_params(str(ROOT / "params.yaml")).model
    corpus = [f"What is {a} + {b}? The answer is {a + b}." for a in range(60) for b in range(0, 60, 7)]
    tok = build_tokenizer(corpus, vocab_size=min(m.vocab_size, 400))
    model = build_tiny_model(
        tok,
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        num_kv_heads=m.num_kv_heads,
        head_dim=m.head_dim,
        max_position_embeddings=m.max_position_embeddings,
        seed=0,
    )
    save_hf(model, tok, out)


def child(model_dir: str, kv_cache_gib: float) -> None:
    """One engine start in this fresh process; prints a JSON line of its timings."""
    from components.config import load_params
    from components.rollout.base import SamplingConfig

    settings = load_params(str(ROOT / "params.yaml")).rollout.engine_settings(0)
    settings = dataclasses.replace(settings, kv_cache_gib=kv_cache_gib)
    t0 = time.perf_counter()
    import vllm  # noqa: F401

    from components.rollout.vllm_engine import VLLMEngine

    t1 = time.perf_counter()
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(model_dir).eos_token_id
    t2 = time.perf_counter()
    engine = VLLMEngine(model_dir, settings, stop_token_ids=[eos])
    t3 = time.perf_counter()
    engine.generate([[1, 2, 3, 4]], SamplingConfig(max_tokens=8, temperature=0.0))
    t4 = time.perf_counter()
    engine.close()
    out = {"import_vllm": t1 - t0, "engine_start": t3 - t2, "first_generate": t4 - t3}
    print("TIMING " + json.dumps(out), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kv-cache-gib", type=float, nargs="*", default=[1.0])
    ap.add_argument("--child", nargs=2, metavar=("MODEL_DIR", "KV_GIB"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], float(args.child[1]))
        return 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_LOGGING_LEVEL": "INFO"}
    results: dict[float, list[dict]] = {}
    logs: dict[float, list[str]] = {}  # vLLM's lines of the latest start per setting
    with tempfile.TemporaryDirectory(prefix="steprl-engine-") as tmp:
        model_dir = Path(tmp) / "model"
        build_model(model_dir)
        for r in range(args.repeats):
            print(f"repeat {r + 1}/{args.repeats}: load average {os.getloadavg()[0]:.2f}", flush=True)
            for gib in args.kv_cache_gib:
                done = subprocess.run(
                    [sys.executable, __file__, "--child", str(model_dir), str(gib)],
                    cwd=ROOT,
                    env=env,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                lines = (done.stdout + done.stderr).splitlines()
                found = [json.loads(x[7:]) for x in lines if x.startswith("TIMING ")]
                if done.returncode or not found:
                    raise SystemExit(f"engine start failed:\n{(done.stdout + done.stderr)[-3000:]}")
                results.setdefault(gib, []).append(found[0])
                logs[gib] = [x for x in lines if _TIMING_LINE.search(x) and not x.startswith("TIMING")]
                print(f"  kv_cache_gib {gib:g}: " + ", ".join(f"{k} {v:.1f}" for k, v in found[0].items()))
                for line in logs[gib][-12:]:
                    print(f"    {line[-200:]}", flush=True)
    print(f"\n{args.repeats} repeats, {os.cpu_count()} CPUs; seconds, median (min-max)")
    for gib, runs in results.items():
        cells = []
        for key in ("import_vllm", "engine_start", "first_generate"):
            v = [run[key] for run in runs]
            cells.append(f"{key} {statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})")
        print(f"kv_cache_gib {gib:g}: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
