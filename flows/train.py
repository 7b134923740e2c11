"""Stage `train@<algo>-<seed>`: RL from the SFT model with one algorithm and one RL seed.

`python -m flows.train --algo grpo --rl-seed 1` is the run named `grpo-s1` (CompareParams.run_name):
models/grpo-s1/final, runs/grpo-s1/, metrics/train_grpo-s1.json, plots/train_grpo-s1.{csv,png} and
the MLflow run `grpo-s1` (tags steprl.algo, steprl.rl_seed). The RL seed replaces params.seed for
everything this stage draws (prompt sampling, rollout sampling, update shuffles, engine seeds); the
SFT checkpoint it starts from is the same for every seed.

Each iteration runs the Prefect tasks rollout -> score -> advantage -> update -> sync. Tables go to
runs/<name>/iter_<k>/ (rollouts, scored, batch parquet); each task is cached on the content of what
it reads, and a finished iteration leaves a resumable checkpoint and a done marker. Rerunning after a
crash restores the engines from the last finished iteration and resumes at the first unfinished task;
MLflow gets each iteration's metrics exactly once (the run is resumed, missing steps are filled from
the iteration's metrics.json).

The stage ends by evaluating the final policy on the held-out split with the rollout engine it holds
(flows.evaluate.evaluate): metrics/eval_<run>.json, metrics/problems_<run>.parquet and ``eval/*`` in
the run. A change of the ``evaluate`` params reruns the stage, which finds every iteration done and
only evaluates again.
"""

from __future__ import annotations

import json
import random
import shutil
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from components.agent.loop import Episode, episode_metrics
from components.config import CompareParams, Params, protocol_name
from components.determinism import make_deterministic
from components.envs import get_task
from components.io import write_json, write_parquet, write_text
from components.marker import MARKER_FILE as MARKER
from components.model.tiny import is_complete_checkpoint, save_hf
from components.plots import line_chart
from components.schemas import StepSchema, validate_table
from components.train.advantage import compute_advantages
from components.train.collapse import collapse_metrics
from components.train.group_filter import fill_batch
from components.train.launch import local_world, share_threads
from components.train.lora import check_model_dir
from components.train.rank_mirror import Leader, follow
from components.train.rl_session import RLSession, prune
from components.train.torchrun import run_rank
from flows import REPO, processed
from flows._cache import content_key, file_digest, source_digest
from flows._gpu import check_gpu_memory
from flows._nodes import check_world, machines, summary, torchrun_follower
from flows._stage import (
    STAGE_PARTS,
    StageError,
    log_metrics_once,
    mlflow_run,
    process_age,
    read_params,
    stage_main,
    timed,
)
from flows._trajectories import render_samples
from flows.evaluate import evaluate
from flows.train_metrics import anchor_metrics, iteration_metrics
from flows.train_settings import (
    actor_settings,
    critic_settings,
    group_filter,
    kl_term,
    resolved,
    session_config,
    warm_critic,
)

SFT = REPO / "models" / "sft"
KEEP_CHECKPOINTS = 2
# Engines (vLLM, DeepSpeed) live in the flow's process: a task receives the run's session as its
# ``session`` argument, which its cache key ignores (it is no input of the result).
Session = RLSession | Leader


def algo_params(params: Params, algo: str, rl_seed: int) -> dict:
    """The MLflow params of a train run's algorithm under keys every algorithm shares (``algo.lr``,
    not ``algorithms.grpo.lr``), so runs of different algorithms line up in MLflow's Compare view:
    its block of params.yaml with the preset's parts filled in (and ``dynamic_sampling`` as the run
    does it, its own or train's), whether it trains a critic, its RL seed."""
    block = {
        **params.algorithms[algo].model_dump(),
        **resolved(params, algo),
        "dynamic_sampling": params.dynamic_sampling(algo),
    }
    return {"algo.name": algo, **{f"algo.{k}": v for k, v in block.items()}, "algo.rl_seed": rl_seed}


def rl_prompts(train: pl.DataFrame, params: Params) -> pl.DataFrame:
    """The train rows RL samples prompts from: those after the first ``sft.rows`` (all if None)."""
    return train.slice(params.sft.rows or 0)


def run_dir(name: str) -> Path:
    return REPO / "runs" / name


def iter_dir(name: str, k: int) -> Path:
    return run_dir(name) / f"iter_{k:04d}"


def fingerprint(
    params: Params, algo: str, sft: Path = SFT, train_split: Path | None = None, critic: Path | None = None
) -> dict:
    """What a run's iterations depend on: a different fingerprint starts the run afresh.
    ``params.seed`` is the run's RL seed here. The SFT checkpoint, the train split and the fitted
    critic it starts from (critic-based algorithms with the critic_warmup stage on) enter by the hash
    of their bytes: a new SFT model or new data (e.g. ``dvc exp run -S seed=1`` in a workspace that
    ran seed 0) must never resume the old run's iterations."""
    split = train_split or processed(params.task) / "train.parquet"
    critic = critic if resolved(params, algo)["critic"] is not None else None
    return {
        "critic_sha256": file_digest(critic) if critic is not None else None,
        "algo": _algo_fingerprint(params, algo),
        "train": params.train.model_dump(
            exclude={"iterations", "val_every", "val_samples", "val_temperatures"}
        ),
        "rollout": params.rollout.model_dump(),
        "deepspeed": params.deepspeed.model_dump(),
        "seed": params.seed,
        "task": params.task,
        # the task's own settings: its environment's rewards and prompt (e.g. sokoban's noop_penalty)
        "task_settings": params.task_params.model_dump(),
        "rl_prompts_after_row": params.sft.rows,
        "sft": json.loads((sft / MARKER).read_text()),
        "sft_sha256": file_digest(sft),
        "train_split_sha256": file_digest(split),
        # only when on, so a run without LoRA keeps the fingerprint it had before model.lora existed
        **({"lora": params.model.lora.model_dump()} if params.model.lora.enabled else {}),
    }


def _algo_fingerprint(params: Params, algo: str) -> dict:
    """The algorithm's block, without the off-policy correction's keys when it has none, so a run
    without a correction keeps the fingerprint it had before algorithms.<name>.correction existed."""
    block = params.algorithms[algo].model_dump()
    if block["correction"] == "none":
        del block["correction"], block["correction_cap"]
    return block


def prompts_per_iteration(params: Params, algo: str) -> int:
    """The prompts an iteration's batch needs: trajectories_per_iteration / samples_per_prompt."""
    return max(params.train.trajectories_per_iteration // params.algorithms[algo].samples_per_prompt, 1)


def prompt_pool_note(params: Params, algo: str, pool: int) -> str | None:
    """What the RL prompt pool (``pool`` rows: the train split after sft.rows) cuts short, if
    anything: each iteration samples its prompts from it without replacement, so a batch (or dynamic
    sampling's further rounds) never holds more than ``pool`` prompts."""
    need = prompts_per_iteration(params, algo)
    spp = params.algorithms[algo].samples_per_prompt
    if need > pool:
        return (
            f"train.trajectories_per_iteration={params.train.trajectories_per_iteration} asks for {need} "
            f"prompts per iteration (algorithms.{algo}.samples_per_prompt={spp}) but the RL prompt pool "
            f"(the train split after sft.rows) holds {pool}: each iteration plays {pool} prompts, "
            f"{pool * spp} trajectories"
        )
    bound = group_filter(params, algo).bound(need)
    if bound > pool:
        return (
            f"{params.group_filter_key(algo)} may sample up to {bound} prompt groups per "
            f"iteration, the RL prompt pool holds {pool}: an iteration stops sampling at {pool}"
        )
    return None


# --- tasks ---------------------------------------------------------------------------------------
@task(cache_key_fn=content_key("policy", "train_split", ignore=("session",)), persist_result=True)
def rollout(
    session: Session, algo: str, name: str, k: int, policy: str, train_split: str, params: Params, run: str
) -> dict:
    """Sample this iteration's prompts (each samples_per_prompt times), play them to the end and keep
    the groups train.std_filter_keep / dynamic_sampling pick (all of them by default): rollouts.parquet
    holds the kept groups, sampled.parquet every played one (only when a filter is on). Returns the
    table's path and the iteration's ``filter/*`` and ``collapse/*`` metrics (of every played group)."""
    spec = get_task(params.task)
    a, t, r = params.algorithms[algo], params.train, params.rollout
    need = prompts_per_iteration(params, algo)
    rule = group_filter(params, algo)
    rows = rl_prompts(pl.read_parquet(train_split), params).to_dicts()
    stream = random.Random(params.seed * 100_003 + k).sample(rows, min(rule.bound(need), len(rows)))

    def play(start: int, count: int) -> list[dict]:
        episodes = [
            Episode(
                f"{k}-{row['id']}-{j}",
                f"{k}-{row['id']}",
                spec.make_env(
                    row,
                    malformed_penalty=t.malformed_penalty,
                    data_dir=processed(params.task),
                    tool_parser=params.rollout.tool_parser,
                ),
                row,
            )
            for row in stream[start : start + count]
            for j in range(a.samples_per_prompt)
        ]
        return session.play(
            episodes,
            **r.episode_limits(),
            temperature=t.temperature,
            seed=params.seed * 7919 + k,
            desc=f"{name} rollout {k}" + (f" ({start}+)" if start else ""),
        )

    played: list[dict] = []

    def record(start: int, count: int) -> list[dict]:
        steps = play(start, count)
        played.extend(steps)
        return steps

    kept, metrics = fill_batch(record, need, rule)
    metrics.update(collapse_metrics(played))
    where = f"{name} iteration {k}"
    if rule.active:
        table = validate_table(pl.DataFrame(played), StepSchema, f"{where} sampled rollouts")
        write_parquet(table, iter_dir(name, k) / "sampled.parquet")
    df = validate_table(pl.DataFrame(kept), StepSchema, f"{where} rollouts")
    return {"rollouts": str(write_parquet(df, iter_dir(name, k) / "rollouts.parquet")), "metrics": metrics}


@task(cache_key_fn=content_key("rollouts"), persist_result=True)
def score(name: str, k: int, rollouts: str, run: str) -> str:
    """Trajectory returns and outcomes next to the step rewards the environment gave."""
    df = pl.read_parquet(rollouts)
    df = df.with_columns(
        traj_return=pl.col("reward").sum().over("traj_id"),
        traj_correct=pl.col("correct").any().over("traj_id"),
        num_steps=pl.len().over("traj_id"),
    )
    return str(write_parquet(df, iter_dir(name, k) / "scored.parquet"))


@task(cache_key_fn=content_key("scored", "policy", ignore=("session",)), persist_result=True)
def advantage(
    session: Session, algo: str, name: str, k: int, scored: str, policy: str, params: Params, run: str
) -> str:
    """Old/reference log-probs and critic values, then the estimator: batch.parquet."""
    t, parts = params.train, resolved(params, algo)
    rows = session.annotate(pl.read_parquet(scored).to_dicts(), temperature=t.temperature)
    rows = compute_advantages(
        rows,
        estimator=parts["estimator"],
        gamma=t.gamma,
        lam=t.lam,
        kl=kl_term(params),
        step_weight=params.algorithms[algo].step_weight,
        step_norm=params.algorithms[algo].step_norm,
        process_weight=t.process_reward_weight,
    )
    return str(
        write_parquet(pl.DataFrame(rows, infer_schema_length=None), iter_dir(name, k) / "batch.parquet")
    )


@task(cache_key_fn=content_key("batch", "policy", ignore=("session",)), persist_result=True)
def update(
    session: Session, algo: str, name: str, k: int, batch: str, policy: str, params: Params, run: str
) -> dict:
    """Actor (and critic) PPO epochs on batch.parquet; saves the iteration's resumable checkpoint. The
    actor stays frozen for the first train.critic_warmup iterations."""
    metrics = session.update(
        pl.read_parquet(batch).to_dicts(),
        actor=actor_settings(params, algo) if k >= params.train.critic_warmup else None,
        critic=critic_settings(params),
        seed=params.seed * 31 + k,
    )
    ckpt = session.save(
        iter_dir(name, k) / "checkpoint", metadata={"iteration": k, "algo": algo, "rl_seed": params.seed}
    )
    return {"checkpoint": ckpt, "metrics": metrics}


@task(cache_policy=NO_CACHE)
def sync(session: Session) -> None:
    session.sync()


@task(cache_policy=NO_CACHE)
def validate(session: Session, name: str, k: int, params: Params, seed: int) -> dict:
    """Validation of the policy after iteration ``k`` (-1: the SFT policy) on the first
    ``train.val_samples`` val rows: one greedy episode per row, and one per row sampled at each of
    ``train.val_temperatures`` (sampling seed ``seed``: the SFT seed, the same for every run). Its
    metrics: ``val/<key>`` and ``val/greedy/<key>`` of the greedy episodes, ``val/t<T>/<key>`` of those
    sampled at T (episode metrics and the task's own, e.g. sokoban's success and loop rates)."""
    spec = get_task(params.task)
    r = params.rollout
    data_dir = processed(params.task)
    rows = pl.read_parquet(data_dir / "val.parquet").head(params.train.val_samples).to_dicts()
    out = {}
    for temperature in [None, *params.train.val_temperatures]:
        protocol = protocol_name(temperature)
        episodes = [
            Episode(
                f"val-{row['id']}",
                f"val-{row['id']}",
                spec.make_env(row, data_dir=data_dir, tool_parser=r.tool_parser),
                row,
            )
            for row in rows
        ]
        steps = session.play(
            episodes,
            **r.episode_limits(),
            temperature=0.0 if temperature is None else temperature,
            seed=seed,
            desc=f"{name} validate {k} ({protocol})",
        )
        metrics = {**episode_metrics(steps), **spec.task_metrics(steps)}  # the task's own (recipe hook)
        metrics.pop("n_episodes")
        out |= {f"val/{protocol}/{key}": v for key, v in metrics.items()}
        if temperature is None:  # the keys of the greedy validation before protocols
            out |= {f"val/{key}": v for key, v in metrics.items()}
    return out


@task(cache_key_fn=content_key("sft", "val_split", ignore=("session", "name", "params")), persist_result=True)
def validate_sft(
    session: Session, name: str, params: Params, sft: str, val_split: str, depends_on: dict
) -> dict:
    """:func:`validate` of the SFT policy (iteration -1): the same for every run from one SFT
    checkpoint, so the first run of a pipeline plays it and the others read it from the Prefect
    cache, keyed on the checkpoint's and the val split's bytes and ``depends_on`` (the settings, the
    sampling seed and the code it depends on; not the RL seed: validation samples with the SFT seed)."""
    return validate.fn(session, name, -1, params, depends_on["val_seed"])


def _sft_val_depends_on(params: Params, val_seed: int) -> dict:
    return {
        "code": source_digest(REPO / "components", REPO / "flows"),
        "task": params.task,
        "plugins": params.plugins,
        "tasks": params.tasks,
        "rollout": params.rollout.model_dump(),
        "val_samples": params.train.val_samples,
        "val_temperatures": params.train.val_temperatures,
        "val_seed": val_seed,
    }


# --- the flow ------------------------------------------------------------------------------------
def _open_session(params: Params, algo: str, *, rollout: bool = True) -> RLSession:
    """The run's session (flows.train_settings.session_config), critic from the critic_warmup stage's
    fit when there is one; ``rollout=False`` (a follower rank of a data-parallel world) has no rollout
    engine. With deepspeed.world_size > 1 vLLM runs in a process of its own (rank_mirror)."""
    cfg = session_config(params, algo, rollout=rollout, critic=warm_critic())
    return RLSession(SFT, cfg, get_task(params.task).tools())


def _follower(rank: int, params: Params, algo: str, threads: int) -> None:
    """Rank ``rank`` >= 1 of a data-parallel RL run: rank 0's engine calls on a session of its own."""
    make_deterministic(params.seed, threads=threads)
    session = _open_session(params, algo, rollout=False)
    try:
        follow(session)
    finally:
        session.close()


def _prepare_run_dir(params: Params, algo: str, name: str) -> str:
    """The run directory, wiped when what its iterations depend on changed; returns the run's id.

    The id scopes the Prefect cache to this run directory: a fresh run never reuses a cached result
    whose files were deleted with an earlier run directory."""
    d, fp = run_dir(name), json.loads(json.dumps(fingerprint(params, algo, critic=warm_critic())))
    stamp = d / "fingerprint.json"
    if d.exists() and (not stamp.is_file() or json.loads(stamp.read_text()).get("depends_on") != fp):
        print(f"{name}: params or SFT model changed since {d} was written: starting afresh")
        shutil.rmtree(d)
    d.mkdir(parents=True, exist_ok=True)
    if not stamp.is_file():
        write_json({"run_id": uuid.uuid4().hex, "depends_on": fp}, stamp)
    return json.loads(stamp.read_text())["run_id"]


def _finished(name: str, k: int) -> bool:
    return (iter_dir(name, k) / "done.json").is_file()


@flow(name="train", log_prints=True)
def train_flow(params: Params, algo: str, rl_seed: int) -> dict:
    """RL run ``algo`` with RL seed ``rl_seed``: ``params.seed`` is the seed of the SFT model it starts
    from; everything the run draws uses ``rl_seed`` instead. With deepspeed.world_size N > 1 this process
    is rank 0 of N local ranks that share every update (components.train.rank_mirror)."""
    sft_seed, params = params.seed, params.model_copy(update={"seed": rl_seed})
    name = CompareParams.run_name(algo, rl_seed)
    run = _prepare_run_dir(params, algo, name)
    world = params.deepspeed.world_size
    threads = share_threads(world)
    if world > 1:
        print(
            f"{name}: {world} data-parallel ranks on {machines()} machine(s), {threads} torch thread(s) each"
        )
    pool = rl_prompts(pl.read_parquet(processed(params.task) / "train.parquet"), params).height
    note = prompt_pool_note(params, algo, pool)
    if note is not None:
        print(f"{name}: {note}")
    agreed = _summary(params, algo)
    with local_world(world, _follower, (params, algo, threads), summary=agreed):  # rank 0
        return _run(params, algo, rl_seed, sft_seed, name, run)


def _summary(params: Params, algo: str) -> dict:
    """What every machine of a multi-machine run must run with (flows._nodes); ``params.seed`` is
    the RL seed here."""
    inputs = {"models/sft": SFT, "train split": processed(params.task) / "train.parquet"}
    if warm_critic() is not None:
        inputs["models/critic"] = warm_critic()
    return summary("train", params, inputs, algo=algo)


def _run(params: Params, algo: str, rl_seed: int, sft_seed: int, name: str, run: str) -> dict:
    import mlflow

    t, parts = params.train, {"process_start": process_age()}
    with timed("session_start", parts):
        session: Session = _open_session(params, algo)
    if params.deepspeed.world_size > 1:
        session = Leader(session)
    done = [k for k in range(t.iterations) if _finished(name, k)]
    last = max(done, default=-1)
    if last >= 0:
        print(f"{name}: resuming after iteration {last}")
        session.restore(iter_dir(name, last) / "checkpoint")
    run_file = run_dir(name) / "mlflow_run.json"
    run_id = json.loads(run_file.read_text())["run_id"] if run_file.is_file() else None
    try:
        with train_mlflow_run(params, algo, rl_seed, sft_seed, run_id) as active:
            write_json({"run_id": active.info.run_id}, run_file)
            history_of = mlflow.tracking.MlflowClient().get_metric_history
            logged = {m.step for m in history_of(active.info.run_id, "timing_s/iteration")}
            with timed("initial_validation", parts):
                initial = _initial_validation(session, params, name, sft_seed, resumed=last >= 0)
            history = [] if initial is None else [{"iteration": -1, **initial}]
            if initial is not None:  # the SFT policy: step -1 of the val curves, once across resumes
                log_metrics_once(initial, step=-1)
            with timed("iterations", parts):
                for k in range(t.iterations):
                    if _finished(name, k):
                        metrics = json.loads((iter_dir(name, k) / "metrics.json").read_text())
                    else:
                        metrics = _iteration(session, params, algo, name, k, run, sft_seed)
                    if k not in logged:  # exactly once per iteration, even across crashes
                        mlflow.log_metrics(metrics, step=k)
                        samples = iter_dir(name, k) / "samples.md"
                        if samples.is_file():
                            mlflow.log_artifact(str(samples), artifact_path=f"samples/iter_{k:04d}")
                    history.append({"iteration": k, **metrics})
            with timed("save", parts):
                _save_final(session, params, algo, name, history)
                mlflow.log_artifacts(str(REPO / "models" / name / "final"), artifact_path="checkpoint")
            with timed("final_evaluation", parts):
                # params.seed is the global seed again: every model's sampled test episodes use the same seed
                evaluate(
                    params.model_copy(update={"seed": sft_seed}),
                    name,
                    session.rollout_engine,
                    session.renderer,
                )
            summary = _finish(params, algo, name, history, parts)
            mlflow.log_artifact(str(REPO / "plots" / f"train_{name}.png"), artifact_path="plots")
            mlflow.log_metrics({f"stage_s/{k}": v for k, v in parts.items()})
        # the stage's timing record (flows._stage) holds these parts, not the evaluation's own
        STAGE_PARTS.clear()
        STAGE_PARTS.update({k: v for k, v in parts.items() if k != "process_start"})
    finally:
        session.close()
    return summary


def train_mlflow_run(params: Params, algo: str, rl_seed: int, sft_seed: int, run_id: str | None):
    """The run's MLflow run: the shared sections train, rollout, evaluate and the task's own
    (``tasks.<task>.*``: a sweep of a task setting, e.g. sokoban's remedies, shows it) as they are,
    ``seed`` (the RL seed: ``params.seed`` is already replaced here; the SFT model's seed is the tag
    ``steprl.sft_seed``) and this algorithm's parts under ``algo.*`` (:func:`algo_params`); no other
    algorithm's block."""
    return mlflow_run(
        params,
        CompareParams.run_name(algo, rl_seed),
        ["train", "rollout", "evaluate", f"tasks.{params.task}"]
        + (["model.lora"] if params.model.lora.enabled else []),
        run_id=run_id,
        tags={"steprl.algo": algo, "steprl.rl_seed": str(rl_seed), "steprl.sft_seed": str(sft_seed)},
        extra_params=algo_params(params, algo, rl_seed),
    )


def _initial_validation(
    session: Session, params: Params, name: str, val_seed: int, resumed: bool
) -> dict | None:
    """Validation metrics of the starting (SFT) policy (:func:`validate`): the curves' point at
    iteration -1, computed once before the first update (None for a run resumed from a directory that
    lacks it)."""
    path = run_dir(name) / "val_initial.json"
    if not path.is_file():
        if resumed:
            return None
        val_split = processed(params.task) / "val.parquet"
        depends_on = _sft_val_depends_on(params, val_seed)
        write_json(validate_sft(session, name, params, str(SFT), str(val_split), depends_on), path)
    return json.loads(path.read_text())


def _iteration(
    session: Session, params: Params, algo: str, name: str, k: int, run: str, val_seed: int
) -> dict:
    """Iteration ``k`` of the run (rollout -> score -> advantage -> update -> sync, then validation
    with sampling seed ``val_seed`` when due); its metrics."""
    t = params.train
    policy = Path(session.version)
    policy_marker = str(policy / MARKER) if (policy / MARKER).is_file() else str(policy / "actor" / MARKER)
    timing = {}
    t0 = time.perf_counter()
    train_split = str(processed(params.task) / "train.parquet")
    played = rollout(session, algo, name, k, policy_marker, train_split, params, run)
    rollouts = played["rollouts"]
    timing["rollout"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    scored = score(name, k, rollouts, run)
    timing["score"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    batch = advantage(session, algo, name, k, scored, policy_marker, params, run)
    timing["advantage"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    out = update(session, algo, name, k, batch, policy_marker, params, run)
    timing["update"] = time.perf_counter() - t1
    if session.version != out["checkpoint"]:  # a cached update: the engines must hold its result
        session.restore(out["checkpoint"])
    t1 = time.perf_counter()
    sync(session)
    timing["sync"] = time.perf_counter() - t1
    batch_df = pl.read_parquet(batch)
    metrics = iteration_metrics(batch_df, out["metrics"])
    metrics.update(played["metrics"])  # filter/* and collapse/* of every played group
    metrics.update(anchor_metrics(batch_df, resolved(params, algo)["estimator"]))  # gigpo/* (gigpo only)
    task_metrics = get_task(params.task).task_metrics(pl.read_parquet(rollouts).to_dicts())
    metrics.update({f"task/{key}": v for key, v in task_metrics.items()})  # the task's own (recipe hook)
    last = k == t.iterations - 1
    if (k + 1) % t.val_every == 0 or last:
        t1 = time.perf_counter()
        metrics.update(validate(session, name, k, params, val_seed))
        timing["validation"] = time.perf_counter() - t1
    timing["iteration"] = time.perf_counter() - t0
    metrics.update({f"timing_s/{key}": v for key, v in timing.items()})
    metrics["perf/tokens_per_s"] = metrics["perf/generated_tokens"] / max(timing["rollout"], 1e-9)
    d = iter_dir(name, k)
    steps = pl.read_parquet(rollouts).to_dicts()
    write_text(render_samples(steps, limit=8, tokenizer=session.tokenizer), d / "samples.md")
    write_json(metrics, d / "metrics.json")
    write_json({"iteration": k}, d / "done.json")
    finished = sorted(p for p in run_dir(name).glob("iter_*") if (p / "done.json").is_file())
    prune(finished, KEEP_CHECKPOINTS, lambda p: p / "checkpoint")
    print(
        f"{name} iteration {k}: score {metrics['critic/score/mean']:.3f}"
        + (f", val accuracy {metrics['val/accuracy']:.3f}" if "val/accuracy" in metrics else "")
        + f", {timing['iteration']:.1f}s"
    )
    return metrics


def _save_final(session: Session, params: Params, algo: str, name: str, history: list[dict]) -> None:
    iterations = sum(h["iteration"] >= 0 for h in history)
    save_hf(  # a plain HF model: with LoRA the adapters merged into the weights
        session.final_model(),
        session.tokenizer,
        REPO / "models" / name / "final",
        metadata={"algo": algo, "rl_seed": params.seed, "iterations": iterations},
    )


# Columns of plots/train_<run>.csv: the curves compare.py draws and the per-iteration series it reads
# a run's collapse signs and critic from (empty where an iteration has no value); after them one
# val_<protocol>_accuracy column per sampled validation protocol (train.val_temperatures: val_t0.4_accuracy).
CURVE_COLUMNS = {
    "val_accuracy": "val/accuracy",
    "score_mean": "critic/score/mean",
    "train_accuracy": "train/accuracy",
    "group_reward_std": "collapse/group_reward_std",
    "reward_std": "collapse/reward_std",
    "entropy": "collapse/entropy",
    "distinct_actions": "collapse/distinct_actions",
    "vf_explained_var": "critic/vf_explained_var",
    "vf_explained_var_low": "critic/vf_explained_var_low",
    "vf_explained_var_high": "critic/vf_explained_var_high",
}


def curve_csv(rows: list[dict], val_temperatures: Sequence[float] = ()) -> str:
    """plots/train_<run>.csv: one line per iteration (-1: the SFT policy's validation)."""
    columns = CURVE_COLUMNS | {
        f"val_{protocol_name(t)}_accuracy": f"val/{protocol_name(t)}/accuracy" for t in val_temperatures
    }
    lines = ["iteration," + ",".join(columns)]
    for h in rows:
        lines.append(",".join([str(h["iteration"]), *(str(h.get(key, "")) for key in columns.values())]))
    return "\n".join(lines) + "\n"


def _finish(params: Params, algo: str, name: str, history: list[dict], parts: dict[str, float]) -> dict:
    val = [h for h in history if "val/accuracy" in h]  # from iteration -1 (the SFT policy) on
    history = [h for h in history if h["iteration"] >= 0]
    summary = {
        "algo": algo,
        "rl_seed": params.seed,
        "run": name,
        "iterations": len(history),
        "final_val_accuracy": val[-1]["val/accuracy"] if val else None,
        "generated_tokens": sum(h["perf/generated_tokens"] for h in history),
        "train_wall_time_s": sum(h["timing_s/iteration"] for h in history),
        "this_run_wall_time_s": sum(v for k, v in parts.items() if k != "process_start"),
        # where the stage's time went: process start (imports, Prefect, params), engine builds, SFT
        # validation, the iterations (their parts summed below), the final checkpoint, the test split
        "stage_s": {k: round(v, 2) for k, v in parts.items()},
        "iterations_s": {
            part: round(sum(h.get(f"timing_s/{part}", 0.0) for h in history), 2)
            for part in ("rollout", "score", "advantage", "update", "sync", "validation")
        },
    }
    write_json(summary, REPO / "metrics" / f"train_{name}.json")
    write_text(
        curve_csv([h for h in val if h["iteration"] < 0] + history, params.train.val_temperatures),
        REPO / "plots" / f"train_{name}.csv",
    )
    line_chart(
        {
            "val accuracy": ([h["iteration"] for h in val], [h["val/accuracy"] for h in val]),
            "train score": ([h["iteration"] for h in history], [h["critic/score/mean"] for h in history]),
        },
        REPO / "plots" / f"train_{name}.png",
        title=f"{name} on {params.task}",
        xlabel="iteration",
        ylabel="accuracy / score",
    )
    return summary


def main(params: str, algo: str, rl_seed: int) -> None:
    p = read_params(params)
    if algo not in p.algorithms:
        raise StageError(f"--algo {algo!r} is not a key of algorithms (known: {sorted(p.algorithms)})")
    if rl_seed < 0:
        raise StageError(f"--rl-seed {rl_seed}: an RL seed must be >= 0 (compare.seeds: {p.compare.seeds})")
    if not is_complete_checkpoint(SFT):
        raise StageError(f"train: {SFT} is not a complete checkpoint (run the sft stage first)")
    train_rows = pl.scan_parquet(processed(p.task) / "train.parquet").select(pl.len()).collect().item()
    if p.sft.rows is not None and p.sft.rows >= train_rows:
        raise StageError(
            f"sft.rows={p.sft.rows} leaves no RL prompts: the train split has {train_rows} rows "
            "(lower sft.rows, or give the train split more rows)"
        )
    # names and cross-field rules (e.g. group estimators need samples_per_prompt >= 2) were checked at load,
    # for the algorithms of compare.algorithms; one run by hand is checked here
    if group_filter(p, algo).active and p.algorithms[algo].samples_per_prompt < 2:
        raise StageError(
            f"--algo {algo}: {p.group_filter_key(algo)} picks prompt groups, but "
            f"algorithms.{algo}.samples_per_prompt=1"
        )
    if p.model.lora.enabled:
        try:
            check_model_dir(SFT, p.model.lora.target_modules)
        except ValueError as err:
            raise StageError(f"train: {err}") from None
    critic = resolved(p, algo)["critic"] is not None
    check_gpu_memory(
        p,
        SFT,
        trained_models=1 + critic,
        reference=p.train.kl_coef > 0,
        rollout=True,
        lora=p.model.lora.enabled,
    )
    check_world(p)
    launched = torchrun_follower()
    if launched is not None:  # a rank torchrun started beside rank 0: follows rank 0's engine calls
        p = p.model_copy(update={"seed": rl_seed})
        threads = share_threads(p.deepspeed.world_size)
        run_rank(launched, p.deepspeed.world_size, _follower, (p, algo, threads), summary=_summary(p, algo))
        return
    train_flow(p, algo, rl_seed)


if __name__ == "__main__":
    stage_main(
        main,
        ("--algo", {"required": True, "help": "a key of params.yaml: algorithms"}),
        (
            "--rl-seed",
            {
                "required": True,
                "type": int,
                "dest": "rl_seed",
                "help": "RL seed (e.g. one of compare.seeds); replaces `seed` for everything RL draws",
            },
        ),
    )
