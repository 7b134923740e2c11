"""LoRA against full fine-tuning: seconds per RL iteration and peak memory of the real train stage.

    python benchmarks/lora.py [--size 100m] [--rank 16] [--algo ppo] [--iterations 3] [--threads 2]
                              [--set key.path=value ...] [--workdir DIR] [--keep] [--json FILE]

Two copies of this checkout run the workload of ``benchmarks/rl_iteration.py`` (the calc prompts,
128 trajectories an iteration of at most two turns of 64 tokens, its ``OVERRIDE``) with the embedded
default's model at ``--size`` and ``train.kl_coef=0.05`` (so a KL reference is used): ``full``
(``model.lora.rank=0``: every weight trains, the reference is a second copy of the model) and
``lora`` (``model.lora.rank=--rank`` on params.yaml's target modules: the adapters and the critic's
value head train, the reference is the actor with its adapters off). ``lora`` starts from ``full``'s
data and SFT model (``model.lora`` is read by the train stage only), so only its train stage runs.
``--algo ppo`` (the default) trains an actor and a critic, ``grpo`` the actor alone.

Printed per copy: trained parameters (the actor's), the median seconds of the iteration (without
validation) and of its rollout, advantage (old/ref log-probs, values) and update tasks over
iterations 1..N-1 (iteration 0 is a warm-up), and the train stage's peak resident memory (RSS of the
stage process; vLLM runs inside it on one rank, so its weights and KV cache are in both copies'
figure). Then the ratios lora / full, and a markdown row per copy for docs/gpu.md. Both copies run
one after the other on the same machine: compare figures of one run, and repeat on a busy machine.

``--size``: ``100m`` (hidden 768, MLP 3072, 12 layers, 12 heads, 4 KV heads, head_dim 64: 104.6M
parameters with the 1,024-token vocabulary), ``25m`` (rl_iteration's own model), ``tiny`` (hidden 64,
2 layers, and 32 trajectories an iteration: checks that the benchmark runs, in minutes).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.rl_iteration import measure

SIZES = {
    "100m": [
        "model.hidden_size=768",
        "model.intermediate_size=3072",
        "model.num_layers=12",
        "model.num_heads=12",
        "model.num_kv_heads=4",
        "model.head_dim=64",
    ],
    "25m": [],  # rl_iteration's OVERRIDE: hidden 512, 8 layers
    "tiny": [
        "model.hidden_size=64",
        "model.intermediate_size=128",
        "model.num_layers=2",
        "model.num_heads=2",
        "model.num_kv_heads=1",
        "model.head_dim=32",
        "train.trajectories_per_iteration=32",
        "rollout.max_response_len=32",
    ],
}
COLUMNS = ("iteration", "rollout", "advantage", "update", "sync")


def trained_parameters(tree: Path, rank: int) -> int:
    """The actor's trained parameters: every weight of models/sft, or its LoRA adapters at ``rank``."""
    import yaml

    from components.gpu_memory import count_lora_parameters, count_parameters

    sft = tree / "models" / "sft"
    if rank == 0:
        return count_parameters(sft)
    targets = yaml.safe_load((tree / "params.yaml").read_text())["model"]["lora"]["target_modules"]
    return count_lora_parameters(sft, rank=rank, target_modules=targets)


def table(rows: list[dict]) -> str:
    head = ["copy", "trained params", *(f"s {c}" for c in COLUMNS), "train stage peak RSS MiB"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        cells = [r["name"], f"{r['trained'] / 1e6:.2f}M", *(f"{r['seconds'][c]:.2f}" for c in COLUMNS)]
        lines.append(" | ".join([*cells, f"{r['peak_rss_mib']:.0f}"]))
    return "\n".join(f"| {line} |" for line in lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="100m")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--algo", choices=("ppo", "grpo"), default="ppo")
    ap.add_argument("--iterations", type=int, default=3, help="RL iterations (the first is a warm-up)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], help="extra params override key.path=value")
    ap.add_argument("--workdir", default=None, help="where the copies run (default: a temporary dir)")
    ap.add_argument("--keep", action="store_true", help="keep the copies (runs, logs) afterwards")
    ap.add_argument("--json", default=None, help="also write the results to this json file")
    args = ap.parse_args()
    if args.rank < 1:
        raise SystemExit(f"--rank {args.rank}: LoRA needs a rank >= 1")
    if args.iterations < 1:
        raise SystemExit(f"--iterations {args.iterations}: need at least 1")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="steprl-lora-"))
    work.mkdir(parents=True, exist_ok=True)
    common = [
        *SIZES[args.size],
        "train.kl_coef=0.05",
        f"compare.algorithms=[{args.algo}]",
        f"algorithms.{args.algo}.samples_per_prompt=8",
        *args.set,
    ]
    rows = []
    try:
        for name, rank in (("full", 0), ("lora", args.rank)):
            tree = work / name
            if tree.exists():
                raise SystemExit(f"{tree} exists: pass an empty --workdir")
            print(f"[{name}] model.lora.rank={rank} in {tree} ...", flush=True)
            reuse = work / "full" if name == "lora" else None
            sets = [*common, f"model.lora.rank={rank}"]
            r = measure(tree, None, args.iterations, args.threads, sets, reuse=reuse, algo=args.algo)
            rows.append(
                {
                    "name": name,
                    "rank": rank,
                    "trained": trained_parameters(tree, rank),
                    "params_total": r["model"]["params_total"],
                    "seconds": r["seconds"],
                    "seconds_all": r["seconds_all"],
                    "peak_rss_mib": r["stages"]["train"]["peak_rss_mib"],
                    "train_stage_wall_s": r["stages"]["train"]["wall_s"],
                    "skipped_override_keys": r["skipped_override_keys"],
                }
            )
        full, lora = rows
        print(
            f"LoRA rank {args.rank} vs full fine-tuning: {args.algo}, {full['params_total'] / 1e6:.1f}M-parameter "
            f"model ({args.size}), KL reference on, {args.iterations} iteration(s), {args.threads} thread(s)"
        )
        print(table(rows))
        it = lora["seconds"]["iteration"] / max(full["seconds"]["iteration"], 1e-9)
        up = lora["seconds"]["update"] / max(full["seconds"]["update"], 1e-9)
        mem = lora["peak_rss_mib"] / max(full["peak_rss_mib"], 1e-9)
        print(f"lora / full: s/iteration {it:.2f}x, update {up:.2f}x, train stage peak RSS {mem:.2f}x")
        for r in rows:
            if r["skipped_override_keys"]:
                print(f"{r['name']}: override keys not in params.yaml: {r['skipped_override_keys']}")
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "results": rows}, indent=2))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"copies kept in {work}")


if __name__ == "__main__":
    main()
