"""Statistics of the algorithm comparison: per-problem results, bootstrap intervals, curve bands.

An evaluated model is summarised per test problem (:func:`problem_results`): whether its greedy
episode is correct (0/1) and the fraction of its sampled episodes that are correct. An algorithm
trained with several RL seeds is then a ``(seeds, problems)`` score matrix (:func:`score_matrix`),
with the columns in one fixed problem order for every model.

Interval estimates (:func:`mean_interval`, :func:`difference_interval`) are percentile bootstrap
intervals from ``scipy.stats.bootstrap`` over test problems: a resample draws as many problems as
there are, with replacement, and each drawn problem carries its scores from every seed (and, for a
difference, the other model's scores on the same problem: the difference is paired on problems). The
seeds are not resampled: with a handful of seeds a seed bootstrap says little, so the intervals give
the uncertainty from the finite test set for these seeds, and the per-seed values show the spread
between seeds. Every estimate is the mean over seeds and problems (a difference is of those means).

Pure: no Prefect, no MLflow, no file access.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy import stats as _scipy_stats

from components.agent.loop import episode_correctness

__all__ = [
    "RESAMPLED",
    "Estimate",
    "curve_band",
    "difference_interval",
    "mean_interval",
    "problem_results",
    "score_matrix",
]

# What the intervals resample, in words (for reports).
RESAMPLED = (
    "test problems (a resample draws as many problems as there are, with replacement; each drawn problem "
    "carries its results from every seed, and for a difference also the other model's results on the "
    "same problem); seeds are not resampled"
)


@dataclass(frozen=True)
class Estimate:
    """A point estimate and its confidence interval [low, high]."""

    value: float
    low: float
    high: float
    confidence: float = 0.95

    @property
    def excludes_zero(self) -> bool:
        """The interval lies entirely above or below 0 (a significant difference at its level)."""
        return self.low > 0 or self.high < 0

    def format(self, signed: bool = False, digits: int = 3) -> str:
        """``value [low, high]`` (``+``/``-`` before the value when signed); a value that rounds to 0
        is shown as 0, never as -0."""
        v, lo, hi = (round(x, digits) + 0.0 for x in (self.value, self.low, self.high))
        return f"{v:{'+' if signed else ''}.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


# --- per-problem results --------------------------------------------------------------------------


def problem_results(
    ids: Sequence[str], greedy: Sequence[Mapping], sampled: Sequence[Mapping] = ()
) -> pl.DataFrame:
    """One row per problem of ``ids`` (in that order): ``correct`` (its greedy episode, 0/1),
    ``sampled_correct`` (fraction of its sampled episodes that are correct; null without any) and
    ``n_sampled``.

    ``greedy`` and ``sampled`` are agent step records; an episode is its ``traj_id``, its problem the
    ``group_id``, and it is correct when any of its steps is. Every problem needs exactly one greedy
    episode; an episode of a problem not in ``ids`` is an error."""
    ids = [str(i) for i in ids]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"problem ids must be unique; repeated: {dup[:5]}")
    known = set(ids)
    g, s = episode_correctness(greedy), episode_correctness(sampled)
    for what, found in (("greedy", g), ("sampled", s)):
        unknown = sorted(set(found) - known)
        if unknown:
            raise ValueError(f"{what} episodes of problems not evaluated: {unknown[:5]}")
    missing = [i for i in ids if i not in g]
    if missing:
        raise ValueError(f"{len(missing)} problem(s) have no greedy episode: {missing[:5]}")
    several = [i for i in ids if len(g[i]) != 1]
    if several:
        raise ValueError(f"problem {several[0]!r} has {len(g[several[0]])} greedy episodes, expected 1")
    rows = []
    for i in ids:
        eps = list(s.get(i, {}).values())
        rows.append(
            {
                "id": i,
                "correct": int(next(iter(g[i].values()))),
                "sampled_correct": (sum(eps) / len(eps)) if eps else None,
                "n_sampled": len(eps),
            }
        )
    return pl.DataFrame(
        rows,
        schema={"id": pl.String, "correct": pl.Int64, "sampled_correct": pl.Float64, "n_sampled": pl.Int64},
    )


def score_matrix(tables: Mapping[str, pl.DataFrame], column: str, ids: Sequence[str]) -> np.ndarray:
    """``(len(tables), len(ids))`` matrix of ``column``: row r is table r (name -> per-problem table
    with an ``id`` column), columns in the order of ``ids``. Every table must hold exactly the
    problems of ``ids`` with a non-null value; the error names the table, the column and the ids."""
    if not tables:
        raise ValueError("score_matrix: no tables")
    ids = [str(i) for i in ids]
    want = set(ids)
    rows = []
    for name, df in tables.items():
        for c in ("id", column):
            if c not in df.columns:
                raise ValueError(f"{name}: no column {c!r} (columns: {df.columns})")
        got = [str(i) for i in df["id"].to_list()]
        missing, extra = [i for i in ids if i not in set(got)], sorted(set(got) - want)
        if missing or extra or len(got) != len(ids):
            raise ValueError(
                f"{name}: its problems differ from the reference's ({len(ids)} problems): "
                f"missing {missing[:5]}, extra {extra[:5]}, {len(got)} rows"
            )
        values = dict(zip(got, df[column].to_list()))
        nulls = [i for i in ids if values[i] is None]
        if nulls:
            raise ValueError(
                f"{name}: column {column!r} is null for {len(nulls)} problem(s), e.g. {nulls[:5]}"
            )
        rows.append([float(values[i]) for i in ids])
    return np.asarray(rows, dtype=float)


# --- bootstrap intervals --------------------------------------------------------------------------


def _as_matrix(scores: np.ndarray | Sequence, what: str) -> np.ndarray:
    """Scores as a (seeds, problems) float matrix (a 1-D vector is one seed); clear errors otherwise."""
    try:
        a = np.asarray(scores, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: scores must be numbers, a (seeds, problems) matrix") from None
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2:
        raise ValueError(f"{what}: scores must be a (seeds, problems) matrix, got shape {a.shape}")
    if a.shape[0] < 1 or a.shape[1] < 2:
        raise ValueError(
            f"{what}: need at least 1 seed and 2 problems, got {a.shape[0]} seed(s) x {a.shape[1]} problem(s)"
        )
    if not np.isfinite(a).all():
        seed, problem = map(int, np.argwhere(~np.isfinite(a))[0])
        raise ValueError(
            f"{what}: scores must be finite; seed row {seed}, problem {problem} is {a[seed, problem]}"
        )
    return a


def _bootstrap_mean(per_problem: np.ndarray, confidence: float, n_resamples: int, seed: int) -> Estimate:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_resamples < 100:
        raise ValueError(f"n_resamples must be >= 100, got {n_resamples}")
    value = float(per_problem.mean())
    if np.all(per_problem == per_problem[0]):  # every resample has this mean (scipy would warn, NaN)
        return Estimate(value, value, value, confidence)
    res = _scipy_stats.bootstrap(
        (per_problem,),
        np.mean,
        n_resamples=n_resamples,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        batch=1000,
        rng=np.random.default_rng(seed),
    )
    ci = res.confidence_interval
    return Estimate(value, float(ci.low), float(ci.high), confidence)


def mean_interval(
    scores: np.ndarray | Sequence,
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
    what: str = "scores",
) -> Estimate:
    """Mean of a (seeds, problems) score matrix (or one seed's vector) with its bootstrap interval
    over problems (each resampled problem keeps all its seeds)."""
    a = _as_matrix(scores, what)
    return _bootstrap_mean(a.mean(axis=0), confidence, n_resamples, seed)


def difference_interval(
    scores: np.ndarray | Sequence,
    baseline: np.ndarray | Sequence,
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
    what: tuple[str, str] = ("scores", "baseline"),
) -> Estimate:
    """Mean of ``scores`` minus mean of ``baseline`` (each a (seeds, problems) matrix or a vector,
    their seeds may differ in number), paired on problems: the bootstrap resamples problems and each
    problem contributes its mean over ``scores``' seeds minus its mean over ``baseline``'s."""
    a, b = _as_matrix(scores, what[0]), _as_matrix(baseline, what[1])
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"{what[0]} has {a.shape[1]} problems but {what[1]} has {b.shape[1]}: a paired "
            "difference needs the same problems in the same order"
        )
    return _bootstrap_mean(a.mean(axis=0) - b.mean(axis=0), confidence, n_resamples, seed)


# --- learning curves ------------------------------------------------------------------------------


def curve_band(curves: Mapping[str, pl.DataFrame], x: str, y: str) -> pl.DataFrame:
    """Mean, min and max of ``y`` over several runs' curves (name -> table with columns ``x``, ``y``),
    at every ``x`` where every run has a non-null ``y``. Columns: x, mean, low, high, sorted by x."""
    if not curves:
        raise ValueError("curve_band: no curves")
    parts = []
    for name, df in curves.items():
        for c in (x, y):
            if c not in df.columns:
                raise ValueError(f"{name}: no column {c!r} (columns: {df.columns})")
        d = df.select(pl.col(x), pl.col(y).cast(pl.Float64)).drop_nulls()
        if d[x].is_duplicated().any():
            raise ValueError(f"{name}: {x} {d.filter(pl.col(x).is_duplicated())[x][0]} appears twice")
        parts.append(d.with_columns(pl.lit(name).alias("_run")))
    n = len(curves)
    return (
        pl.concat(parts)
        .group_by(x)
        .agg(
            pl.col(y).mean().alias("mean"),
            pl.col(y).min().alias("low"),
            pl.col(y).max().alias("high"),
            pl.len().alias("_n"),
        )
        .filter(pl.col("_n") == n)
        .drop("_n")
        .sort(x)
    )
