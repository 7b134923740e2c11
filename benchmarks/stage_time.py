"""Where the train stages' time went, from the metrics/train_<run>.json files a pipeline wrote.

    python benchmarks/stage_time.py                 # every metrics/train_*.json of this workspace
    python benchmarks/stage_time.py --metrics DIR   # another directory of them

Prints one row per run and the total: the stage's parts (process start: Python imports, Prefect and
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--metrics", default=str(Path(__file__).resolve().parents[1] / "metrics"))
    args = parser.parse_args(argv)
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
        return 1
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
