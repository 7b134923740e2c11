"""Where the stages' time went, from the timing/<stage>.json and metrics/train_<run>.json files a
pipeline wrote.

    python benchmarks/stage_time.py                 # this workspace's timing/ and metrics/
    python benchmarks/stage_time.py --metrics DIR --timing DIR

First every stage that ran (timing/<stage>.json, written by each stage when it succeeds: the last run
of each stage, with the time it finished): the process start (interpreter start and imports, up to
the stage's main), the parts the stage times (the rollout engine's start, the episodes, the SFT
training, the critic fit; for a train stage the parts below), the rest of the run (``other``: Prefect,
MLflow, params, reading and writing tables) and the total. Then the train stages in detail,
one row per run and the total: the stage's parts (process start: Python imports, Prefect and
params; session start: DeepSpeed engines, reference model, vLLM; the SFT policy's validation; the RL
iterations; the final checkpoint; the final test evaluation), the iterations split into rollout,
score, advantage (reference and critic forwards), update, sync and validation, and the share of the
stage that was RL (rollout + advantage + update + sync). DVC's own time between stages is not in these
files: compare the total with the wall time of the whole `dvc repro`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PARTS = ("process_start", "session_start", "initial_validation", "iterations", "save", "final_evaluation")
ITER = ("rollout", "score", "advantage", "update", "sync", "validation")
RL = ("rollout", "advantage", "update", "sync")


def stage_table(timing: Path) -> int:
    """Print one row per timing/<stage>.json (oldest first); the number of rows."""
    records = sorted((json.loads(f.read_text()) for f in timing.glob("*.json")), key=lambda r: r["finished"])
    if not records:
        print(f"no stage timing under {timing} (written by each stage since docs/performance.md)")
        return 0
    print("stage | finished (UTC) | process start | parts | other | total | process start share")
    for r in records:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in r["parts"].items()) or "-"
        share = r["process_start"] / r["total"] if r["total"] else 0.0
        print(
            f"{r['stage']} | {r['finished']} | {r['process_start']:.1f} | {parts} | {r['other']:.1f} | "
            f"{r['total']:.1f} | {share:.0%}"
        )
    total = sum(r["total"] for r in records)
    start = sum(r["process_start"] for r in records)
    print(f"ALL | | {start:.1f} | | | {total:.1f} | {start / total:.0%}\n")
    return len(records)


def main(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parents[1]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--metrics", default=str(root / "metrics"))
    parser.add_argument("--timing", default=str(root / "timing"))
    args = parser.parse_args(argv)
    stages = stage_table(Path(args.timing))
    files = sorted(Path(args.metrics).glob("train_*.json"))
    rows = []
    for f in files:
        m = json.loads(f.read_text())
        if "stage_s" not in m:
            print(f"{f.name}: written before stage timing was recorded; skipped")
            continue
        rows.append((m["run"], m["stage_s"], m["iterations_s"]))
    if not rows:
        print(f"no metrics/train_*.json with stage timing under {args.metrics}")
        return 0 if stages else 1
    head = ["run", *PARTS, "stage total", *(f"it:{p}" for p in ITER), "RL share"]
    print(" | ".join(head))
    totals: dict[str, float] = {}
    for run, stage, it in rows:
        total = sum(stage.get(p, 0.0) for p in PARTS)
        rl = sum(it.get(p, 0.0) for p in RL)
        cells = [stage.get(p, 0.0) for p in PARTS] + [total] + [it.get(p, 0.0) for p in ITER]
        for key, v in zip([*PARTS, "total", *ITER], cells):
            totals[key] = totals.get(key, 0.0) + v
        totals["rl"] = totals.get("rl", 0.0) + rl
        print(" | ".join([run, *(f"{v:.1f}" for v in cells), f"{rl / total:.0%}"]))
    cells = [totals[p] for p in [*PARTS, "total", *ITER]]
    print(" | ".join(["ALL", *(f"{v:.1f}" for v in cells), f"{totals['rl'] / totals['total']:.0%}"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
