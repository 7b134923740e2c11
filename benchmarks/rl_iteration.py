"""Seconds, tokens, model FLOPs and model-FLOPs utilisation (MFU) of one RL iteration of the real train stage.

    python benchmarks/rl_iteration.py [--iterations 3] [--threads 2] [--baseline <commit>]
                                      [--variant bf16:deepspeed.dtype=auto,rollout.dtype=auto ...]
                                      [--set train.old_logprobs=recompute ...] [--workdir DIR] [--keep]

The workload is a params override of the real pipeline, not a separate code path: a 25M-parameter
Qwen3 built by ``base_model`` (hidden 512, 8 layers, 8 heads, 4 KV heads, head_dim 64, MLP 1536), the
calc prompts (~100 tokens), 16 prompts x 8 samples = 128 GRPO trajectories of at most two turns
(the calculator call, then the answer) of at most 64 tokens each, in each copy's default precision
(fp32; ``--variant bf16:deepspeed.dtype=auto,rollout.dtype=auto`` for bf16 where the CPU has it). (Issue 12 measured one turn; the
params check now refuses rollout.max_steps below a problem's calls + 1.) The code under test is
copied to ``<workdir>/new`` (this checkout's working tree); each ``--variant NAME:key=value,...``
is another copy of it with those params (e.g. fp32), and ``--baseline`` ``git archive <commit>`` to
``<workdir>/base``; each copy runs
``python -m flows.prepare``, ``flows.base_model``, ``flows.sft`` (2 steps: only a valid checkpoint
is needed) and ``flows.train --algo grpo --rl-seed 0`` with the override written into its own
params.yaml. Nothing is written into this checkout.

Printed per copy (median over iterations 1..N-1; iteration 0 is a warm-up):
- seconds per task of the train stage (``timing_s/*`` of runs/grpo-s0/iter_*/metrics.json: rollout,
  score, advantage = old/ref log-probs + critic values + estimator, update = actor step + checkpoint
  save, sync = weights into vLLM), the iteration without validation, and each stage's wall time;
- tokens: prompt and generated (rollout), trained (every trajectory's prompt + response, what the
  update's loss reads) and forwarded by the update when each group's shared prompt is run once;
- model FLOPs: forward 2N per token (rollout: prompt + generated, including the prompt tokens vLLM's
  prefix cache serves without computing them, so the rollout's ratio to the peak can pass 100%;
  recomputed old log-probs: trained
  tokens), training 6N per trained token, N = parameters without the input embedding, plus causal
  attention 4 * layers * heads * head_dim * T(T+1)/2 per sequence of T tokens forward (x3 trained);
- the matmul peak measured in this run (before and after the copies, the best) on the same number of
  threads (torch.matmul fp32 2048^2, bf16 1024^2: a CPU without AVX-512 bf16 runs bf16 matmuls far
  slower), and MFU = executed FLOPs / (seconds x the peak of the copy's training precision, fp32 or
  bf16) of the rollout, the update and the
  iteration (an update on shared prompts executes fewer FLOPs than the model FLOPs of its
  sequences; the last row divides the model FLOPs instead: effective utilisation);
- peak resident memory (RSS) of each stage process.

Shared machines are noisy: compare figures of the same run, and repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from components.precision import resolve_train_dtype

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("components", "flows", "params.yaml", "pyproject.toml")

# The workload of issue 12 as a params override (keys absent from a copy's params.yaml are skipped).
OVERRIDE = {
    # one calculator call per problem (the key moved from prepare to tasks.calc; one of the two is skipped)
    "prepare": {"n_train": 400, "n_val": 16, "n_test": 16, "min_calls": 1, "max_calls": 1},
    "tasks": {"calc": {"min_calls": 1, "max_calls": 1}},
    "model": {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_layers": 8,
        "num_heads": 8,
        "num_kv_heads": 4,
        "head_dim": 64,
    },
    "sft": {"steps": 2, "batch_size": 16, "micro_batch_size": 16, "rows": 100, "warmup_steps": 1},
    "rollout": {"max_steps": 2, "max_response_len": 64},
    "train": {"trajectories_per_iteration": 128, "val_every": 1000, "val_samples": 8, "kl_coef": 0.0},
    "algorithms": {"grpo": {"samples_per_prompt": 8}},
    "compare": {"algorithms": ["grpo"], "seeds": [0]},
}
TASKS = ("rollout", "score", "advantage", "update", "sync")


def _merge(params: dict, override: dict, where: str = "") -> list[str]:
    skipped = []
    for key, value in override.items():
        if key not in params:
            skipped.append(where + key)
        elif isinstance(value, dict) and isinstance(params[key], dict):
            skipped += _merge(params[key], value, f"{where}{key}.")
        else:
            params[key] = value
    return skipped


def _dotted(sets: list[str]) -> dict:
    out: dict = {}
    for s in sets:
        key, _, raw = s.partition("=")
        if not raw:
            raise SystemExit(f"--set {s!r}: expected key.path=value")
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = yaml.safe_load(raw)
    return out


def copy_code(dest: Path, names: Sequence[str]) -> None:
    """This checkout's files or directories ``names`` (relative to the repo root) into ``dest``."""
    for name in names:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)


def prepare_copy(
    dest: Path, commit: str | None, iterations: int, sets: list[str], overlay: list[str] = ()
) -> list[str]:
    """``commit`` (git archive) or, if None, this checkout's working tree, into ``dest``; ``overlay``:
    working-tree paths copied over it (e.g. one file under test on top of HEAD)."""
    dest.mkdir(parents=True)
    if commit is None:
        copy_code(dest, COPIED)
    else:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", commit, *COPIED], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    for rel in overlay:
        if not (ROOT / rel).is_file():
            raise SystemExit(f"--overlay {rel}: not a file of {ROOT}")
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    params = yaml.safe_load((dest / "params.yaml").read_text())
    override = json.loads(json.dumps(OVERRIDE))
    override["train"]["iterations"] = iterations
    skipped = _merge(params, override)
    skipped += _merge(params, _dotted(sets))
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return skipped


def run_stage(tree: Path, args: list[str], threads: int, log: Path) -> dict:
    """One stage as its own process; wall seconds and peak RSS (MiB) of that process."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(tree)}
    env.pop("MLFLOW_TRACKING_URI", None)
    t0 = time.perf_counter()
    with log.open("a") as out:
        out.write(f"\n$ python {' '.join(args)}\n")
        out.flush()
        proc = subprocess.Popen([sys.executable, *args], cwd=tree, env=env, stdout=out, stderr=out)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{tree.name}: `python {' '.join(args)}` failed; see {log}")
    return {"wall_s": wall, "peak_rss_mib": usage.ru_maxrss / 1024}


def model_shape(tree: Path) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(tree / "models" / "sft")
    with torch.device("meta"):  # shapes only
        model = AutoModelForCausalLM.from_config(cfg)
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    # N counts the LM head matmul even when it shares the embedding's weights.
    n = total - embed + (embed if tied else 0)
    return {
        "params_total": total,
        "N": n,
        "layers": cfg.num_hidden_layers,
        "attn_width": cfg.num_attention_heads
        * getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads),
    }


def _attn(lengths: list[int], shape: dict) -> float:
    return sum(4.0 * shape["layers"] * shape["attn_width"] * t * (t + 1) / 2 for t in lengths)


def iteration_tokens(it: Path) -> dict:
    import polars as pl

    steps = pl.read_parquet(it / "rollouts.parquet").to_dicts()
    prompt = sum(len(s["prompt_ids"]) for s in steps)
    generated = sum(len(s["response_ids"]) for s in steps)
    # A trajectory is forwarded once by the update (its last step holds every earlier one).
    by_traj: dict[str, list[int]] = {}
    first_prompt: dict[str, tuple] = {}
    for s in steps:
        seq = list(s["prompt_ids"]) + list(s["response_ids"])
        if len(seq) > len(by_traj.get(s["traj_id"], [])):
            by_traj[s["traj_id"]] = seq
        if s["step"] == 0:
            first_prompt[s["traj_id"]] = tuple(s["prompt_ids"])
    trained = [len(v) for v in by_traj.values()]
    groups: dict[tuple, int] = {}
    for p in first_prompt.values():
        groups[p] = groups.get(p, 0) + 1
    shared = sum(len(p) * (n - 1) for p, n in groups.items())  # prompt tokens a group runs once
    return {
        "prompt": prompt,
        "generated": generated,
        "trained": sum(trained),
        "forwarded_shared_prompt": sum(trained) - shared,
        "seq_lengths": trained,
        "rollout_lengths": [len(s["prompt_ids"]) + len(s["response_ids"]) for s in steps],
        "steps": len(steps),
    }


def matmul_peak(threads: int) -> dict[str, float]:
    """GFLOP/s of torch.matmul on ``threads`` threads: fp32 2048^2, bf16 1024^2 (best of >= 1 s)."""
    import torch

    torch.set_num_threads(threads)
    out = {}
    for dtype, n in ((torch.float32, 2048), (torch.bfloat16, 1024)):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        a @ b
        best, spent = float("inf"), 0.0
        while spent < 1.0:
            t0 = time.perf_counter()
            a @ b
            dt = time.perf_counter() - t0
            best, spent = min(best, dt), spent + dt
        out[str(dtype).removeprefix("torch.")] = 2 * n**3 / best / 1e9
    return out


def measure(
    tree: Path,
    commit: str | None,
    iterations: int,
    threads: int,
    sets: list[str],
    overlay: list[str] = (),
    reuse: Path | None = None,
    algo: str = "grpo",
) -> dict:
    """One copy's figures; ``algo``: the algorithm its train stage runs (run ``<algo>-s0``)."""
    skipped = prepare_copy(tree, commit, iterations, sets, overlay)
    log = tree / "benchmark.log"
    stages = {}
    if reuse is not None:  # the data and SFT model of an earlier copy: only the train stage runs
        for rel in ("data", "models"):
            shutil.copytree(reuse / rel, tree / rel)
    else:
        for stage in ("prepare", "base_model", "sft"):
            stages[stage] = run_stage(tree, ["-m", f"flows.{stage}"], threads, log)
    # Before RL seeds existed (e.g. 4475d3e) the run was runs/grpo, started without --rl-seed.
    seeded = "--rl-seed" in (tree / "flows" / "train.py").read_text()
    run = f"{algo}-s0" if seeded else algo
    seed_args = ["--rl-seed", "0"] if seeded else []
    stages["train"] = run_stage(tree, ["-m", "flows.train", "--algo", algo, *seed_args], threads, log)
    params = yaml.safe_load((tree / "params.yaml").read_text())
    recompute = params["train"].get("old_logprobs", "recompute") == "recompute"
    precision = resolve_train_dtype(params.get("deepspeed", {}).get("dtype", "fp32"))
    # Does this copy's update forward each group's shared prompt once (executed FLOPs are then fewer)?
    shares = "share_prefix=True" in (tree / "components" / "train" / "rl_update.py").read_text()
    shape = model_shape(tree)
    per_iter = []
    for k in range(iterations):
        it = tree / "runs" / run / f"iter_{k:04d}"
        m = json.loads((it / "metrics.json").read_text())
        timing = {t: m.get(f"timing_s/{t}", 0.0) for t in TASKS}
        timing["iteration"] = m["timing_s/iteration"] - m.get("timing_s/validation", 0.0)
        tok = iteration_tokens(it)
        n = shape["N"]
        flops = {
            "rollout": 2 * n * (tok["prompt"] + tok["generated"]) + _attn(tok["rollout_lengths"], shape),
            "old_logprobs": (2 * n * tok["trained"] + _attn(tok["seq_lengths"], shape)) if recompute else 0.0,
            "update": 6 * n * tok["trained"] + 3 * _attn(tok["seq_lengths"], shape),
        }
        # What the update runs: shared prompts once (attention still spans the whole sequences).
        executed = tok["forwarded_shared_prompt"] if shares else tok["trained"]
        flops["update_executed"] = 6 * n * executed + 3 * _attn(tok["seq_lengths"], shape)
        per_iter.append({"timing": timing, "tokens": tok, "flops": flops})
    used = per_iter[1:] or per_iter
    med = lambda f: statistics.median(f(x) for x in used)  # noqa: E731
    result = {
        "tree": str(tree),
        "commit": (commit or "working tree") + (" + overlay" if overlay else ""),
        "skipped_override_keys": skipped,
        "old_logprobs": "recompute" if recompute else params["train"].get("old_logprobs", "rollout"),
        "precision": precision,
        "model": shape,
        "stages": stages,
        "iterations_used": len(used),
        "seconds": {t: med(lambda x, t=t: x["timing"][t]) for t in (*TASKS, "iteration")},
        "seconds_all": [x["timing"]["iteration"] for x in per_iter],
        "tokens": {
            t: med(lambda x, t=t: x["tokens"][t])
            for t in ("prompt", "generated", "trained", "forwarded_shared_prompt", "steps")
        },
        "shares_prompts": shares,
        "flops": {
            t: med(lambda x, t=t: x["flops"][t])
            for t in ("rollout", "old_logprobs", "update", "update_executed")
        },
    }
    (tree / "benchmark_result.json").write_text(json.dumps(result, indent=2))
    return result


def report(results: list[dict], peak: dict, threads: int) -> str:
    names = [r["commit"] for r in results]
    rows: list[tuple[str, list[str]]] = []

    def add(label: str, f) -> None:
        rows.append((label, [f(r) for r in results]))

    def top(r: dict) -> float:  # FLOP/s peak of the precision the copy trained in
        return peak["bfloat16" if r["precision"] in ("amp_bf16", "bf16") else "float32"] * 1e9

    add("precision (MFU against its matmul peak)", lambda r: r["precision"])
    add("old log-probs source", lambda r: r["old_logprobs"])
    add(
        "model parameters (N for FLOPs)",
        lambda r: f"{r['model']['params_total'] / 1e6:.1f}M ({r['model']['N'] / 1e6:.1f}M)",
    )
    for t in (*TASKS, "iteration"):
        add(f"seconds {t} (median)", lambda r, t=t: f"{r['seconds'][t]:.2f}")
    add("seconds iteration (min of 1..N-1)", lambda r: f"{min(r['seconds_all'][1:] or r['seconds_all']):.2f}")
    add("seconds per iteration (all)", lambda r: " ".join(f"{s:.1f}" for s in r["seconds_all"]))
    for t in ("prompt", "generated", "trained", "forwarded_shared_prompt"):
        add(f"tokens {t}", lambda r, t=t: f"{r['tokens'][t]:.0f}")
    for t in ("rollout", "old_logprobs", "update"):
        add(f"GFLOP {t}", lambda r, t=t: f"{r['flops'][t] / 1e9:.0f}")
    add("update forwards shared prompts once", lambda r: str(r.get("shares_prompts", False)))
    add("GFLOP update executed", lambda r: f"{r['flops']['update_executed'] / 1e9:.0f}")
    model_flops = lambda r: r["flops"]["rollout"] + r["flops"]["old_logprobs"] + r["flops"]["update"]  # noqa: E731
    run_flops = lambda r: r["flops"]["rollout"] + r["flops"]["old_logprobs"] + r["flops"]["update_executed"]  # noqa: E731
    add("GFLOP iteration (model)", lambda r: f"{model_flops(r) / 1e9:.0f}")
    add(
        "rollout model FLOPs / s / peak (cached prompts count)",
        lambda r: f"{r['flops']['rollout'] / max(r['seconds']['rollout'], 1e-9) / top(r):.1%}",
    )
    add(
        "MFU update (+advantage), executed FLOPs",
        lambda r: (
            f"{(r['flops']['update_executed'] + r['flops']['old_logprobs']) / max(r['seconds']['update'] + r['seconds']['advantage'], 1e-9) / top(r):.1%}"
        ),
    )
    add("MFU iteration, executed FLOPs", lambda r: f"{run_flops(r) / r['seconds']['iteration'] / top(r):.1%}")
    add(
        "model FLOPs / s / peak (effective)",
        lambda r: f"{model_flops(r) / r['seconds']['iteration'] / top(r):.1%}",
    )
    for s in [s for s in ("prepare", "base_model", "sft", "train") if all(s in r["stages"] for r in results)]:
        add(
            f"stage {s}: wall s / peak RSS MiB",
            lambda r, s=s: f"{r['stages'][s]['wall_s']:.0f} / {r['stages'][s]['peak_rss_mib']:.0f}",
        )
    width = max(len(label) for label, _ in rows)
    cols = [max(len(n), *(len(v[i]) for _, v in rows)) for i, n in enumerate(names)]
    lines = [
        f"RL iteration benchmark: GRPO 16 prompts x 8 samples, two turns <= 64 tokens each, {threads} thread(s)",
        f"matmul peak on {threads} thread(s): fp32 {peak['float32']:.1f} GFLOP/s (2048^2), "
        f"bf16 {peak['bfloat16']:.1f} GFLOP/s (1024^2)",
        "",
        " " * width + "  " + "  ".join(n.rjust(c) for n, c in zip(names, cols)),
    ]
    lines += [label.ljust(width) + "  " + "  ".join(x.rjust(c) for x, c in zip(v, cols)) for label, v in rows]
    if len(results) >= 2:
        base = results[-1]["seconds"]["iteration"]
        for r in results[:-1]:
            x = base / max(r["seconds"]["iteration"], 1e-9)
            lines.append(f"speed-up per iteration {names[-1]} -> {r['commit']}: {x:.2f}x")
    for r in results:
        if r["skipped_override_keys"]:
            lines.append(f"{r['commit']}: override keys not in its params.yaml: {r['skipped_override_keys']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=3, help="RL iterations (the first is a warm-up)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    ap.add_argument("--new", default=None, help="a commit to measure as new (default: the working tree)")
    ap.add_argument(
        "--overlay", action="append", default=[], help="working-tree file copied over --new (repeatable)"
    )
    ap.add_argument("--baseline", default=None, help="a commit to measure in the same run (git archive)")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME:key=value,... another copy of --new with these params (repeatable)",
    )
    ap.add_argument("--set", action="append", default=[], help="extra params override key.path=value")
    ap.add_argument("--workdir", default=None, help="where the copies run (default: a temporary dir)")
    ap.add_argument(
        "--reuse",
        default=None,
        help="a kept copy whose data/ and models/ (same params) every copy starts from: only train runs",
    )
    ap.add_argument("--keep", action="store_true", help="keep the copies (runs, logs) afterwards")
    ap.add_argument("--json", default=None, help="also write the results to this json file")
    args = ap.parse_args()
    if args.iterations < 1:
        raise SystemExit(f"--iterations {args.iterations}: need at least 1")

    work = Path(args.workdir or tempfile.mkdtemp(prefix="steprl-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    before = matmul_peak(args.threads)
    try:
        copies = [("new", args.new, [])]
        for v in args.variant:
            name, _, sets = v.partition(":")
            if not name or not sets:
                raise SystemExit(f"--variant {v!r}: expected NAME:key=value,...")
            copies.append((name, args.new, sets.split(",")))
        if args.baseline is not None:
            copies.append(("base", args.baseline, []))
        for label, commit, sets in copies:
            tree = work / label
            if tree.exists():
                raise SystemExit(f"{tree} exists: pass an empty --workdir")
            print(f"[{label}] measuring {commit or 'the working tree'} in {tree} ...", flush=True)
            overlay = args.overlay if label != "base" else []
            reuse = Path(args.reuse) if args.reuse else None
            result = measure(tree, commit, args.iterations, args.threads, [*args.set, *sets], overlay, reuse)
            result["commit"] = f"{label}: {result['commit']}"
            results.append(result)
        after = matmul_peak(args.threads)  # the best of before and after: load only lowers it
        peak = {k: max(before[k], after[k]) for k in before}
        print(report(results, peak, args.threads))
        usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"(this benchmark process: peak RSS {usage:.0f} MiB)")
        if args.json:
            Path(args.json).write_text(json.dumps({"peak_gflops": peak, "results": results}, indent=2))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"copies kept in {work}")


if __name__ == "__main__":
    main()
