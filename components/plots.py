"""Line charts as PNG files (learning curves, comparisons), drawn with matplotlib's Agg backend.

:func:`line_chart`: one line per series. :func:`band_chart`: panels of mean lines over min..max bands
(several seeds of one algorithm). matplotlib is imported by the first chart drawn (:func:`_pyplot`), not
with this module: a stage draws its charts at its end and should not pay for them at its start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.io import write_atomic


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
    plt = _pyplot()
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


@dataclass(frozen=True)
class Band:
    """One series of a band chart: ``mean`` drawn as a line, ``low``..``high`` as a shaded band."""

    x: Sequence[float]
    mean: Sequence[float]
    low: Sequence[float]
    high: Sequence[float]

    def __post_init__(self) -> None:
        n = len(self.x)
        for name in ("mean", "low", "high"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Band: {name} has {len(getattr(self, name))} values but x has {n}")


@dataclass(frozen=True)
class Panel:
    """One subplot: bands by series name, and labelled single points (label -> (x, y))."""

    title: str
    xlabel: str
    ylabel: str
    bands: Mapping[str, Band]
    points: Mapping[str, tuple[float, float]] = field(default_factory=dict)


def band_chart(panels: Sequence[Panel], path: str | Path, *, title: str) -> Path:
    """Panels side by side; in each, every series is a mean line over a min..max band, and each point a
    black marker. A series keeps its colour across panels. Atomic write."""
    if not panels:
        raise ValueError("band_chart: no panels")
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.4), dpi=110, squeeze=False)
    names = list(dict.fromkeys(n for p in panels for n in p.bands))
    colours = {n: f"C{i % 10}" for i, n in enumerate(names)}
    for ax, panel in zip(axes[0], panels):
        for name, band in panel.bands.items():
            c = colours[name]
            ax.plot(
                list(band.x),
                list(band.mean),
                color=c,
                marker="o" if len(band.x) < 30 else None,
                markersize=3,
                label=name,
            )
            ax.fill_between(list(band.x), list(band.low), list(band.high), color=c, alpha=0.2, linewidth=0)
        for i, (label, (px, py)) in enumerate(panel.points.items()):
            ax.plot(
                [px],
                [py],
                linestyle="none",
                marker="*^sD"[i % 4],
                markersize=11,
                color="black",
                label=label,
                zorder=5,
            )
        ax.set(title=panel.title, xlabel=panel.xlabel, ylabel=panel.ylabel)
        ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if panel.bands or panel.points:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    try:
        return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png"))
    finally:
        plt.close(fig)


def small_multiples(
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]],
    path: str | Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    columns: int = 3,
    baseline: tuple[str, float] | None = None,
) -> Path:
    """A grid of line charts with shared axes, one per panel title -> {series name -> (x, y)}, so runs
    of several settings sit side by side; an optional horizontal baseline in every panel. Atomic write."""
    n = max(len(panels), 1)
    cols = min(columns, n)
    rows = -(-n // cols)
    plt = _pyplot()
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.2 * cols, 3.2 * rows), dpi=110, sharex=True, sharey=True, squeeze=False
    )
    for ax, (name, series) in zip(axes.flat, panels.items()):
        for label, (x, y) in series.items():
            ax.plot(list(x), list(y), marker="o" if len(x) < 30 else None, markersize=3, label=label)
        if baseline is not None:
            ax.axhline(baseline[1], color="grey", linestyle="--", label=baseline[0])
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel(xlabel)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    fig.suptitle(title)
    fig.tight_layout()
    try:
        return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png"))
    finally:
        plt.close(fig)
