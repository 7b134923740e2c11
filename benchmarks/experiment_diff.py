"""Two experiments' test results side by side: per model and protocol, B - A with its interval.

    python benchmarks/experiment_diff.py A_METRICS B_METRICS [--models grpo,sft] [--protocols ...]

A_METRICS and B_METRICS are the ``metrics/`` directories of two runs of the pipeline on the same
test problems (two DVC experiments: ``dvc exp apply`` one, copy its ``metrics/``, then the other),
e.g. a remedy against its baseline. reports/compare.md compares the algorithms of one experiment with
its SFT model; this compares one model across experiments. For each model (``sft`` or an algorithm,
whose seeds are the ``problems_<algo>-s<seed>.parquet`` files present in both) and each column of
the per-problem tables (success and loop rate under each protocol), it prints A's and B's mean and
B - A with the crossed bootstrap interval of components.stats (problems paired, each experiment's
seeds drawn on their own), and the per-seed means, so that two or three seeds are read as what they
are.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.stats import difference_interval, mean_interval, score_matrix

COLUMNS = {
    "t0.4 success": "t0.4_correct",
    "greedy success": "correct",
    "t1 success": "t1_correct",
    "t0.4 loop rate": "t0.4_loop_rate",
    "greedy loop rate": "loop_rate",
    "t1 loop rate": "t1_loop_rate",
}


def seed_tables(metrics: Path, model: str) -> dict[str, pl.DataFrame]:
    """``{run name: per-problem table}`` of ``model`` in one metrics directory (``sft``: one table)."""
    if model == "sft":
        path = metrics / "problems_sft.parquet"
        return {"sft": pl.read_parquet(path)} if path.is_file() else {}
    pattern = re.compile(rf"problems_({re.escape(model)}-s\d+)\.parquet")
    return {
        m.group(1): pl.read_parquet(p)
        for p in sorted(metrics.glob("problems_*.parquet"))
        if (m := pattern.fullmatch(p.name))
    }


def _per_seed(m) -> str:
    return "/".join(f"{v:.3f}" for v in m.mean(axis=1))


def compare(a: Path, b: Path, model: str, columns: dict[str, str]) -> list[str]:
    """Lines of the comparison of ``model`` between experiments ``a`` and ``b``."""
    ta, tb = seed_tables(a, model), seed_tables(b, model)
    if not ta or not tb:
        return [f"{model}: no per-problem tables in {'both' if not ta and not tb else (a if not ta else b)}"]
    ids = sorted(next(iter(ta.values()))["id"].to_list())
    lines = [f"{model}: A {sorted(ta)}, B {sorted(tb)}, {len(ids)} problems"]
    for label, column in columns.items():
        if any(column not in t.columns for t in [*ta.values(), *tb.values()]):
            continue
        ma, mb = score_matrix(ta, column, ids), score_matrix(tb, column, ids)
        ea, eb, d = mean_interval(ma), mean_interval(mb), difference_interval(mb, ma)
        lines.append(
            f"  {label:17s} A {ea.value:.3f}  B {eb.value:.3f}  B-A {d.format(signed=True)}"
            f"   per seed A {_per_seed(ma)}  B {_per_seed(mb)}"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="metrics/ of experiment A (the baseline)")
    ap.add_argument("b", type=Path, help="metrics/ of experiment B")
    ap.add_argument("--models", default="sft,grpo,ppo,steppo,gigpo")
    ap.add_argument("--protocols", default=",".join(COLUMNS), help="a subset of: " + ", ".join(COLUMNS))
    args = ap.parse_args()
    unknown = [p for p in args.protocols.split(",") if p not in COLUMNS]
    if unknown:
        ap.error(f"--protocols: unknown {unknown}; choose from {list(COLUMNS)}")
    columns = {p: COLUMNS[p] for p in args.protocols.split(",")}
    for d in (args.a, args.b):
        if not d.is_dir():
            ap.error(f"{d} is not a directory")
    for model in args.models.split(","):
        print("\n".join(compare(args.a, args.b, model, columns)))


if __name__ == "__main__":
    main()
