"""`python -m flows.sweep`: the RL runs of DVC experiments side by side, from MLflow.

A sweep is DVC's own experiment queue: queue settings with ``dvc exp run --queue -S ...`` (a
comma-separated value queues one experiment per value, e.g. ``-S 'train.kl_coef=0,0.05'``; a
profile's overrides come first with ``python -m flows.repro --profile <name> --queue ...``), run
them with ``python -m flows.repro -- dvc exp run --run-all`` (one Prefect server, every run logged to
this repo's MLflow store). Every train stage of an experiment is an MLflow run tagged
``dvc.exp_name``. This command collects those runs (``--experiment``: the MLflow experiment, default
the task's name; ``--exp``: only these DVC experiments), and writes

- ``reports/sweep.md``: one row per DVC experiment and algorithm: the params that differ between the
  experiments, the RL seeds, the greedy validation success after each validation (mean over seeds),
  and the final test success, greedy and sampled at T=1 (mean over seeds, and per seed), then per
  evaluation protocol (docs/evaluation.md) the test success of each sampled protocol and the loop rate
  of each protocol, means over seeds, where the runs logged them;
- ``reports/sweep.png``: one panel per DVC experiment, the validation curve of every run in it,

and logs both to an MLflow run ``sweep``. It reads only what MLflow holds; it trains nothing.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from components.io import write_text
from components.plots import small_multiples
from flows import REPO

# params that identify a run rather than a setting (every run differs in them)
IDENTITY = {"seed", "algo.rl_seed", "algo.name"}
# A protocol's test metrics that get a column (flows/evaluate.py logs eval/<protocol>/<metric>).
PROTOCOL_METRIC = re.compile(r"eval/((?:greedy|t[0-9.]+)(?:_escape)?)/(accuracy|loop_rate)")


@dataclass
class SweepRun:
    exp_name: str
    run_name: str
    algo: str
    seed: int
    params: dict[str, str]
    val: list[tuple[int, float]]  # (iteration, greedy validation success); -1 = the SFT policy
    # eval/accuracy, eval/sampled_accuracy, and eval/<protocol>/accuracy|loop_rate (PROTOCOL_METRIC)
    test: dict[str, float] = field(default_factory=dict)


def collect(experiment: str, exp_names: list[str] | None = None) -> list[SweepRun]:
    """The train runs of DVC experiments in MLflow experiment ``experiment`` (only ``exp_names`` if given)."""
    import mlflow

    client = mlflow.tracking.MlflowClient()
    found = mlflow.get_experiment_by_name(experiment)
    if found is None:
        raise SystemExit(f"sweep: no MLflow experiment {experiment!r} at {mlflow.get_tracking_uri()}")
    runs = client.search_runs([found.experiment_id], max_results=5000)
    out = []
    for r in runs:
        tags = r.data.tags
        name = tags.get("dvc.exp_name")
        if not name or "steprl.algo" not in tags or (exp_names and name not in exp_names):
            continue
        history = client.get_metric_history(r.info.run_id, "val/accuracy")
        out.append(
            SweepRun(
                exp_name=name,
                run_name=r.info.run_name,
                algo=tags["steprl.algo"],
                seed=int(tags.get("steprl.rl_seed", -1)),
                params=dict(r.data.params),
                val=sorted((m.step, m.value) for m in history),
                test={
                    k: v
                    for k, v in r.data.metrics.items()
                    if k in ("eval/accuracy", "eval/sampled_accuracy") or PROTOCOL_METRIC.fullmatch(k)
                },
            )
        )
    return sorted(out, key=lambda s: (s.exp_name, s.algo, s.seed))


def varying(runs: list[SweepRun]) -> list[str]:
    """The params whose value differs between the runs (a setting of the sweep), identity params aside."""
    keys = sorted({k for r in runs for k in r.params} - IDENTITY)
    return [k for k in keys if len({r.params.get(k) for r in runs}) > 1]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def table(runs: list[SweepRun]) -> str:
    keys = varying(runs)
    groups: dict[tuple[str, str], list[SweepRun]] = defaultdict(list)
    for r in runs:
        groups[r.exp_name, r.algo].append(r)
    head = [
        "DVC experiment",
        "algorithm",
        *keys,
        "RL seeds",
        "validation (iteration: mean)",
        "test greedy",
        "test sampled",
        "test greedy per seed",
    ]
    # the protocols' columns (greedy accuracy is "test greedy" already)
    extra = sorted(
        {k for r in runs for k in r.test if PROTOCOL_METRIC.fullmatch(k)} - {"eval/greedy/accuracy"}
    )
    head += [f"test {k.split('/')[1]} {k.split('/')[2].replace('_', ' ')}" for k in extra]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (exp, algo), members in sorted(groups.items()):
        first = members[0].params
        steps = sorted({k for r in members for k, _ in r.val})
        curve = ", ".join(
            f"{k}: {_mean([v for r in members for s, v in r.val if s == k]):.2f}" for k in steps
        )
        greedy = [r.test["eval/accuracy"] for r in members if "eval/accuracy" in r.test]
        sampled = [r.test["eval/sampled_accuracy"] for r in members if "eval/sampled_accuracy" in r.test]
        cells = [
            exp,
            algo,
            *(first.get(k, "-") for k in keys),
            ", ".join(str(r.seed) for r in members),
            curve or "-",
            _fmt(_mean(greedy)),
            _fmt(_mean(sampled)),
            ", ".join(_fmt(v) for v in greedy) or "-",
            *(_fmt(_mean([r.test[k] for r in members if k in r.test])) for k in extra),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    settings = ", ".join(f"`{k}`" for k in keys) or "none (every experiment has the same params)"
    return (
        "# Sweep: RL runs of DVC experiments side by side\n\n"
        f"{len(runs)} train runs in {len({r.exp_name for r in runs})} DVC experiments. Settings that differ: "
        f"{settings}. Validation is greedy success on the validation rows (iteration -1: the SFT policy); "
        "test columns are the final policy on the test split, means over the RL seeds listed.\n\n"
        + "\n".join(lines)
        + "\n"
    )


def _short(value: object, width: int = 24) -> str:
    """A param's value for a panel title: cut to ``width`` characters."""
    text = str(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def chart(runs: list[SweepRun], path: Path, experiment: str) -> Path:
    """One panel per DVC experiment and algorithm, titled with the settings that differ between the
    experiments for that algorithm (not those that differ between algorithms), two to a line."""
    panels: dict[str, dict[str, tuple[list[float], list[float]]]] = defaultdict(dict)
    keys = {algo: varying([r for r in runs if r.algo == algo]) for algo in {r.algo for r in runs}}
    for r in runs:
        settings = [f"{k}={_short(r.params.get(k))}" for k in keys[r.algo]]
        lines = [", ".join(settings[i : i + 2]) for i in range(0, len(settings), 2)]
        label = "\n".join([f"{r.exp_name} ({r.algo})", *lines])
        panels[label][r.run_name] = ([k for k, _ in r.val], [v for _, v in r.val])
    return small_multiples(
        dict(sorted(panels.items())),
        path,
        title=f"{experiment}: greedy validation success of every run, one panel per DVC experiment",
        xlabel="RL iteration",
        ylabel="validation success",
    )


def main(argv: list[str] | None = None) -> int:
    import mlflow
    from flows._stage import ensure_experiment, read_params, tracking_uri

    parser = argparse.ArgumentParser(prog="python -m flows.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--experiment", help="MLflow experiment (default: params.yaml's mlflow.experiment or task)"
    )
    parser.add_argument("--exp", nargs="*", help="only these DVC experiments (default: every one with runs)")
    parser.add_argument("--params", default="params.yaml")
    args = parser.parse_args(argv)
    params = read_params(args.params)
    mlflow.set_tracking_uri(tracking_uri(params))
    experiment = args.experiment or params.mlflow.experiment or params.task
    runs = collect(experiment, args.exp)
    if not runs:
        print(
            f"sweep: no train runs of a DVC experiment in MLflow experiment {experiment!r}", file=sys.stderr
        )
        return 1
    md = write_text(table(runs), REPO / "reports" / "sweep.md")
    png = chart(runs, REPO / "reports" / "sweep.png", experiment)
    mlflow.set_experiment(experiment_id=ensure_experiment(experiment))
    with mlflow.start_run(run_name="sweep", tags={"steprl.stage": "sweep"}):
        mlflow.log_artifact(str(md))
        mlflow.log_artifact(str(png))
    print(Path(md).read_text())
    print(f"sweep: {md} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
