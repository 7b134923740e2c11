"""Stage `sft`: supervised warm start of models/base on the expert trajectories -> models/sft.

Loss on assistant tokens only (prompts and tool outputs masked), run on a DeepSpeed engine (the engine
the RL update reuses). Logs the loss curve, params and the final checkpoint to MLflow; writes
metrics/sft.json and plots/sft_loss.csv for DVC.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import polars as pl
import torch
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from components.config import Params
from components.determinism import make_deterministic
from components.envs import get_task
from components.io import write_json, write_text
from components.model.sft_data import collate, encode_conversation, encode_turns
from components.model.tiny import is_complete_checkpoint, load_hf
from components.plots import line_chart
from components.train.checkpoint import save_checkpoint
from components.train.engine import build_engine
from components.train.launch import local_world, share_threads
from components.train.sft import run_sft
from components.train.torchrun import run_rank
from flows import REPO, processed
from flows._gpu import check_gpu_memory
from flows._nodes import check_world, machines, summary, torchrun_follower
from flows._stage import StageError, mlflow_run, read_params, stage_main, timed
from flows.base_model import check_template

BASE, OUT = REPO / "models" / "base", REPO / "models" / "sft"
LOG_BATCH = 500  # metrics per MLflow write (its batch limit is 1,000)


def encode_examples(params: Params, tokenizer) -> tuple[list, int]:
    spec = get_task(params.task)
    rows = pl.read_parquet(processed(params.task) / "train.parquet").to_dicts()[: params.sft.rows]
    window = params.rollout.context_window  # None: one example per conversation, whole history
    examples, dropped = [], 0
    for row in rows:
        if not row["expert"]:
            continue
        for demo in spec.demonstrations(row):
            messages = spec.initial_messages(row) + demo
            if window is None:
                encoded = [encode_conversation(tokenizer, messages, spec.tools(), params.sft.max_len)]
            else:  # one example per assistant turn, on the context the agent loop would show
                encoded = encode_turns(
                    tokenizer, messages, spec.tools(), params.sft.max_len, context_window=window
                )
            for ex in encoded:
                if ex is None:
                    dropped += 1
                else:
                    examples.append(ex)
    if not examples:
        raise StageError(f"sft: no expert trajectory fits sft.max_len={params.sft.max_len}")
    return examples, dropped


def micro_batch_size(params: Params) -> int:
    """sft.micro_batch_size, made small enough that each of the deepspeed.world_size ranks gets one
    (batch 16, micro 16, 2 ranks: micro-batches of 8). The update does not depend on it."""
    return min(params.sft.micro_batch_size, -(-params.sft.batch_size // params.deepspeed.world_size))


def batches(examples: list, params: Params, pad_id: int) -> Iterator[list[dict]]:
    """Endless optimizer batches, each a list of collated micro-batches."""
    rng = random.Random(params.seed)
    s, micro = params.sft, micro_batch_size(params)
    order: list[int] = []
    while True:
        if len(order) < s.batch_size:
            order += rng.sample(range(len(examples)), len(examples))
        picked, order = order[: s.batch_size], order[s.batch_size :]
        yield [
            collate([examples[i] for i in picked[j : j + micro]], pad_id)
            for j in range(0, s.batch_size, micro)
        ]


def _train(params: Params, on_step=None, progress: bool = True) -> list[dict]:
    """SFT on this rank: the same model, examples and batches on every rank (``run_sft`` trains this
    rank's share of each batch); every rank joins the checkpoint's save, rank 0 writes it."""
    torch.manual_seed(params.seed)
    model, tokenizer = load_hf(BASE, dtype=torch.float32)
    examples, dropped = encode_examples(params, tokenizer)
    s = params.sft
    what = "demonstrations" if params.rollout.context_window is None else "labelled assistant turns"
    if progress:
        print(f"sft: {len(examples)} {what}, expert and weaker ({dropped} longer than sft.max_len dropped)")
    engine = build_engine(
        model,
        lr=s.lr,
        weight_decay=s.weight_decay,
        zero_stage=params.deepspeed.zero_stage,
        dtype=params.deepspeed.dtype,
        grad_clip=s.grad_clip,
        micro_batch_size=micro_batch_size(params),
        grad_accum_steps=max(1, s.batch_size // micro_batch_size(params) // params.deepspeed.world_size),
        warmup_steps=s.warmup_steps,
        total_steps=s.steps,
        lr_schedule=s.lr_schedule,
        decay_steps=s.decay_steps,
    )
    history = run_sft(
        engine,
        batches(examples, params, tokenizer.pad_token_id),
        steps=s.steps,
        on_step=on_step,
        progress=progress,
    )
    save_checkpoint(engine, OUT, tokenizer=tokenizer, metadata={"stage": "sft", "steps": s.steps})
    return history


def _worker(rank: int, params: Params, threads: int) -> None:
    """Rank ``rank`` >= 1 of a data-parallel SFT (deepspeed.world_size): no Prefect, no MLflow."""
    make_deterministic(params.seed, threads=threads)
    _train(params, progress=False)


@task(cache_policy=NO_CACHE)
def train(params: Params) -> list[dict]:
    import mlflow

    # Every step's metrics, written in batches: one sqlite transaction per step cost ~13 ms
    # (~20 s of 1,600 steps); one per LOG_BATCH metrics costs ~2 ms a step.
    run_id, pending = mlflow.active_run().info.run_id, []

    def flush() -> None:
        if pending:
            mlflow.MlflowClient().log_batch(run_id, metrics=pending)
            pending.clear()

    def on_step(step: int, metrics: dict) -> None:
        now = int(time.time() * 1000)
        pending.extend(mlflow.entities.Metric(f"sft/{k}", float(v), now, step) for k, v in metrics.items())
        if len(pending) >= LOG_BATCH:
            flush()

    world = params.deepspeed.world_size
    threads = share_threads(world)
    if world > 1:
        print(f"sft: {world} data-parallel ranks on {machines()} machine(s), {threads} torch thread(s) each")
    try:
        with local_world(world, _worker, (params, threads), summary=_summary(params)):
            return _train(params, on_step=on_step)
    finally:  # also what a failed run had logged
        flush()


@flow(name="sft", log_prints=True)
def sft_flow(params: Params) -> dict:
    window = {"rollout.context_window": params.rollout.context_window}
    with mlflow_run(params, "sft", ["deepspeed", "sft"], extra_params=window):
        import mlflow

        with timed("training"):  # model load, DeepSpeed engine, the SFT steps, the checkpoint
            history = train(params)
        final = {
            "loss": history[-1]["loss"],
            "steps": len(history),
            "skipped_steps": sum(h.get("skipped", 0) for h in history),
        }
        write_json(final, REPO / "metrics" / "sft.json")
        write_text(
            "step,loss\n" + "".join(f"{i},{h['loss']:.6f}\n" for i, h in enumerate(history, start=1)),
            REPO / "plots" / "sft_loss.csv",
        )
        png = line_chart(
            {"sft loss": (list(range(1, len(history) + 1)), [h["loss"] for h in history])},
            REPO / "plots" / "sft_loss.png",
            title="SFT loss (assistant tokens)",
            xlabel="step",
            ylabel="loss",
        )
        mlflow.log_artifacts(str(OUT), artifact_path="checkpoint")
        mlflow.log_artifact(str(png), artifact_path="plots")
    print(f"sft: final loss {final['loss']:.4f} after {final['steps']} steps -> {OUT}")
    return final


def _summary(params: Params) -> dict:
    """What every machine of a multi-machine SFT must run with (flows._nodes)."""
    inputs = {"models/base": BASE, "train split": processed(params.task) / "train.parquet"}
    return summary("sft", params, inputs)


def main(params: str) -> None:
    p = read_params(params)
    if not is_complete_checkpoint(BASE):
        raise StageError(f"sft: {BASE} is not a complete checkpoint (run the base_model stage first)")
    # models/base built for another rollout.tool_parser, or a model.path without a (tool) chat template
    check_template(BASE, p.rollout.tool_parser, tools=bool(get_task(p.task).tools()))
    check_gpu_memory(p, BASE, trained_models=1)
    check_world(p)
    launched = torchrun_follower()
    if launched is not None:  # a rank torchrun started beside rank 0: its share of each step only
        threads = share_threads(p.deepspeed.world_size)
        run_rank(launched, p.deepspeed.world_size, _worker, (p, threads), summary=_summary(p))
        return
    sft_flow(p)


if __name__ == "__main__":
    stage_main(main)
