"""Stage `evaluate_sft`, and the evaluation that ends every `train@<algo>-<seed>` stage.

Plays every row of the held-out split to the end with the task's real tools under each evaluation
protocol (docs/evaluation.md): one greedy episode per row, and per temperature T of
``evaluate.temperatures`` ``evaluate.samples`` episodes sampled at T (protocol ``t<T>``; sampling seed:
params.seed, the same for every model); each protocol of ``evaluate.noop_escape_protocols`` a
second time with the no-op escape (``greedy_escape``, ``t0.4_escape``). `python -m flows.evaluate
--model sft` evaluates models/sft on a rollout engine of its own (vLLM by default); a train stage
evaluates its final policy with the rollout engine it already holds (:func:`evaluate` with its
``engine``), which saves a process start and an engine build per RL run.

Writes metrics/eval_<model>.json: per protocol a block of its metrics (``"greedy": {...}``,
``"t0.4": {...}``: accuracy, mean turns, tool use, format errors, the task's own metrics such as
sokoban's success and loop rates, and for a sampled protocol mean@k = ``accuracy`` and ``pass_at_k``),
and beside them the flat keys of the evaluation before protocols, unchanged in meaning: the greedy
episode's metrics, and ``sampled_accuracy`` / ``pass_at_k`` of the episodes sampled at T=1 (when 1 is
among the temperatures). metrics/problems_<model>.parquet holds one row per problem
(components.stats.problem_results: greedy correctness, each protocol's fraction correct, loop rates),
which the compare stage bootstraps. Logs ``eval/<protocol>/<metric>`` and the flat ``eval/<metric>``
and a readable sample of greedy trajectories to the active MLflow run.
"""

from __future__ import annotations

import time
from pathlib import Path

import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from components.agent.loop import Episode, NoopEscape, episode_metrics, run_episodes, sampled_metrics
from components.agent.render import ChatRenderer
from components.config import Params, is_sampled, protocol_label
from components.envs import get_task
from components.io import write_json, write_parquet
from components.model.tiny import is_complete_checkpoint
from components.rollout import RolloutEngine
from components.rollout.factory import make_engine
from components.schemas import ProblemSchema, validate_table
from components.stats import problem_results
from flows import REPO, processed
from flows._gpu import check_gpu_memory
from flows._stage import StageError, mlflow_run, read_params, stage_main, timed
from flows._trajectories import render_samples


def model_dir(name: str):
    """models/<name> (sft), or models/<name>/final (an RL run, e.g. grpo-s0)."""
    final = REPO / "models" / name / "final"
    return final if final.is_dir() else REPO / "models" / name


def open_engine(params: Params, path: Path) -> tuple[RolloutEngine, ChatRenderer]:
    """A rollout engine with the ``rollout`` settings on the checkpoint at ``path`` (seed params.seed;
    no update runs beside it, so it never sleeps), and the task's renderer for its tokenizer."""
    from transformers import AutoTokenizer  # with the engine, not at the stage's start

    tokenizer = AutoTokenizer.from_pretrained(path)
    settings = params.rollout.engine_settings(params.seed)
    engine = make_engine(settings, str(path), stop_token_ids=[tokenizer.eos_token_id])
    return engine, ChatRenderer(tokenizer, get_task(params.task).tools(), stop_token=tokenizer.eos_token)


@task(cache_policy=NO_CACHE)
def play(
    params: Params,
    model: str,
    rows: list[dict],
    engine: RolloutEngine | None = None,
    renderer: ChatRenderer | None = None,
) -> tuple[list[dict], dict[str, list[dict]]]:
    """Step records of one greedy episode per row, and per other protocol (name -> records): for a
    sampled one ``evaluate.samples`` episodes per row at its temperature, for one of
    ``evaluate.noop_escape_protocols`` the same episodes played with the no-op escape (``greedy_escape``:
    one per row). Played on ``engine`` with ``renderer`` (a train stage's, holding its final weights)
    or, without them, on a rollout engine built from the model's checkpoint."""
    spec = get_task(params.task)
    r, ev = params.rollout, params.evaluate
    data_dir = processed(params.task)  # the prepare output (tables and task files)
    own = engine is None
    if own:
        with timed("engine_start"):
            engine, renderer = open_engine(params, model_dir(model))

    escape = NoopEscape(ev.noop_escape_tries, ev.noop_escape_temperature)

    def run(temperature: float | None, escaped: bool) -> list[dict]:
        # The greedy episode keeps the row id as its trajectory id, a sampled one adds #i (its sampling
        # seed depends on the trajectory id only: the same at every temperature, with or without the escape)
        tags = [""] if temperature is None else [f"#{i}" for i in range(ev.samples)]
        episodes = [
            Episode(
                f"{row['id']}{tag}",
                str(row["id"]),
                spec.make_env(row, data_dir=data_dir, tool_parser=params.rollout.tool_parser),
                row,
            )
            for row in rows
            for tag in tags
        ]
        label = ("" if temperature is None else f" (T={temperature:g})") + (" escape" if escaped else "")
        return run_episodes(
            engine,
            renderer,
            episodes,
            **r.episode_limits(),
            temperature=0.0 if temperature is None else temperature,
            seed=params.seed,
            desc=f"evaluate {model}{label}",
            noop_escape=escape if escaped else None,
        )

    try:
        with timed("episodes"):
            records = {name: run(temperature, escaped) for name, temperature, escaped in ev.plays()}
            return records.pop("greedy"), records
    finally:
        if own:
            engine.close()


def protocol_metrics(task: str, steps: list[dict], *, sampled: bool) -> dict[str, float]:
    """The metrics of one protocol's episodes: :func:`episode_metrics` and the task's own, and for a
    sampled protocol its ``pass_at_k`` and ``samples_per_prompt`` (its ``accuracy`` is then mean@k: the
    mean over problems of the fraction of their episodes that are correct, the problems having k each)."""
    metrics = {**episode_metrics(steps), **get_task(task).task_metrics(steps)}
    if sampled:
        k = sampled_metrics(steps)
        metrics |= {"pass_at_k": k["pass_at_k"], "samples_per_prompt": k["samples_per_prompt"]}
    return metrics


def eval_record(task: str, greedy: list[dict], others: dict[str, list[dict]]) -> dict:
    """eval_<model>.json's metrics (module docstring): a block per protocol, and the flat keys of the
    greedy episodes and of the T=1 protocol (``sampled_accuracy``, ``pass_at_k``) as before protocols."""
    blocks = {"greedy": protocol_metrics(task, greedy, sampled=False)}
    blocks |= {
        name: protocol_metrics(task, steps, sampled=is_sampled(name)) for name, steps in others.items()
    }
    flat = dict(blocks["greedy"])
    if "t1" in others:
        flat |= sampled_metrics(others["t1"]) | {"sampled_temperature": 1.0}
    return {**flat, **blocks}


def evaluate(
    params: Params, model: str, engine: RolloutEngine | None = None, renderer: ChatRenderer | None = None
) -> dict:
    """Evaluate ``model`` (see the module docstring) inside the active MLflow run, on ``engine`` if
    given (see :func:`play`); its metrics (eval_<model>.json's, without model and split)."""
    import mlflow

    split = params.evaluate.split
    df = pl.read_parquet(processed(params.task) / f"{split}.parquet")
    if params.evaluate.max_samples:
        df = df.head(params.evaluate.max_samples)
    start = time.perf_counter()
    steps, others = play(params, model, df.to_dicts(), engine, renderer)
    metrics = eval_record(params.task, steps, others)
    metrics["wall_time_s"] = time.perf_counter() - start
    every = steps + [s for records in others.values() for s in records]
    metrics["generated_tokens"] = float(sum(len(s["response_ids"]) for s in every))
    ids = [str(i) for i in df["id"].to_list()]
    problems = problem_results(ids, steps, others.get("t1", ()), protocols=others)
    problems = validate_table(problems, ProblemSchema, f"evaluate {model}: per-problem results")
    write_parquet(problems, REPO / "metrics" / f"problems_{model}.parquet")
    write_json({"model": model, "split": split, **metrics}, REPO / "metrics" / f"eval_{model}.json")
    mlflow.log_metrics(mlflow_metrics("eval", metrics))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir(model))
    mlflow.log_text(render_samples(steps, limit=20, tokenizer=tokenizer), f"samples/eval_{model}.md")
    k = params.evaluate.samples
    print(
        f"evaluate {model} on {split} ({len(df)} rows): "
        + "; ".join(
            f"{protocol_label(name, k)}: accuracy {metrics[name]['accuracy']:.3f}"
            + (f", pass@{k} {metrics[name]['pass_at_k']:.3f}" if is_sampled(name) else "")
            + f", mean turns {metrics[name]['mean_turns']:.2f}"
            + (f", loop rate {metrics[name]['loop_rate']:.3f}" if "loop_rate" in metrics[name] else "")
            for name in params.evaluate.protocols
        )
        + f"; greedy valid tool calls {metrics['valid_tool_call_rate']:.3f}, "
        f"format errors {metrics['format_error_rate']:.3f}"
    )
    return metrics


def mlflow_metrics(prefix: str, metrics: dict) -> dict[str, float]:
    """``prefix/<key>`` of the flat numbers and ``prefix/<protocol>/<key>`` of each protocol's block."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            out |= {f"{prefix}/{key}/{k}": float(v) for k, v in value.items()}
        else:
            out[f"{prefix}/{key}"] = float(value)
    return out


@flow(name="evaluate", log_prints=True)
def evaluate_flow(params: Params, model: str) -> dict[str, float]:
    with mlflow_run(params, f"evaluate-{model}", ["rollout", "evaluate"], tags={"steprl.model": model}):
        return evaluate(params, model)


def main(params: str, model: str) -> None:
    p = read_params(params)
    if not is_complete_checkpoint(model_dir(model)):
        raise StageError(
            f"model {model!r}: {model_dir(model)} is not a complete checkpoint (run its stage first)"
        )
    check_gpu_memory(p, model_dir(model), trained_models=0, rollout=True)
    evaluate_flow(p, model)


if __name__ == "__main__":
    stage_main(
        main,
        (
            "--model",
            {"required": True, "help": "sft, or an RL run <algo>-s<seed> (e.g. grpo-s0) to evaluate again"},
        ),
    )
