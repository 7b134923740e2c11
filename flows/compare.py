"""Stage `compare`: every algorithm (over its RL seeds) against the SFT baseline, with uncertainty.

reports/compare.md leads with the protocol ``compare.headline`` (greedy, or sampled at a temperature of
``evaluate.temperatures``; docs/evaluation.md) and shows every protocol the evaluation ran, each named:
per algorithm the mean test accuracy over its seeds under each protocol with a 95% bootstrap interval,
its difference to SFT with a 95% interval (paired on test problems), pass@k of each sampled protocol,
mean turns, tool use (tasks with tools), format errors, train wall time and generated tokens (means
over seeds); for tasks whose environment gives state keys (sokoban, babyai), the loop rate under each
protocol with intervals and differences to SFT; the greedy episode's return and turns with intervals
and differences to SFT; then every run's own values (one row per seed), the pairwise differences
between algorithms (accuracy under each protocol, return, turns), and one sentence per algorithm
saying which differences are significant (their interval excludes 0), each naming its protocol. The
statistics are in components/stats.py (percentile bootstrap over RL seeds and test problems, crossed;
scipy).

The compare MLflow run also holds every estimate of the report as metrics (``compare/<model>/<protocol>/
accuracy`` and ``loop_rate``, with their intervals; :func:`interval_metrics`).

reports/compare.png: (a) validation accuracy against RL iteration under the headline protocol where
validation sampled it (else greedy; :func:`val_column`), per algorithm the mean over seeds
with a min..max band, and the SFT model at iteration -1 (the same val rows, before any update);
(b) training reward (critic/score/mean) against iteration, mean and min..max band.
Both are logged to MLflow (run `compare`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from itertools import combinations
from pathlib import Path

import numpy as np
import polars as pl
from prefect import flow, task

from components.config import Params, is_sampled, protocol_label
from components.io import write_text
from components.plots import Band, Panel, band_chart
from components.schemas import ProblemSchema, validate_table
from components.stats import (
    RESAMPLED,
    Estimate,
    between_problem_share,
    curve_band,
    difference_interval,
    mean_interval,
    score_matrix,
)
from components.train.collapse import read_trend, trend
from flows import REPO
from flows._stage import StageError, mlflow_run, read_params, stage_main

CONFIDENCE = 0.95
RESAMPLES = 10_000
# Columns of eval json files shown when present (written by newer evaluate stages): key -> header.
# Per-problem values of the greedy episode compared like accuracy (kind -> ProblemSchema column).
EPISODE_KINDS = {"return": "return", "turns": "turns"}
OPTIONAL_EVAL = {
    "tool_calls_per_step": "tool calls per step",
    "answer_without_tool_rate": "answer without tool",
}


# Per-tool metrics of tasks with several tools (search_calc's episode_metrics: "<tool>/<metric>"),
# shown when an eval json has them: metric -> header suffix.
PER_TOOL = {"calls_per_episode": "calls per episode", "valid_rate": "valid", "right_tool_rate": "right tool"}


def per_tool_keys(evals: list[dict]) -> list[str]:
    """The ``<tool>/<metric>`` keys of PER_TOOL found in any eval json, by tool then metric, and the
    overall ``right_tool_rate`` after them when present."""
    keys = {k for e in evals for k in e if k.count("/") == 1 and k.split("/")[1] in PER_TOOL}
    order = list(PER_TOOL)
    out = sorted(keys, key=lambda k: (k.split("/")[0], order.index(k.split("/")[1])))
    return out + (["right_tool_rate"] if any("right_tool_rate" in e for e in evals) else [])


def per_tool_header(key: str) -> str:
    if "/" not in key:
        return key.replace("_", " ")
    tool, metric = key.split("/")
    return f"{tool} {PER_TOOL[metric]}"


def _load(name: str) -> dict:
    path = REPO / "metrics" / name
    if not path.is_file():
        raise StageError(f"compare: {path} is missing (run the stage that writes it first)")
    return json.loads(path.read_text())


def _problems(name: str) -> pl.DataFrame:
    path = REPO / "metrics" / f"problems_{name}.parquet"
    if not path.is_file():
        raise StageError(
            f"compare: {path} is missing (run the stage that evaluates {name} first: evaluate_sft or train)"
        )
    try:
        return validate_table(pl.read_parquet(path), ProblemSchema, str(path.relative_to(REPO)))
    except ValueError as err:
        raise StageError(str(err)) from None


def _curve(name: str) -> pl.DataFrame:
    path = REPO / "plots" / f"train_{name}.csv"
    if not path.is_file():
        raise StageError(f"compare: {path} is missing (run train of {name} first)")
    return pl.read_csv(path)


def _estimates(params: Params) -> dict:
    """Every number of the report: per-run metrics, and per algorithm the bootstrap estimates."""
    c = params.compare
    runs = {
        name: {
            "algo": a,
            "seed": s,
            "eval": _load(f"eval_{name}.json"),
            "train": _load(f"train_{name}.json"),
            "problems": _problems(name),
        }
        for a, s, name in c.runs()
    }
    sft_problems = _problems("sft")
    ids = sft_problems["id"].to_list()
    tables = [sft_problems, *(r["problems"] for r in runs.values())]
    protocols = headline_first(params)
    kinds = {p: accuracy_column(p) for p in protocols} | EPISODE_KINDS
    loops = all("loop_rate" in df.columns for df in tables)  # the task's environment gives state keys
    if loops:
        kinds |= {loop_kind(p): loop_column(p) for p in protocols}
    kw = dict(confidence=CONFIDENCE, n_resamples=RESAMPLES, seed=0)

    def matrix(names: list[str], column: str) -> np.ndarray:
        tables = {
            f"metrics/problems_{n}.parquet": (sft_problems if n == "sft" else runs[n]["problems"])
            for n in names
        }
        try:
            return score_matrix(tables, column, ids)
        except ValueError as err:
            raise StageError(f"compare: {err} (metrics/problems_sft.parquet is the reference)") from None

    scores = {kind: {"sft": matrix(["sft"], col)} for kind, col in kinds.items()}
    for kind, col in kinds.items():
        for a in c.algorithms:
            scores[kind][a] = matrix([c.run_name(a, s) for s in c.seeds], col)
    est: dict = {"mean": {}, "vs_sft": {}, "pair": {}}
    for kind, by_model in scores.items():
        for model, m in by_model.items():
            est["mean"][kind, model] = mean_interval(m, what=model, **kw)
            if model != "sft":
                est["vs_sft"][kind, model] = difference_interval(
                    m, by_model["sft"], what=(model, "sft"), **kw
                )
        for a, b in combinations(c.algorithms, 2):
            est["pair"][kind, a, b] = difference_interval(by_model[a], by_model[b], what=(a, b), **kw)
    return {
        "runs": runs,
        "sft": _load("eval_sft.json"),
        "sft_problems": sft_problems,
        "kinds": protocols,
        "loops": loops,
        "n_problems": len(ids),
        **est,
    }


def headline_first(params: Params) -> list[str]:
    """The evaluated protocols, ``compare.headline`` first, then the others in evaluation order."""
    head = params.compare.headline
    return [head, *(p for p in params.evaluate.protocols if p != head)]


def accuracy_column(protocol: str) -> str:
    """The per-problem column (ProblemSchema / components.stats.problem_results) of a protocol's accuracy."""
    return "correct" if protocol == "greedy" else f"{protocol}_correct"


def loop_kind(protocol: str) -> str:
    return f"loop:{protocol}"


def loop_column(protocol: str) -> str:
    """The per-problem column of a protocol's loop rate."""
    return "loop_rate" if protocol == "greedy" else f"{protocol}_loop_rate"


def _label(params: Params, protocol: str) -> str:
    return protocol_label(protocol, params.evaluate.samples if is_sampled(protocol) else None)


def _protocol_value(e: dict, protocol: str, key: str) -> float | None:
    """``key`` of a protocol's block of an eval json (None when the file has no such block)."""
    block = e.get(protocol)
    return block.get(key) if isinstance(block, dict) else None


def _pair(est: dict, kind: str, a: str, b: str) -> Estimate:
    """a minus b (the stored estimate or its mirror: the same resamples, negated)."""
    if (kind, a, b) in est["pair"]:
        return est["pair"][kind, a, b]
    e = est["pair"][kind, b, a]
    return Estimate(-e.value, -e.high, -e.low, e.confidence)


def significance(e: Estimate) -> str:
    """A difference in words: significantly higher/lower when its interval excludes 0."""
    if e.excludes_zero:
        return f"significantly {'higher' if e.value > 0 else 'lower'} ({e.format(signed=True)}, interval excludes 0)"
    return f"no significant difference ({e.format(signed=True)}, interval includes 0)"


def _sentence(params: Params, est: dict, algo: str) -> str:
    label = {p: _label(params, p) for p in est["kinds"]}
    parts = [
        f"{label[kind]}: accuracy {est['mean'][kind, algo].value:.3f}, against SFT "
        f"{significance(est['vs_sft'][kind, algo])}"
        for kind in est["kinds"]
    ]
    if est["loops"]:
        parts += [
            f"{label[kind]}: loop rate {est['mean'][loop_kind(kind), algo].value:.3f}, against SFT "
            f"{significance(est['vs_sft'][loop_kind(kind), algo])}"
            for kind in est["kinds"]
        ]
    parts.append(
        f"greedy: return {est['mean']['return', algo].value:.3f}, against SFT "
        f"{significance(est['vs_sft']['return', algo])}"
    )
    for other in (o for o in params.compare.algorithms if o != algo):
        parts.append(
            f"against {other}: "
            + ", ".join(
                f"{label[kind]} {significance(_pair(est, kind, algo, other))}" for kind in est["kinds"]
            )
        )
    n = len(params.compare.seeds)
    return f"- **{algo}** ({n} seed{'s' if n > 1 else ''}): " + "; ".join(parts) + "."


def _fmt(v, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _optional_keys(evals: list[dict]) -> tuple[bool, list[str]]:
    """Whether the task uses tools (a task without, e.g. sokoban, shows no tool columns: they would be 0
    or meaningless), and the optional eval keys to show."""
    tools = any(e.get("tool_calls_per_episode", 1.0) > 0 for e in evals)
    optional = [k for k in OPTIONAL_EVAL if tools and any(k in e for e in evals)]
    return tools, optional + (per_tool_keys(evals) if tools else [])


class _Columns:
    """The per-model metric columns after the accuracy columns (pass@k of each sampled protocol, then
    the greedy episode's turns, tool use and format errors, and train time)."""

    def __init__(self, params: Params, est: dict) -> None:
        evals = [est["sft"], *(r["eval"] for r in est["runs"].values())]
        self.sampled = [p for p in est["kinds"] if is_sampled(p)]
        self.tools, self.optional = _optional_keys(evals)
        self.headers = [
            *(f"pass@k ({_label(params, p)})" for p in self.sampled),
            "mean turns",
            *(["valid tool calls"] if self.tools else []),
            "format errors",
            *(OPTIONAL_EVAL.get(key) or per_tool_header(key) for key in self.optional),
            "train wall time (s)",
            "generated tokens",
        ]

    def cells(self, evals: list[dict], trains: list[dict]) -> list[str]:
        m = lambda key: _mean([e.get(key) for e in evals])  # noqa: E731
        t = lambda key: _mean([tr.get(key) for tr in trains])  # noqa: E731
        cells = [_fmt(_mean([_protocol_value(e, p, "pass_at_k") for e in evals])) for p in self.sampled]
        cells += [
            _fmt(m("mean_turns"), 2),
            *([_fmt(m("valid_tool_call_rate"))] if self.tools else []),
            _fmt(m("format_error_rate")),
        ]
        cells += [_fmt(m(key)) for key in self.optional]
        cells += [
            "-" if not trains else f"{t('train_wall_time_s'):.0f}",
            "-" if not trains else f"{t('generated_tokens'):.0f}",
        ]
        return cells


def _algorithm_table(params: Params, est: dict, cols: _Columns) -> list[str]:
    """1. per algorithm: accuracy under each protocol (the headline first), means over seeds with
    intervals, and the differences to SFT."""
    head = ["algorithm", "seeds"]
    for p in est["kinds"]:
        head += [f"accuracy ({_label(params, p)}) [95% CI]", f"{p} vs SFT [95% CI]"]
    head += cols.headers
    lines = [_row(head), _row(["---"] * len(head))]
    sft = ["sft", "-"]
    for p in est["kinds"]:
        sft += [est["mean"][p, "sft"].format(), "-"]
    lines.append(_row(sft + cols.cells([est["sft"]], [])))
    for a in params.compare.algorithms:
        mine = [r for r in est["runs"].values() if r["algo"] == a]
        cells = [a, ", ".join(str(r["seed"]) for r in mine)]
        for p in est["kinds"]:
            cells += [est["mean"][p, a].format(), est["vs_sft"][p, a].format(signed=True)]
        lines.append(_row(cells + cols.cells([r["eval"] for r in mine], [r["train"] for r in mine])))
    return lines


def _loop_table(params: Params, est: dict) -> list[str]:
    """1b. the loop rate under each protocol (tasks with state keys), with intervals and differences."""
    head = ["model"]
    for p in est["kinds"]:
        head += [f"loop rate ({_label(params, p)}) [95% CI]", f"{p} vs SFT [95% CI]"]
    lines = [_row(head), _row(["---"] * len(head))]
    sft = ["sft"]
    for p in est["kinds"]:
        sft += [est["mean"][loop_kind(p), "sft"].format(), "-"]
    lines.append(_row(sft))
    for a in params.compare.algorithms:
        cells = [a]
        for p in est["kinds"]:
            cells += [
                est["mean"][loop_kind(p), a].format(),
                est["vs_sft"][loop_kind(p), a].format(signed=True),
            ]
        lines.append(_row(cells))
    return lines


LOOP_TEXT = (
    "## Loops\n\n"
    "Per test problem, the share of an episode's turns that send again the reply whose move changed nothing "
    "(the state before the turn is the state before the previous turn, and the reply is the same), averaged "
    "over the problem's episodes of the protocol; intervals and differences as above (docs/evaluation.md).\n\n"
)


def _runs_table(params: Params, est: dict, cols: _Columns) -> list[str]:
    """2. every run's own values."""
    head = ["run", "algorithm", "RL seed", *(f"accuracy ({_label(params, p)})" for p in est["kinds"])]
    if est["loops"]:
        head += [f"loop rate ({_label(params, p)})" for p in est["kinds"]]
    head += cols.headers
    lines = [_row(head), _row(["---"] * len(head))]

    def values(e: dict) -> list[str]:
        out = [_fmt(_protocol_value(e, p, "accuracy")) for p in est["kinds"]]
        if est["loops"]:
            out += [_fmt(_protocol_value(e, p, "loop_rate")) for p in est["kinds"]]
        return out

    lines.append(_row(["sft", "-", "-", *values(est["sft"])] + cols.cells([est["sft"]], [])))
    for name, r in est["runs"].items():
        cells = [name, r["algo"], str(r["seed"]), *values(r["eval"])]
        lines.append(_row(cells + cols.cells([r["eval"]], [r["train"]])))
    return lines


def _episode_table(params: Params, est: dict) -> list[str]:
    """2b. return and turns of the greedy episode."""
    lines = [
        _row(
            ["model", "return [95% CI]", "return vs SFT [95% CI]", "turns [95% CI]", "turns vs SFT [95% CI]"]
        ),
        _row(["---"] * 5),
        _row(["sft", est["mean"]["return", "sft"].format(), "-", est["mean"]["turns", "sft"].format(), "-"]),
    ]
    for a in params.compare.algorithms:
        cells = [
            cell
            for kind in EPISODE_KINDS
            for cell in (est["mean"][kind, a].format(), est["vs_sft"][kind, a].format(signed=True))
        ]
        lines.append(_row([a, *cells]))
    return lines


def _pairs_table(params: Params, est: dict) -> list[str]:
    """3. algorithm against algorithm (empty for one algorithm)."""
    pairs = list(combinations(params.compare.algorithms, 2))
    if not pairs:
        return []
    head = ["difference", *(f"{_label(params, p)} [95% CI]" for p in est["kinds"])]
    head += ["return [95% CI]", "turns [95% CI]"]
    lines = [_row(head), _row(["---"] * len(head))]
    for a, b in pairs:
        lines.append(
            _row(
                [f"{a} - {b}"]
                + [_pair(est, kind, a, b).format(signed=True) for kind in [*est["kinds"], *EPISODE_KINDS]]
            )
        )
    return lines


def _series(curve: pl.DataFrame, column: str) -> list[float]:
    """A run's per-iteration values of ``column`` (iterations >= 0; none when the csv predates it)."""
    if column not in curve.columns:
        return []
    rows = curve.filter(pl.col("iteration") >= 0)
    return [float(v) for v in rows[column].cast(pl.Float64, strict=False).to_list() if v is not None]


def _diagnostics_table(params: Params) -> list[str]:
    """4. per run: the collapse signs RAGEN reads (first vs last quarter of the iterations) and the
    critic's explained variance at the first iteration, its lowest and the last (PPO/StepPO)."""
    head = ["run", "in-group reward std", "entropy", "distinct actions per state", "training success",
            "critic explained variance (first / lowest / last)", "reading"]  # fmt: skip
    lines = [_row(head), _row(["---"] * len(head))]
    for _, _, name in params.compare.runs():
        curve = _curve(name)
        series = {
            "group_reward_std": _series(curve, "group_reward_std"),
            "reward_std": _series(curve, "reward_std"),
            "entropy": _series(curve, "entropy"),
            "distinct_actions": _series(curve, "distinct_actions"),
            "success": _series(curve, "train_accuracy"),
        }
        spread = series["group_reward_std"] or series["reward_std"]
        ev = _series(curve, "vf_explained_var")
        first = f"{ev[0]:.3f}" if ev else ""
        band = [_series(curve, f"vf_explained_var_{side}") for side in ("low", "high")]
        if ev and all(len(b) == len(ev) for b in band):
            first += f" [{band[0][0]:.3f}, {band[1][0]:.3f}]"
        cells = [
            name,
            *(
                str(trend(v)) if trend(v) else "-"
                for v in (spread, series["entropy"], series["distinct_actions"], series["success"])
            ),
            f"{first} / {min(ev):.3f} / {ev[-1]:.3f}" if ev else "-",
            read_trend(series) if spread and series["entropy"] else "-",
        ]
        lines.append(_row(cells))
    return lines


def _run_share(problems: pl.DataFrame, protocol: str) -> float | None:
    """:func:`components.stats.between_problem_share` of one run's per-problem results under a sampled
    protocol (None when it played fewer than 2 episodes per problem, or not the same number for all)."""
    n = problems[f"{protocol}_n"].unique().to_list()
    if len(n) != 1:
        return None
    return between_problem_share(problems[accuracy_column(protocol)].to_numpy(), int(n[0]))


def _share_table(params: Params, est: dict) -> list[str]:
    """5. per model and sampled protocol of >= 2 episodes per problem, the share of an episode's
    success variance between problems (an algorithm: the mean over its seeds, the range after it).
    Empty when no protocol qualifies."""
    protocols = [p for p in est["kinds"] if is_sampled(p) and params.evaluate.samples >= 2]
    if not protocols:
        return []
    head = ["model", *(_label(params, p) for p in protocols)]
    lines = [_row(head), _row(["---"] * len(head))]
    for model in ["sft", *params.compare.algorithms]:
        tables = (
            [est["sft_problems"]]
            if model == "sft"
            else [est["runs"][params.compare.run_name(model, s)]["problems"] for s in params.compare.seeds]
        )
        cells = []
        for p in protocols:
            shares = [v for v in (_run_share(t, p) for t in tables) if v is not None]
            if not shares:
                cells.append("-")
            elif len(shares) == 1:
                cells.append(f"{shares[0]:.3f}")
            else:
                cells.append(f"{np.mean(shares):.3f} ({min(shares):.3f} to {max(shares):.3f})")
        lines.append(_row([model, *cells]))
    return lines


SHARE_TEXT = (
    "## How much the problem decides\n\n"
    "Per model and sampled protocol, the share of one episode's success variance that lies between problems: "
    "the variance of the problems' success rates (less the noise of k episodes each) over p(1 - p), p the "
    "success rate (components/stats.py, between_problem_share; an algorithm's value is the mean over its "
    "seeds, their range after it). A critic that knew each problem's success rate would explain this "
    "share of a first turn's success, so it is the ceiling of the critic's explained variance on first "
    "turns from the problem alone: later turns see more, and where the reward is shaped the critic fits "
    "returns, not success.\n\n"
)


def _intro(params: Params, est: dict) -> str:
    c, ev = params.compare, params.evaluate
    n_seeds = len(c.seeds)
    others = [p for p in ev.protocols if p != "greedy"]
    escape = (
        f" A protocol *with the no-op escape* plays the same episodes again, resampling a reply that already "
        f"changed nothing from the same state (up to {ev.noop_escape_tries} tries at "
        f"T={ev.noop_escape_temperature:g}; docs/evaluation.md): an inference-time rule, not training."
        if ev.noop_escape_protocols
        else ""
    )
    return (
        f"# {params.task}: RL algorithms against the SFT baseline\n\n"
        f"**Headline protocol: {_label(params, c.headline)}.** Every protocol the evaluation ran is shown, "
        f"the headline first: greedy (one episode per problem at temperature 0)"
        + "".join(f"; {_label(params, p)}" for p in others)
        + f" (docs/evaluation.md).{escape} "
        f"{ev.split.capitalize()} split ({est['n_problems']} problems), multi-turn with the task's real environment. "
        "Accuracy (for sokoban: the success rate) of a sampled protocol is mean@k, the mean over problems of the "
        "fraction of their k episodes that succeed; pass@k the fraction of problems with at least one. Mean turns, "
        "tool use, format errors, return and turns are of the greedy episode. "
        f"Every algorithm is trained {n_seeds} time"
        f"{'s' if n_seeds > 1 else ''} from the one SFT checkpoint (SFT seed {params.seed}), with RL seeds "
        f"{', '.join(map(str, c.seeds))}; its values are means over those runs. Wall time and generated tokens "
        "are of RL training.\n\n"
        f"Intervals are {CONFIDENCE:.0%} percentile bootstrap intervals ({RESAMPLES} resamples, scipy.stats.bootstrap) "
        f"over {RESAMPLED}. The intervals carry both the uncertainty of which RL seeds were run and of the "
        "finite test set; this crossed bootstrap is conservative (slightly wide) and, with two or three seeds, "
        "coarse in its seed part: read it with the per-run table below. A difference is called significant when "
        "its interval excludes 0.\n\n"
    )


DIAGNOSTICS_TEXT = (
    "## Collapse signs and the critic\n\n"
    "Per run, the mean over its first and its last quarter of RL iterations (at least one) of what RAGEN "
    "found to announce a collapse: the in-group standard deviation of the trajectory returns (the batch's "
    "for algorithms that sample one trajectory per prompt), the policy's entropy (minus the mean log-prob of "
    "the sampled tokens), the number of distinct actions taken from one anchor state, and the training "
    "success rate, all over every sampled trajectory (components/train/collapse.py). A fall of at least "
    "half, with training success falling, reads as a collapse; with success rising, as a policy converging. "
    "For PPO and StepPO, the critic's explained variance of the returns on the iteration's fresh batch "
    "(held out from everything the critic was fitted on) at the first iteration, with its 95% bootstrap "
    "interval over the batch's trajectories (one batch is a small sample: the figure moves by several "
    "hundredths between batches), its lowest over the run (did an in-run update undo the warm-up?) and at "
    "the last iteration.\n\n"
)


def interval_metrics(params: Params, est: dict) -> dict[str, float]:
    """The report's estimates as MLflow metrics: per model and protocol
    ``compare/<model>/<protocol>/<accuracy|loop_rate>`` with ``_low`` / ``_high`` (its interval) and,
    for an algorithm, ``..._vs_sft`` with its interval."""
    metrics = [("accuracy", lambda p: p)] + ([("loop_rate", loop_kind)] if est["loops"] else [])
    out = {}
    for model in ["sft", *params.compare.algorithms]:
        for p in est["kinds"]:
            for name, kind in metrics:
                key = f"compare/{model}/{p}/{name}"
                pairs = [("", est["mean"][kind(p), model])]
                if model != "sft":
                    pairs.append(("_vs_sft", est["vs_sft"][kind(p), model]))
                for suffix, e in pairs:
                    out |= {key + suffix: e.value, f"{key}{suffix}_low": e.low, f"{key}{suffix}_high": e.high}
    return out


@task
def table(params: Params) -> str:
    """reports/compare.md (module docstring); inside an MLflow run, the estimates as its metrics too
    (:func:`interval_metrics`)."""
    import mlflow

    est = _estimates(params)
    if mlflow.active_run() is not None:
        mlflow.log_metrics(interval_metrics(params, est))
    cols = _Columns(params, est)
    pairs = _pairs_table(params, est)
    shares = _share_table(params, est)
    text = (
        _intro(params, est)
        + "\n".join(_algorithm_table(params, est, cols))
        + ("\n\n" + LOOP_TEXT + "\n".join(_loop_table(params, est)) if est["loops"] else "")
        + "\n\n## Return and turns of the greedy episode\n\n"
        "Per test problem, the greedy episode's return (the sum of its step rewards, the task's reward) and its "
        "number of turns (an unsolved episode counts the turns it used, up to rollout.max_steps: fewer is "
        "better only together with a higher accuracy), with intervals and differences as above.\n\n"
        + "\n".join(_episode_table(params, est))
        + "\n\n## Every run\n\n"
        + "\n".join(_runs_table(params, est, cols))
        + "\n\n"
        + ("## Algorithm against algorithm\n\n" + "\n".join(pairs) + "\n\n" if pairs else "")
        + DIAGNOSTICS_TEXT
        + "\n".join(_diagnostics_table(params))
        + ("\n\n" + SHARE_TEXT + "\n".join(shares) if shares else "")
        + "\n\n## In words\n\n"
        + "\n".join(_sentence(params, est, a) for a in params.compare.algorithms)
        + "\n"
    )
    return str(write_text(text, REPO / "reports" / "compare.md"))


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def val_column(params: Params, curves: Mapping[str, pl.DataFrame]) -> tuple[str, str]:
    """The validation curve to draw: the headline protocol's (``val_t0.4_accuracy``) where every run
    has it, else greedy's (``val_accuracy``: runs from before the column, or a headline that
    validation does not sample); and its label."""
    head = params.compare.headline
    column = f"val_{head}_accuracy"
    if head != "greedy" and curves and all(column in df.columns for df in curves.values()):
        return column, protocol_label(head, 1)  # validation samples one episode per row
    return "val_accuracy", "greedy"


@task
def chart(params: Params) -> str:
    c = params.compare
    val, score = {}, {}
    initial = []
    runs = {a: {name: _curve(name) for name in (c.run_name(a, s) for s in c.seeds)} for a in c.algorithms}
    column, label = val_column(params, {n: df for curves in runs.values() for n, df in curves.items()})
    for a, curves in runs.items():
        try:
            v = curve_band(curves, "iteration", column)
            r = curve_band(curves, "iteration", "score_mean")
        except ValueError as err:
            raise StageError(f"compare: plots/train_<run>.csv: {err}") from None
        val[a] = Band(v["iteration"].to_list(), v["mean"].to_list(), v["low"].to_list(), v["high"].to_list())
        score[a] = Band(
            r["iteration"].to_list(), r["mean"].to_list(), r["low"].to_list(), r["high"].to_list()
        )
        for df in curves.values():  # iteration -1: the SFT policy on the val rows, before any update
            initial += df.filter(pl.col("iteration") == -1)[column].drop_nulls().to_list()
    points = {"SFT (val, iteration -1)": (-1.0, sum(initial) / len(initial))} if initial else {}
    seeds = ", ".join(map(str, c.seeds))
    panels = [
        Panel(f"(a) validation accuracy ({label})", "RL iteration", "accuracy", val, points),
        Panel("(b) training reward (critic/score/mean)", "RL iteration", "mean score", score),
    ]
    return str(
        band_chart(
            panels,
            REPO / "reports" / "compare.png",
            title=f"{params.task}: mean over RL seeds {seeds}, band = min..max over seeds",
        )
    )


@flow(name="compare", log_prints=True)
def compare_flow(params: Params) -> str:
    with mlflow_run(params, "compare", ["compare"]):
        import mlflow

        md, png = table(params), chart(params)
        mlflow.log_artifact(md)
        mlflow.log_artifact(png)
    text = Path(md).read_text()
    print(text)
    return text


def inputs(params: Params) -> list[str]:
    """The files the report reads (relative to the repo)."""
    names = [name for _, _, name in params.compare.runs()]
    return (
        ["metrics/eval_sft.json", "metrics/problems_sft.parquet"]
        + [f"metrics/{kind}_{n}.json" for n in names for kind in ("eval", "train")]
        + [f"metrics/problems_{n}.parquet" for n in names]
        + [f"plots/train_{n}.csv" for n in names]
    )


def main(params: str) -> None:
    p = read_params(params)
    missing = [f for f in inputs(p) if not (REPO / f).is_file()]
    if missing:
        raise StageError(
            f"compare: {len(missing)} input file(s) missing, e.g. {', '.join(missing[:4])} "
            "(run the train stage of every run of compare.algorithms x compare.seeds)"
        )
    compare_flow(p)


if __name__ == "__main__":
    stage_main(main)
