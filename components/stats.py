"""Statistics of the algorithm comparison: per-problem results, bootstrap intervals, curve bands.

An evaluated model is summarised per test problem (:func:`problem_results`): whether its greedy
episode is correct (0/1) and the fraction of its sampled episodes that are correct. An algorithm
trained with several RL seeds is then a ``(seeds, problems)`` score matrix (:func:`score_matrix`),
with the columns in one fixed problem order for every model.

Interval estimates (:func:`mean_interval`, :func:`difference_interval`) are percentile bootstrap
intervals from ``scipy.stats.bootstrap`` over seeds and test problems, crossed: a resample draws as
many seeds as there are and, independently, as many problems as there are, each with replacement, and
its estimate is the mean of the score matrix over the drawn seeds x the drawn problems. So the
interval carries both sources of uncertainty: which RL seeds were run, and which problems are in the
finite test set. A difference of two models is paired on problems (one draw of problems serves both)
with each model's seeds drawn on their own. A model with a single seed contributes no seed
uncertainty (there is nothing to resample), and with two or three seeds the seed part of a bootstrap
is coarse: the per-seed values belong next to the intervals. Every estimate is the mean over seeds and
problems (a difference is of those means).

:func:`between_problem_share` reads one model's per-problem success fractions under a protocol with
several episodes per problem: how much of an episode's success the problem decides, which bounds what
a critic can explain from the problem alone. :func:`explained_variance_interval` is a critic's
explained variance on one batch with its bootstrap interval over the batch's trajectories: on the 128
episodes of an iteration the figure moves by several hundredths from batch to batch.

Pure: no Prefect, no MLflow, no file access.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from components.agent.loop import episode_correctness
from components.tasks.step_records import episode_loops

__all__ = [
    "RESAMPLED",
    "Estimate",
    "between_problem_share",
    "curve_band",
    "difference_interval",
    "explained_variance_interval",
    "mean_interval",
    "problem_results",
    "score_matrix",
]

# What the intervals resample, in words (for reports).
RESAMPLED = (
    "RL seeds and test problems, crossed (a resample draws as many seeds and, independently, as many "
    "problems as there are, with replacement, and averages the drawn seeds' results on the drawn problems; "
    "a difference uses one draw of problems for both models, paired, and draws each model's seeds on its "
    "own; a model with one seed, such as SFT, has no seed uncertainty)"
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
    ids: Sequence[str],
    greedy: Sequence[Mapping],
    sampled: Sequence[Mapping] = (),
    protocols: Mapping[str, Sequence[Mapping]] | None = None,
) -> pl.DataFrame:
    """One row per problem of ``ids`` (in that order): ``correct`` (its greedy episode, 0/1),
    ``sampled_correct`` (fraction of its ``sampled`` episodes that are correct; null without any),
    ``n_sampled``, and of the greedy episode its ``return`` (the sum of its step rewards) and ``turns``
    (its steps). Per other protocol ``p`` of ``protocols`` (name -> its episodes' step records; a
    sampled one, or one played with the no-op escape such as ``greedy_escape``):
    ``<p>_correct`` (fraction of the problem's episodes that are correct) and ``<p>_n`` (their number).
    Where the greedy episodes carry state keys (components.tasks.step_records): ``loop_rate`` of the
    greedy episode and ``<p>_loop_rate``, the mean over the problem's episodes of protocol ``p``.

    ``greedy`` and the sampled records are agent step records; an episode is its ``traj_id``, its
    problem the ``group_id``, and it is correct when any of its steps is. Every problem needs exactly
    one greedy episode, and at least one episode of each protocol; an episode of a problem not in
    ``ids`` is an error."""
    ids = [str(i) for i in ids]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"problem ids must be unique; repeated: {dup[:5]}")
    protocols = dict(protocols or {})
    if "greedy" in protocols:
        raise ValueError(
            "protocols: 'greedy' is the greedy episodes' (the argument greedy), not a sampled protocol"
        )
    known = set(ids)
    g, s = episode_correctness(greedy), episode_correctness(sampled)
    per = {name: episode_correctness(records) for name, records in protocols.items()}
    for what, found in (("greedy", g), ("sampled", s), *per.items()):
        unknown = sorted(set(found) - known)
        if unknown:
            raise ValueError(f"{what} episodes of problems not evaluated: {unknown[:5]}")
    missing = [i for i in ids if i not in g]
    if missing:
        raise ValueError(f"{len(missing)} problem(s) have no greedy episode: {missing[:5]}")
    several = [i for i in ids if len(g[i]) != 1]
    if several:
        raise ValueError(f"problem {several[0]!r} has {len(g[several[0]])} greedy episodes, expected 1")
    for name, found in per.items():
        lacking = [i for i in ids if i not in found]
        if lacking:
            raise ValueError(f"protocol {name}: {len(lacking)} problem(s) have no episode: {lacking[:5]}")
    returns: dict[str, float] = defaultdict(float)
    turns: dict[str, int] = defaultdict(int)
    for step in greedy:
        returns[str(step["group_id"])] += float(step.get("reward", 0.0))
        turns[str(step["group_id"])] += 1
    schema = {
        "id": pl.String,
        "correct": pl.Int64,
        "sampled_correct": pl.Float64,
        "n_sampled": pl.Int64,
        "return": pl.Float64,
        "turns": pl.Int64,
    }
    rows = []
    for i in ids:
        eps = list(s.get(i, {}).values())
        row = {
            "id": i,
            "correct": int(next(iter(g[i].values()))),
            "sampled_correct": (sum(eps) / len(eps)) if eps else None,
            "n_sampled": len(eps),
            "return": returns[i],
            "turns": turns[i],
        }
        for name, found in per.items():
            row[f"{name}_correct"] = sum(found[i].values()) / len(found[i])
            row[f"{name}_n"] = len(found[i])
        rows.append(row)
    for name in per:
        schema |= {f"{name}_correct": pl.Float64, f"{name}_n": pl.Int64}
    loops = {"loop_rate": greedy, **{f"{name}_loop_rate": records for name, records in protocols.items()}}
    if any(step.get("obs_key") for step in greedy):  # the environment gives state keys
        for column, records in loops.items():
            rates = _problem_loop_rates(records)
            for row in rows:
                row[column] = rates.get(row["id"])
            schema[column] = pl.Float64
    return pl.DataFrame(rows, schema=schema)


def _problem_loop_rates(steps: Sequence[Mapping]) -> dict[str, float]:
    """problem id (group_id) -> mean ``loop_rate`` of its episodes in ``steps`` that carry state keys."""
    problem = {str(s["traj_id"]): str(s["group_id"]) for s in steps}
    by_problem: dict[str, list[float]] = defaultdict(list)
    for traj_id, loop in episode_loops(steps).items():
        by_problem[problem[traj_id]].append(loop["loop_rate"])
    return {i: sum(v) / len(v) for i, v in by_problem.items()}


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


def _check(confidence: float, n_resamples: int) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_resamples < 100:
        raise ValueError(f"n_resamples must be >= 100, got {n_resamples}")


def _crossed_bootstrap(
    models: Sequence[np.ndarray], signs: Sequence[float], confidence: float, n_resamples: int, seed: int
) -> Estimate:
    """sum_m sign_m * mean(models[m]) with a percentile interval from resampling every model's seeds
    (rows, independently per model) and the shared problems (columns, one draw for all models)."""
    from scipy import stats as _scipy_stats  # only the intervals need it (compare), not problem_results

    _check(confidence, n_resamples)
    n_problems = models[0].shape[1]
    value = float(sum(sign * m.mean() for m, sign in zip(models, signs)))
    resampled = [i for i, m in enumerate(models) if m.shape[0] > 1]  # models with seeds to draw

    def per_problem(seed_draws: Sequence[np.ndarray]) -> np.ndarray:
        """(batch, problems) signed sum of the models' means over their drawn seeds."""
        draws = dict(zip(resampled, seed_draws))
        total = 0.0
        for i, (m, sign) in enumerate(zip(models, signs)):
            rows = m[draws[i]].mean(axis=-2) if i in draws else m.mean(axis=0)[None, :]
            total = total + sign * rows
        return np.atleast_2d(total)

    def statistic(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        *seed_draws, problems = (np.atleast_2d(x) for x in samples)
        table = np.broadcast_to(per_problem(seed_draws), (problems.shape[0], n_problems))
        return np.take_along_axis(table, problems, axis=1).mean(axis=1)

    samples = [np.arange(models[i].shape[0]) for i in resampled] + [np.arange(n_problems)]
    with warnings.catch_warnings():  # all resamples equal: scipy warns and gives NaN, handled below
        warnings.simplefilter("ignore", _scipy_stats.DegenerateDataWarning)
        res = _scipy_stats.bootstrap(
            samples,
            statistic,
            n_resamples=n_resamples,
            confidence_level=confidence,
            method="percentile",
            paired=False,
            vectorized=True,
            batch=500,
            rng=np.random.default_rng(seed),
        )
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (np.isfinite(low) and np.isfinite(high)):  # no variation in any resample
        return Estimate(value, value, value, confidence)
    return Estimate(value, low, high, confidence)


def mean_interval(
    scores: np.ndarray | Sequence,
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
    what: str = "scores",
) -> Estimate:
    """Mean of a (seeds, problems) score matrix (or one seed's vector) with its bootstrap interval
    over seeds and problems, crossed (see the module docstring)."""
    return _crossed_bootstrap([_as_matrix(scores, what)], [1.0], confidence, n_resamples, seed)


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
    their seeds may differ in number) with its bootstrap interval: problems are drawn once for both
    (paired), each model's seeds on their own."""
    a, b = _as_matrix(scores, what[0]), _as_matrix(baseline, what[1])
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"{what[0]} has {a.shape[1]} problems but {what[1]} has {b.shape[1]}: a paired "
            "difference needs the same problems in the same order"
        )
    return _crossed_bootstrap([a, b], [1.0, -1.0], confidence, n_resamples, seed)


# --- what the problem decides ---------------------------------------------------------------------


def between_problem_share(fractions: np.ndarray | Sequence[float], k: int) -> float | None:
    """The share of one episode's success variance that lies between problems, from ``fractions``,
    the fraction of ``k`` episodes per problem that succeed (one protocol of one model).

    With p_i the problem's success probability and p-bar the overall rate, one episode's outcome has
    variance p-bar (1 - p-bar) = Var(p_i) + E[p_i (1 - p_i)]: between problems plus the coin of the
    episode itself. The observed fractions carry k-episode noise, E[p-hat (1 - p-hat)] = (k-1)/k
    E[p (1 - p)], so Var(p_i) is estimated without bias by Var(p-hat_i) - mean(p-hat_i (1 - p-hat_i)) /
    (k - 1) (variance over problems with ddof 1). The share is that over p-bar (1 - p-bar): what a value
    function that knew each problem's success rate would explain of a first turn's success, the ceiling
    of a critic's explained variance there from the problem alone. Not clipped: near 0 an estimate can
    fall below it by noise. None when k < 2 (the episode's coin cannot be told apart) or every episode
    has the same outcome."""
    f = np.asarray(fractions, dtype=float)
    if f.ndim != 1 or f.size < 2:
        raise ValueError(f"between_problem_share: need a vector of >= 2 problems, got shape {f.shape}")
    if not ((f >= 0) & (f <= 1)).all():
        raise ValueError("between_problem_share: fractions must lie in [0, 1]")
    if k < 2:
        return None
    mean = float(f.mean())
    total = mean * (1 - mean)
    if total == 0:
        return None
    between = float(f.var(ddof=1)) - float((f * (1 - f)).mean()) / (k - 1)
    return between / total


# Returns vary when Var(R) > RETURNS_VARY_RTOL * mean(R^2): float sums of equal returns leave Var(R) at
# rounding level, not exactly 0 (components.train.critic_fit.explained_variance uses the same rule).
RETURNS_VARY_RTOL = 1e-12


def explained_variance_interval(
    returns: Sequence[Sequence[float]],
    values: Sequence[Sequence[float]],
    *,
    confidence: float = 0.95,
    n_resamples: int = 1_000,
    seed: int = 0,
) -> Estimate:
    """A critic's explained variance 1 - Var(R - V) / Var(R) over every entry of every group (one
    group per trajectory: its tokens' or steps' returns R and values V), with a percentile bootstrap
    interval that resamples whole groups (a trajectory's entries share its outcome, so they are not
    independent draws). 0 with the interval [0, 0] when the returns do not vary; a resample whose
    returns do not vary counts 0 as well."""
    _check(confidence, n_resamples)
    if len(returns) != len(values):
        raise ValueError(
            f"explained_variance_interval: {len(returns)} return groups, {len(values)} value groups"
        )
    for i, (r, v) in enumerate(zip(returns, values)):
        if len(r) != len(v):
            raise ValueError(
                f"explained_variance_interval: group {i} has {len(r)} returns and {len(v)} values"
            )
    # per group: entries, sum and sum of squares of R and of the residual R - V
    stats = np.array(
        [
            [len(r), r.sum(), (r * r).sum(), (r - v).sum(), ((r - v) ** 2).sum()]
            for r, v in ((np.asarray(r, float), np.asarray(v, float)) for r, v in zip(returns, values))
        ]
    ).reshape(-1, 5)

    if stats[:, 0].sum() < 2:
        return Estimate(0.0, 0.0, 0.0, confidence)

    def ev(totals: np.ndarray) -> np.ndarray:
        """Explained variance of (resamples, 5) summed statistics; 0 where the returns do not vary."""
        n, sr, srr, se, see = np.atleast_2d(totals).T
        with np.errstate(divide="ignore", invalid="ignore"):
            var_r = (srr - sr * sr / n) / (n - 1)
            var_e = (see - se * se / n) / (n - 1)
            # float sums of equal returns leave var_r at rounding level, not exactly 0
            varies = (n > 1) & (var_r > RETURNS_VARY_RTOL * srr / n)
            return np.where(varies, 1.0 - var_e / np.where(varies, var_r, 1.0), 0.0)

    value = float(ev(stats.sum(axis=0))[0])
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(len(stats), np.full(len(stats), 1 / len(stats)), size=n_resamples)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(ev(counts @ stats), [tail, 100 - tail])
    return Estimate(value, float(low), float(high), confidence)


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
