"""Where each phase of an RL iteration waits: a timeline of generation and of the trainer's work per
iteration (its forwards for scores, old and reference log-probs and values, then the update), one
row pair per run, drawn from the runs' iteration metrics.

    python benchmarks/timeline.py COPY_DIR [COPY_DIR ...] [--run grpo-s0] --out timeline.png

Each ``COPY_DIR`` is a workspace where the train stage ran (a copy kept by
``benchmarks/partial_rollout.py --keep``, or a pipeline checkout); its
``runs/<run>/iter_*/metrics.json`` are read. Iterations that carry ``timeline/rollout_start``,
``_end``, ``timeline/update_start`` and ``_end`` (wall-clock seconds, written by the train stage) are
drawn where they happened (the trainer's forwards, ``timing_s/score`` + ``timing_s/advantage``, end
where the update starts): at staleness >= 1 generation k+1 runs beside the trainer's work on
iteration k, and the bars overlap. An iteration without them (written before the synchronous path recorded its timeline) is
laid out from its ``timing_s/*`` durations, one phase after the other, and its bars are hatched.
Time 0 of each row pair is its first iteration's start; bars are labelled with the iteration.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's components

from components.plots import _pyplot

PHASES = ("rollout", "update")  # recorded in timeline/*; "forwards" is derived


def spans(run_dir: Path) -> tuple[list[dict[str, tuple[float, float]]], bool]:
    """Per iteration ``{phase: (start, end)}`` in seconds from the first iteration's start, and whether
    every span was recorded (False: some were laid out from durations)."""
    metrics = [json.loads(p.read_text()) for p in sorted(run_dir.glob("iter_*/metrics.json"))]
    if not metrics:
        raise SystemExit(f"{run_dir}: no iter_*/metrics.json")
    out, recorded, clock = [], True, None
    for m in metrics:
        if all(f"timeline/{p}_{e}" in m for p in PHASES for e in ("start", "end")):
            row = {p: (m[f"timeline/{p}_start"], m[f"timeline/{p}_end"]) for p in PHASES}
            u0 = row["update"][0]
            row["forwards"] = (u0 - m.get("timing_s/score", 0.0) - m.get("timing_s/advantage", 0.0), u0)
            clock = max(clock or 0.0, row["update"][1])
        else:  # one phase after the other, from the previous iteration's end
            recorded = False
            t = clock if clock is not None else 0.0
            r0, r1 = t, t + m["timing_s/rollout"]
            u0 = r1 + m.get("timing_s/score", 0.0) + m.get("timing_s/advantage", 0.0)
            u1 = u0 + m["timing_s/update"]
            row = {"rollout": (r0, r1), "forwards": (r1, u0), "update": (u0, u1)}
            clock = u1 + m.get("timing_s/sync", 0.0) + m.get("timing_s/validation", 0.0)
        out.append(row)
    t0 = min(a for r in out for a, _ in r.values())
    return [{p: (a - t0, b - t0) for p, (a, b) in r.items()} for r in out], recorded


def overlap(its: list[dict[str, tuple[float, float]]]) -> float:
    """Seconds during which a generation ran beside the trainer's work (forwards or update)."""
    gens = [it["rollout"] for it in its]
    work = [it[p] for it in its for p in ("forwards", "update")]
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in gens for c, d in work)


def draw(rows: dict[str, tuple[list[dict[str, tuple[float, float]]], bool]], out: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(11, 0.9 * len(rows) + 1.2))
    colours = {"rollout": "tab:blue", "forwards": "tab:green", "update": "tab:orange"}
    labels = []
    for y, (name, (its, recorded)) in enumerate(reversed(rows.items())):
        for phase, dy in (("forwards", 0.0), ("update", 0.0), ("rollout", 0.4)):
            for k, it in enumerate(its):
                a, b = it[phase]
                ax.barh(
                    y + dy,
                    b - a,
                    left=a,
                    height=0.35,
                    color=colours[phase],
                    edgecolor="black",
                    linewidth=0.4,
                    hatch=None if recorded else "//",
                )
                ax.text(a + (b - a) / 2, y + dy, str(k), ha="center", va="center", fontsize=7)
        labels.append((y + 0.2, name + ("" if recorded else " (laid out)")))
    ax.set_yticks([p for p, _ in labels], [n for _, n in labels])
    ax.set_xlabel("seconds from the first iteration's start")
    ax.legend(
        handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()],
        labels=["generation (rollout)", "trainer: scores, old/ref log-probs, values", "trainer: update"],
        loc="upper right",
        fontsize=8,
    )
    ax.set_title("RL iterations: generation (upper bar) and the trainer's work (lower) per iteration")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("copies", nargs="+", type=Path, help="workspaces where the train stage ran")
    ap.add_argument("--run", default="grpo-s0", help="the run's directory under runs/")
    ap.add_argument("--out", required=True, type=Path, help="the PNG to write")
    args = ap.parse_args()
    rows = {c.name: spans(c / "runs" / args.run) for c in args.copies}
    draw(rows, args.out)
    for name, (its, recorded) in rows.items():
        gen = sum(b - a for it in its for a, b in [it["rollout"]])
        work = sum(b - a for it in its for p in ("forwards", "update") for a, b in [it[p]])
        span = max(b for it in its for _, b in it.values())
        print(
            f"{name}: {len(its)} iterations in {span:.1f} s; generation {gen:.1f} s, trainer {work:.1f} s, "
            f"side by side {overlap(its):.1f} s{'' if recorded else ' (laid out from durations)'}"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
