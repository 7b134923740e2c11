"""Stage `evaluate_sft`, and the evaluation that ends every `train@<algo>-<seed>` stage.

Plays every row of the held-out split to the end with the task's real tools: one greedy episode per
row, and ``evaluate.samples`` sampled ones at ``evaluate.temperature`` (sampling seed: params.seed,
the same for every model). `python -m flows.evaluate --model sft` evaluates models/sft on a rollout
engine of its own (vLLM by default); a train stage evaluates its final policy with the rollout engine
it already holds (:func:`evaluate` with its ``engine``), which saves a process start and an engine build per
RL run. Writes metrics/eval_<model>.json (greedy accuracy, mean turns, valid tool-call rate,
format-error rate; sampled_accuracy = mean@k and pass_at_k of the sampled episodes) and
metrics/problems_<model>.parquet (one row per problem: greedy correctness, fraction of sampled
episodes correct; components.schemas.ProblemSchema), which the compare stage bootstraps. Logs the
metrics (``eval/*``) and a readable sample of greedy trajectories to the active MLflow run.
"""

from __future__ import annotations

import time
from pathlib import Path

import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from components.agent.loop import Episode, episode_metrics, run_episodes, sampled_metrics
from components.agent.render import ChatRenderer
from components.config import Params
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
) -> tuple[list[dict], list[dict]]:
    """Step records of one greedy episode per row, and of ``evaluate.samples`` sampled ones per row,
    played on ``engine`` with ``renderer`` (a train stage's, holding its final weights) or, without
    them, on a rollout engine built from the model's checkpoint."""
    spec = get_task(params.task)
    r, ev = params.rollout, params.evaluate
    data_dir = processed(params.task)  # the prepare output (tables and task files)
    own = engine is None
    if own:
        with timed("engine_start"):
            engine, renderer = open_engine(params, model_dir(model))

    def episode(row: dict, traj_id: str) -> Episode:
        return Episode(traj_id, str(row["id"]), spec.make_env(row, data_dir=data_dir), row)

    def run(episodes: list[Episode], temperature: float, desc: str) -> list[dict]:
        return run_episodes(
            engine,
            renderer,
            episodes,
            max_steps=r.max_steps,
            max_prompt_len=r.max_prompt_len,
            max_response_len=r.max_response_len,
            context_window=r.context_window,
            temperature=temperature,
            seed=params.seed,
            desc=desc,
        )

    try:
        with timed("episodes"):
            greedy = run([episode(row, str(row["id"])) for row in rows], 0.0, f"evaluate {model}")
            sampled = [episode(row, f"{row['id']}#{i}") for row in rows for i in range(ev.samples)]
            desc = f"evaluate {model} (T={ev.temperature:g})"
            return greedy, (run(sampled, ev.temperature, desc) if sampled else [])
    finally:
        if own:
            engine.close()


def evaluate(
    params: Params, model: str, engine: RolloutEngine | None = None, renderer: ChatRenderer | None = None
) -> dict[str, float]:
    """Evaluate ``model`` (see the module docstring) inside the active MLflow run, on ``engine`` if
    given (see :func:`play`); its metrics."""
    import mlflow

    split = params.evaluate.split
    df = pl.read_parquet(processed(params.task) / f"{split}.parquet")
    if params.evaluate.max_samples:
        df = df.head(params.evaluate.max_samples)
    start = time.perf_counter()
    steps, sampled = play(params, model, df.to_dicts(), engine, renderer)
    metrics = {**episode_metrics(steps), **get_task(params.task).task_metrics(steps)}  # + the task's own
    if sampled:
        metrics.update(sampled_metrics(sampled))
        metrics["sampled_temperature"] = params.evaluate.temperature
    metrics["wall_time_s"] = time.perf_counter() - start
    metrics["generated_tokens"] = float(sum(len(s["response_ids"]) for s in steps + sampled))
    problems = problem_results([str(i) for i in df["id"].to_list()], steps, sampled)
    problems = validate_table(problems, ProblemSchema, f"evaluate {model}: per-problem results")
    write_parquet(problems, REPO / "metrics" / f"problems_{model}.parquet")
    write_json({"model": model, "split": split, **metrics}, REPO / "metrics" / f"eval_{model}.json")
    mlflow.log_metrics({f"eval/{k}": v for k, v in metrics.items()})
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir(model))
    mlflow.log_text(render_samples(steps, limit=20, tokenizer=tokenizer), f"samples/eval_{model}.md")
    print(
        f"evaluate {model} on {split} ({len(df)} rows): accuracy {metrics['accuracy']:.3f}, "
        f"mean turns {metrics['mean_turns']:.2f}, valid tool calls {metrics['valid_tool_call_rate']:.3f}, "
        f"format errors {metrics['format_error_rate']:.3f}"
        + (
            f"; sampled (T={params.evaluate.temperature:g}) mean@{params.evaluate.samples} "
            f"{metrics['sampled_accuracy']:.3f}, pass@{params.evaluate.samples} {metrics['pass_at_k']:.3f}"
            if "sampled_accuracy" in metrics
            else ""
        )
    )
    return metrics


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
