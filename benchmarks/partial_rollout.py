"""Seconds per RL iteration with and without partial rollouts (and any other params variant) on the
trained SFT policy of a finished pipeline workspace, where episode lengths vary as they do in a run.

    python benchmarks/partial_rollout.py --workspace /tmp/clone [--algo grpo] [--iterations 4]
        [--variant partial:rollout.partial=true,algorithms.grpo.correction=tis ...]
        [--set train.val_every=1000 ...] [--json out.json] [--keep]

``--workspace`` is a directory where ``make repro`` (or a profile) has run: its params.yaml, its
prepared data (``data/processed``) and its SFT checkpoint (``models/sft``, and ``models/critic`` when
the critic warm-up ran) are copied into one fresh directory per copy, with this checkout's code
(``components``, ``flows``), and ``python -m flows.train --algo <algo> --rl-seed 0`` runs there with
``train.iterations`` and the copy's overrides written into its params.yaml. The first copy,
``base``, has no override but ``--set``; each ``--variant NAME:key=value,...`` is another. Copies run
one after the other, in the order given, so nothing else of this script runs beside a copy.

Printed per copy (median over iterations 1..N-1; iteration 0 pays the engine's start): seconds of the
iteration (without validation), of its rollout (the generation's own wall time at staleness >= 1) and
update, the turns a rollout played (``partial/turns``; the longest episode's turns without partial
rollouts), the episodes carried in, the batch's mean staleness, and the stage's wall time and peak RSS.
Shared machines are noisy: compare copies of the same run, and repeat.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: this checkout's benchmarks

from benchmarks.rl_iteration import _dotted, _merge, copy_code, run_stage

CODE = ("components", "flows", "pyproject.toml")
FROM_WORKSPACE = ("params.yaml", "data/processed", "models/sft", "models/critic")


def prepare(dest: Path, workspace: Path, iterations: int, sets: list[str]) -> list[str]:
    """A copy of ``workspace``'s inputs and this checkout's code in ``dest``; the skipped override keys."""
    dest.mkdir(parents=True)
    copy_code(dest, CODE)
    for name in FROM_WORKSPACE:
        src = workspace / name
        if src.is_dir():
            shutil.copytree(src, dest / name, symlinks=True)
        elif src.is_file():
            shutil.copy2(src, dest / name)
        elif name in ("params.yaml", "models/sft"):
            raise SystemExit(f"--workspace {workspace}: no {name} (run the pipeline there first)")
    params = yaml.safe_load((dest / "params.yaml").read_text())
    skipped = _merge(params, {"train": {"iterations": iterations}})
    skipped += _merge(params, _dotted(sets))
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return skipped


def measure(tree: Path, algo: str, iterations: int, threads: int) -> dict:
    log = tree / "benchmark.log"
    stage = run_stage(tree, ["-m", "flows.train", "--algo", algo, "--rl-seed", "0"], threads, log)
    import polars as pl

    rows = []
    for k in range(iterations):
        it = tree / "runs" / f"{algo}-s0" / f"iter_{k:04d}"
        m = json.loads((it / "metrics.json").read_text())
        longest = pl.read_parquet(it / "rollouts.parquet")["step"].max() + 1  # without partial: all it played
        rows.append(
            {
                "iteration": m["timing_s/iteration"] - m.get("timing_s/validation", 0.0),
                "rollout": m["timing_s/rollout"],
                "update": m["timing_s/update"],
                "turns": m.get("partial/turns", float(longest)),
                "carried_in": m.get("partial/carried_in_episodes", 0.0),
                "staleness": m.get("rollout/staleness_mean", 0.0),
            }
        )
    later = rows[1:] or rows
    return {
        "per_iteration": rows,
        **{key: statistics.median(r[key] for r in later) for key in rows[0]},
        "stage_wall_s": stage["wall_s"],
        "peak_rss_mib": stage["peak_rss_mib"],
    }


def report(results: dict[str, dict]) -> str:
    lines = [
        "| copy | s iteration | s rollout | s update | turns a rollout | episodes carried in "
        "| mean staleness | train stage (s) | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base = results.get("base", {}).get("iteration")
    for name, r in results.items():
        ratio = f" ({r['iteration'] / base:.2f}x)" if base and name != "base" else ""
        lines.append(
            f"| {name} | {r['iteration']:.2f}{ratio} | {r['rollout']:.2f} | {r['update']:.2f} | "
            f"{r['turns']:.1f} | {r['carried_in']:.0f} | {r['staleness']:.2f} | {r['stage_wall_s']:.0f} | "
            f"{r['peak_rss_mib']:,.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workspace", required=True, type=Path, help="a directory where the pipeline has run")
    ap.add_argument("--algo", default="grpo")
    ap.add_argument("--iterations", type=int, default=4, help="RL iterations (the first is a warm-up)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variant", action="append", default=[], help="NAME:key=value,... (another copy)")
    ap.add_argument("--set", action="append", default=[], help="an override of every copy: key.path=value")
    ap.add_argument("--json", default=None, help="also write the results to this json file")
    ap.add_argument("--keep", action="store_true", help="keep the copies (runs, logs) afterwards")
    args = ap.parse_args()
    copies = {"base": list(args.set)}
    for spec in args.variant:
        name, sep, rest = spec.partition(":")
        if not sep or not name or name in copies:
            raise SystemExit(f"--variant {spec!r}: expected a new NAME:key=value,...")
        copies[name] = [*args.set, *rest.split(",")]
    work = Path(tempfile.mkdtemp(prefix="steprl-partial-"))
    results = {}
    try:
        for name, sets in copies.items():
            skipped = prepare(work / name, args.workspace.resolve(), args.iterations, sets)
            if skipped:
                print(
                    f"{name}: keys absent from the workspace's params.yaml, skipped: {skipped}",
                    file=sys.stderr,
                )
            print(f"{name}: flows.train --algo {args.algo} ({args.iterations} iterations) ...", flush=True)
            results[name] = measure(work / name, args.algo, args.iterations, args.threads)
        print(report(results))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
    finally:
        if args.keep:
            print(f"copies kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
