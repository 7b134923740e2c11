"""Stage `critic_warmup`: the critic of the critic-based algorithms, fitted once before any RL run.

With ``critic_warmup.episodes`` > 0 it plays that many episodes of the SFT policy (the rollout engine,
``train.temperature``, one episode per RL prompt: train rows after ``sft.rows``, drawn with
``seed``; more episodes than prompts play each prompt again), fits a critic (the SFT backbone, a
zero value head) to their discounted returns until its explained variance on held-out selection
prompts stops rising (components/train/critic_fit.py),
and writes the best fit to models/critic (HF format, with its Adam moments in adam_moments.pt where
the optimizer is a plain torch one), metrics/critic_warmup.json (``held_out_ev_*``: measured once on
report prompts that chose nothing; ``selection_best_ev_*``: the best of the measurements that
chose the step) and plots/critic_warmup.csv (the selection split's explained variance by optimizer
step; drawn in MLflow). Every ppo and steppo run (any RL seed) starts its critic from
models/critic (flows/train_settings.warm_critic), so the warm-up is paid once per task and SFT
checkpoint. With ``episodes: 0`` it writes models/critic/off.json only, and each run's critic starts
from the SFT backbone as before. Either way it first removes what models/critic held (as DVC does
before it runs a stage): run directly, an older fit must not be left for the runs to start from.
"""

from __future__ import annotations

import math
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import polars as pl
import torch
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from tqdm.auto import tqdm

from components.agent.loop import Episode, run_episodes
from components.config import Params, warmup_held_out
from components.envs import get_task
from components.io import write_json, write_text
from components.model.tiny import is_complete_checkpoint, save_hf
from components.plots import line_chart
from components.schemas import StepSchema, validate_table
from components.train.critic import build_critic
from components.train.critic_fit import FitResult, FitSettings, fit_critic, value_targets
from components.train.engine import build_engine
from components.train.optimizer_state import ADAM_MOMENTS
from flows import REPO, processed
from flows._stage import StageError, mlflow_run, read_params, stage_main, timed
from flows.evaluate import open_engine
from flows.train import SFT, rl_prompts
from flows.train_settings import CRITIC

METRICS = REPO / "metrics" / "critic_warmup.json"
CURVE = REPO / "plots" / "critic_warmup.csv"


def pick_prompts(rows: list[dict], episodes: int, seed: int) -> list[tuple[dict, int]]:
    """(prompt row, repeat) for ``episodes`` episodes: each RL prompt once, in an order drawn with
    ``seed``, while they last; beyond them every prompt again (repeat 1, 2, ...), each round in a new
    order, so that no prompt has two episodes more than another. No prompts, no episodes."""
    rng = random.Random(seed * 7_919 + 17)
    picked: list[tuple[dict, int]] = []
    k = 0
    while rows and len(picked) < episodes:
        picked += [(row, k) for row in rng.sample(rows, min(episodes - len(picked), len(rows)))]
        k += 1
    return picked


@task(cache_policy=NO_CACHE)
def rollout(params: Params) -> list[dict]:
    """``critic_warmup.episodes`` episodes of the SFT policy at train.temperature: one per RL prompt,
    and more than one per prompt where there are more episodes than prompts (:func:`pick_prompts`;
    a prompt's episodes share its group id, which keeps them in one split)."""
    spec, r, t = get_task(params.task), params.rollout, params.train
    data_dir = processed(params.task)
    rows = rl_prompts(pl.read_parquet(data_dir / "train.parquet"), params).to_dicts()
    problem = params.critic_warmup.split_problem(  # before the rollout, not after it (a train file's size)
        len(rows),
        f"the train rows of {data_dir / 'train.parquet'} after sft.rows={params.sft.rows}",
        more_prompts="a larger train file, or a lower sft.rows",
    )
    if problem is not None:
        raise StageError(f"critic_warmup: {problem}")
    episodes = [
        Episode(
            f"w-{row['id']}" + (f"-{k}" if k else ""),
            f"w-{row['id']}",
            spec.make_env(
                row, malformed_penalty=t.malformed_penalty, data_dir=data_dir, tool_parser=r.tool_parser
            ),
            row,
        )
        for row, k in pick_prompts(rows, params.critic_warmup.episodes, params.seed)
    ]
    with timed("engine_start"):
        engine, renderer = open_engine(params, SFT)
    try:
        with timed("episodes"):
            steps = run_episodes(
                engine,
                renderer,
                episodes,
                **r.episode_limits(),
                temperature=t.temperature,
                seed=params.seed,
                desc="critic warm-up rollout",
            )
    finally:
        engine.close()
    return validate_table(pl.DataFrame(steps), StepSchema, "critic warm-up rollouts").to_dicts()


def split_trajectories(
    rows: list[dict], held_out: float, seed: int
) -> tuple[list[dict], list[dict], list[dict]]:
    """(train, selection, report) rows: a share ``held_out`` of the prompts (groups: a prompt's
    episodes, or a trajectory where rows have no ``group_id``) is held out whole and halved, the first
    half choosing the fit's step, the second measuring it once (unbiased); an episode of a held-out
    start state never trains the critic. Raises a ValueError naming critic_warmup.episodes / held_out
    when a split would be empty."""

    def group(r: dict) -> str:
        return r.get("group_id") or r["traj_id"]

    groups = sorted({group(r) for r in rows})
    random.Random(seed).shuffle(groups)
    sizes = warmup_held_out(len(groups), held_out)  # the rule the params check at load and the rollout
    if sizes is None:
        raise ValueError(
            f"critic warm-up: {len(groups)} prompts with critic_warmup.held_out={held_out} hold out "
            f"{math.ceil(held_out * len(groups))}; the fit needs at least one train prompt and two held "
            "out (one to choose the step, one to report it): change critic_warmup.episodes (it plays "
            "one prompt an episode while prompts last) or critic_warmup.held_out"
        )
    n_select, n_held = sizes[0], sum(sizes)
    select, report = set(groups[:n_select]), set(groups[n_select:n_held])
    return (
        [r for r in rows if group(r) not in select and group(r) not in report],
        [r for r in rows if group(r) in select],
        [r for r in rows if group(r) in report],
    )


@task(cache_policy=NO_CACHE)
def fit(params: Params, steps: list[dict]) -> FitResult:
    """Fit the critic to the episodes' returns; the best fit is saved to models/critic."""
    from transformers import AutoTokenizer

    import mlflow

    w, t, ds = params.critic_warmup, params.train, params.deepspeed
    rows = value_targets(steps, gamma=t.gamma)
    train_rows, select_rows, report_rows = split_trajectories(rows, w.held_out, params.seed)
    tokenizer = AutoTokenizer.from_pretrained(SFT)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def make_engine(critic: torch.nn.Module) -> Any:
        return build_engine(
            critic,
            lr=w.lr,
            weight_decay=0.0,
            zero_stage=ds.zero_stage,
            dtype=ds.dtype,
            grad_clip=t.grad_clip,
            micro_batch_size=t.micro_batch_size,
            grad_accum_steps=1,
            warmup_steps=w.lr_warmup_steps,
            total_steps=max(w.lr_warmup_steps, 1),
            lr_schedule="constant",
            eps=t.adam_eps,
        )

    bar = tqdm(total=w.max_steps, desc="critic warm-up fit", unit="step")

    def progress(point: dict[str, float]) -> None:
        bar.update(int(point["step"]) - bar.n)
        bar.set_postfix(
            ev=f"{point['ev']:.3f}", token=f"{point['ev_token']:.3f}", step=f"{point['ev_step']:.3f}"
        )
        mlflow.log_metrics(
            {
                f"critic_warmup/{k if k == 'loss' else 'selection_' + k}": v
                for k, v in point.items()
                if k != "step" and math.isfinite(v)
            },
            step=int(point["step"]),
        )

    settings = FitSettings(
        batch_size=w.batch_size,
        micro_batch_size=t.micro_batch_size,
        max_steps=w.max_steps,
        eval_every=w.eval_every,
        patience=w.patience,
        seed=params.seed,
    )
    engine, result = fit_critic(
        build_critic(SFT), make_engine, train_rows, select_rows, report_rows, settings,
        pad_id=pad_id, progress=progress,
    )  # fmt: skip
    bar.close()
    meta = {"best_step": result.best_step, "held_out_ev": result.report["mean"], "episodes": w.episodes}
    save_hf(engine.module, tokenizer, CRITIC, metadata=meta)
    if result.optimizer_state is not None:
        torch.save(result.optimizer_state, CRITIC / ADAM_MOMENTS)
    else:
        print(
            f"critic warm-up: Adam moments not saved (deepspeed.dtype={ds.dtype}, zero_stage="
            f"{ds.zero_stage}: DeepSpeed's own optimizer holds them); runs start their critic's Adam fresh"
        )
    print(
        f"critic warm-up: {len(train_rows)} train / {len(select_rows)} selection / {len(report_rows)} "
        f"report step rows, best at step {result.best_step}: held-out explained variance (report "
        f"split) {result.report['token']:.3f} per token, {result.report['step']:.3f} per step "
        f"(selection split, best of {len(result.history)}: {result.best['ev_token']:.3f}, "
        f"{result.best['ev_step']:.3f})"
    )
    return result


def _report(params: Params, steps: list[dict], result: FitResult, png: Path) -> dict:
    trajectories = len({r["traj_id"] for r in steps})
    summary = {
        "episodes": trajectories,
        "step_rows": len(steps),
        "success_rate": len({r["traj_id"] for r in steps if r.get("correct")}) / max(trajectories, 1),
        "best_step": result.best_step,
        "steps_run": int(result.history[-1]["step"]),
        # the report split, measured once at the chosen step (unbiased)
        "held_out_ev_token": result.report["token"],
        "held_out_ev_step": result.report["step"],
        # the selection split at the chosen step: the best of len(history) measurements (biased up)
        "selection_best_ev_token": result.best["ev_token"],
        "selection_best_ev_step": result.best["ev_step"],
    }
    write_json(summary, METRICS)
    header = "step,loss,ev_token,ev_step,ev\n"
    lines = "".join(
        f"{int(h['step'])},{'' if math.isnan(h['loss']) else h['loss']},{h['ev_token']},{h['ev_step']},{h['ev']}\n"
        for h in result.history
    )
    write_text(header + lines, CURVE)
    steps_axis = [h["step"] for h in result.history]
    line_chart(
        {
            "per token (ppo)": (steps_axis, [h["ev_token"] for h in result.history]),
            "per step (steppo)": (steps_axis, [h["ev_step"] for h in result.history]),
        },
        png,
        title=f"critic warm-up on {params.task}: held-out explained variance",
        xlabel="optimizer step",
        ylabel="explained variance",
    )
    return summary


@flow(name="critic_warmup", log_prints=True)
def critic_warmup_flow(params: Params) -> dict:
    import mlflow

    with (
        mlflow_run(params, "critic-warmup", ["critic_warmup", "rollout"]),
        tempfile.TemporaryDirectory() as tmp,
    ):
        steps = rollout(params)
        with timed("fit"):
            result = fit(params, steps)
        png = Path(tmp) / "critic_warmup.png"
        summary = _report(params, steps, result, png)
        mlflow.log_metrics({f"critic_warmup/{k}": float(v) for k, v in summary.items()})
        mlflow.log_artifact(str(png), artifact_path="plots")
    return summary


def _clear() -> None:
    """models/critic of an earlier run removed: a fit of other params or another SFT checkpoint must
    never be taken for this run's (DVC removes a stage's outputs before it runs the stage; run
    directly, nothing else would)."""
    if CRITIC.is_symlink() or CRITIC.is_file():
        CRITIC.unlink()
    elif CRITIC.is_dir():
        shutil.rmtree(CRITIC)


def _off() -> None:
    """critic_warmup.episodes 0: no fit; the stage's outputs say so."""
    note = {"off": True, "why": "critic_warmup.episodes is 0: each run's critic starts from the SFT backbone"}
    CRITIC.mkdir(parents=True, exist_ok=True)
    write_json(note, CRITIC / "off.json")
    write_json(note, METRICS)
    write_text("step,loss,ev_token,ev_step,ev\n", CURVE)
    print("critic warm-up: off (critic_warmup.episodes: 0)")


def main(params: str) -> None:
    p = read_params(params)
    _clear()
    if p.critic_warmup.episodes == 0:
        _off()
        return
    if not is_complete_checkpoint(SFT):
        raise StageError(f"critic_warmup: {SFT} is not a complete checkpoint (run the sft stage first)")
    critic_warmup_flow(p)


if __name__ == "__main__":
    stage_main(main)
