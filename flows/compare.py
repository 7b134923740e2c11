"""Stage `compare`: one table and one chart of every algorithm against the SFT baseline.

reports/compare.md: algorithm, test accuracy (greedy), sampled accuracy (mean@k) and pass@k, mean
turns, valid tool-call rate, train wall time, generated tokens (SFT first). reports/compare.png:
validation accuracy against iteration, one line per algorithm starting at iteration -1 (the SFT model
on the val split, before any update), and the SFT test accuracy as a dashed baseline. Both are logged
to MLflow (run `compare`).
"""

from __future__ import annotations

import json

import polars as pl
from prefect import flow, task

from flows import REPO
from flows._stage import StageError, mlflow_run, read_params, stage_main
from components.config import Params
from components.io import write_text
from components.plots import line_chart


def _load(name: str) -> dict:
    path = REPO / "metrics" / name
    if not path.is_file():
        raise StageError(f"compare: {path} is missing (run the stage that writes it first)")
    return json.loads(path.read_text())


@task
def table(params: Params) -> str:
    rows = []
    for name in ["sft", *params.compare.algorithms]:
        ev = _load(f"eval_{name}.json")
        tr = _load(f"train_{name}.json") if name != "sft" else {}
        sampled = (f"{ev['sampled_accuracy']:.3f} | {ev['pass_at_k']:.3f}" if "sampled_accuracy" in ev else "- | -")
        rows.append(
            f"| {name} | {ev['accuracy']:.3f} | {sampled} | {ev['mean_turns']:.2f} | {ev['valid_tool_call_rate']:.3f} "
            f"| {ev['format_error_rate']:.3f} | {tr.get('train_wall_time_s', 0):.0f} | {int(tr.get('generated_tokens', 0))} |"
        )
    ev = params.evaluate
    header = (
        f"# {params.task}: RL algorithms against the SFT baseline\n\n"
        f"{ev.split.capitalize()} split, multi-turn with the real tools. Accuracy is of one greedy episode per problem; "
        f"sampled accuracy (mean@k) and pass@k of k = {ev.samples} episodes per problem at temperature {ev.temperature:g}. "
        "Wall time and generated tokens are of RL training.\n\n"
        "| algorithm | accuracy (greedy) | sampled accuracy (mean@k) | pass@k | mean turns | valid tool calls "
        "| format errors | train wall time (s) | generated tokens |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    return str(write_text(header + "\n".join(rows) + "\n", REPO / "reports" / "compare.md"))


@task
def chart(params: Params) -> str:
    series = {}
    for algo in params.compare.algorithms:
        df = pl.read_csv(REPO / "plots" / f"train_{algo}.csv").filter(pl.col("val_accuracy").is_not_null())
        series[algo] = (df["iteration"].to_list(), df["val_accuracy"].to_list())
    sft = _load("eval_sft.json")["accuracy"]
    return str(line_chart(series, REPO / "reports" / "compare.png", title=f"{params.task}: validation accuracy",
                          xlabel="RL iteration", ylabel="accuracy (greedy)", baseline=("SFT (test)", sft)))


@flow(name="compare")
def compare_flow(params: Params) -> str:
    with mlflow_run(params, "compare", ["compare"]):
        import mlflow

        md, png = table(params), chart(params)
        mlflow.log_artifact(md)
        mlflow.log_artifact(png)
    text = open(md).read()
    print(text)
    return text


def main(params: str) -> None:
    compare_flow(read_params(params))


if __name__ == "__main__":
    stage_main(main)
