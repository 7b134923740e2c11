"""Line charts as PNG files (learning curves, comparisons), drawn with matplotlib's Agg backend."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from components.io import write_atomic  # noqa: E402


def line_chart(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: str | Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    baseline: tuple[str, float] | None = None,
) -> Path:
    """One line per series name -> (x, y); an optional horizontal baseline (label, y). Atomic write."""
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for name, (x, y) in series.items():
        ax.plot(list(x), list(y), marker="o" if len(x) < 30 else None, markersize=3, label=name)
    if baseline is not None:
        ax.axhline(baseline[1], color="grey", linestyle="--", label=baseline[0])
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    if series or baseline:
        ax.legend()
    fig.tight_layout()
    try:
        return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png"))
    finally:
        plt.close(fig)
