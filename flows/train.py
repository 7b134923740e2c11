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
from pathlib import Path

import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from components.agent.loop import Episode, episode_metrics
from components.config import CompareParams, Params
from components.determinism import make_deterministic
from components.envs import get_task
from components.io import write_json, write_parquet, write_text
from components.marker import MARKER_FILE as MARKER
from components.model.tiny import is_complete_checkpoint, save_hf
from components.plots import line_chart
from components.schemas import StepSchema, validate_table
from components.train.advantage import compute_advantages
from components.train.launch import local_world, share_threads
from components.train.rank_mirror import Leader, follow
from components.train.rl_session import RLSession, SessionConfig, prune
from flows import REPO, processed
from flows._cache import content_key, file_digest, source_digest
from flows._gpu import check_gpu_memory
from flows._stage import StageError, mlflow_run, read_params, stage_main
from flows._trajectories import render_samples
from flows.evaluate import evaluate
from flows.train_metrics import anchor_metrics, iteration_metrics

SFT = REPO / "models" / "sft"
KEEP_CHECKPOINTS = 2
# By run name: engines live in the flow process, never as task inputs.
_SESSION: dict[str, RLSession | Leader] = {}


def resolved(params: Params, algo: str) -> dict:
    """The algorithm's parts: its preset with every non-null override applied (AlgoParams.parts)."""
    return params.algorithms[algo].parts()


def algo_params(params: Params, algo: str, rl_seed: int) -> dict:
    """The MLflow params of a train run's algorithm under keys every algorithm shares (``algo.lr``,
    not ``algorithms.grpo.lr``), so runs of different algorithms line up in MLflow's Compare view:
    its block of params.yaml with the preset's parts filled in, whether it trains a critic, its RL seed."""
    block = {**params.algorithms[algo].model_dump(), **resolved(params, algo)}
    return {"algo.name": algo, **{f"algo.{k}": v for k, v in block.items()}, "algo.rl_seed": rl_seed}


def rl_prompts(train: pl.DataFrame, params: Params) -> pl.DataFrame:
    """The train rows RL samples prompts from: those after the first ``sft.rows`` (all if None)."""
    return train.slice(params.sft.rows or 0)


def run_dir(name: str) -> Path:
    return REPO / "runs" / name


def iter_dir(name: str, k: int) -> Path:
    return run_dir(name) / f"iter_{k:04d}"


def fingerprint(params: Params, algo: str, sft: Path = SFT, train_split: Path | None = None) -> dict:
    """What a run's iterations depend on: a different fingerprint starts the run afresh.
    ``params.seed`` is the run's RL seed here. The SFT checkpoint and the train split enter by the
    hash of their bytes: a new SFT model or new data (e.g. ``dvc exp run -S seed=1`` in a workspace
    that ran seed 0) must never resume the old run's iterations."""
    split = train_split or processed(params.task) / "train.parquet"
    return {
        "algo": params.algorithms[algo].model_dump(),
        "train": params.train.model_dump(exclude={"iterations", "val_every", "val_samples"}),
        "rollout": params.rollout.model_dump(),
        "deepspeed": params.deepspeed.model_dump(),
        "seed": params.seed,
        "task": params.task,
        "rl_prompts_after_row": params.sft.rows,
        "sft": json.loads((sft / MARKER).read_text()),
        "sft_sha256": file_digest(sft),
        "train_split_sha256": file_digest(split),
    }


# --- tasks -------------------------------------------------------------------------------------
@task(cache_key_fn=content_key("policy", "train_split"), persist_result=True)
def rollout(algo: str, name: str, k: int, policy: str, train_split: str, params: Params, run: str) -> str:
    """Sample this iteration's prompts (each samples_per_prompt times) and play them to the end."""
    spec = get_task(params.task)
    a, t, r = params.algorithms[algo], params.train, params.rollout
    n_prompts = max(t.trajectories_per_iteration // a.samples_per_prompt, 1)
    rows = rl_prompts(pl.read_parquet(train_split), params).to_dicts()
    picked = random.Random(params.seed * 100_003 + k).sample(rows, min(n_prompts, len(rows)))
    episodes = [
        Episode(
            f"{k}-{row['id']}-{j}",
            f"{k}-{row['id']}",
            spec.make_env(row, malformed_penalty=t.malformed_penalty, data_dir=processed(params.task)),
            row,
        )
        for row in picked
        for j in range(a.samples_per_prompt)
    ]
    steps = _SESSION[name].play(
        episodes,
        max_steps=r.max_steps,
        max_prompt_len=r.max_prompt_len,
        max_response_len=r.max_response_len,
        context_window=r.context_window,
        temperature=t.temperature,
        seed=params.seed * 7919 + k,
        desc=f"{name} rollout {k}",
    )
    df = validate_table(pl.DataFrame(steps), StepSchema, f"{name} iteration {k} rollouts")
    return str(write_parquet(df, iter_dir(name, k) / "rollouts.parquet"))


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


@task(cache_key_fn=content_key("scored", "policy"), persist_result=True)
def advantage(algo: str, name: str, k: int, scored: str, policy: str, params: Params, run: str) -> str:
    """Old/reference log-probs and critic values, then the estimator: batch.parquet."""
    t, parts = params.train, resolved(params, algo)
    rows = _SESSION[name].annotate(pl.read_parquet(scored).to_dicts(), temperature=t.temperature)
    rows = compute_advantages(
        rows,
        estimator=parts["estimator"],
        gamma=t.gamma,
        lam=t.lam,
        kl_coef=t.kl_coef,
        kl_kind=t.kl_kind,
        kl_in_reward=t.kl_in_reward,
        step_weight=params.algorithms[algo].step_weight,
        step_norm=params.algorithms[algo].step_norm,
        process_weight=t.process_reward_weight,
    )
    return str(
        write_parquet(pl.DataFrame(rows, infer_schema_length=None), iter_dir(name, k) / "batch.parquet")
    )


@task(cache_key_fn=content_key("batch", "policy"), persist_result=True)
def update(algo: str, name: str, k: int, batch: str, policy: str, params: Params, run: str) -> dict:
    """Actor (and critic) PPO epochs on batch.parquet; saves the iteration's resumable checkpoint."""
    t, a, parts = params.train, params.algorithms[algo], resolved(params, algo)
    rows = pl.read_parquet(batch).to_dicts()
    common = dict(
        epochs=t.ppo_epochs,
        mini_batch_size=t.mini_batch_size,
        micro_batch_size=t.micro_batch_size,
        seed=params.seed * 31 + k,
    )
    metrics = _SESSION[name].update(
        rows,
        train_actor=k >= t.critic_warmup,
        actor_kw=dict(
            policy_loss=parts["policy_loss"],
            loss_agg=parts["loss_agg"],
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            clip_ratio_c=a.clip_ratio_c,
            kl_coef=0.0 if t.kl_in_reward else t.kl_coef,
            kl_kind=t.kl_kind,
            entropy_coef=t.entropy_coef,
            norm_const=float(params.rollout.max_response_len),
            temperature=t.temperature,
            **common,
        ),
        critic_kw=dict(
            common, value_clip=t.value_clip, mini_batch_size=t.critic_mini_batch_size or t.mini_batch_size
        ),
    )
    ckpt = _SESSION[name].save(
        iter_dir(name, k) / "checkpoint", metadata={"iteration": k, "algo": algo, "rl_seed": params.seed}
    )
    return {"checkpoint": ckpt, "metrics": metrics}


@task(cache_policy=NO_CACHE)
def sync(name: str) -> None:
    _SESSION[name].sync()


@task(cache_policy=NO_CACHE)
def validate(name: str, k: int, params: Params) -> dict:
    spec = get_task(params.task)
    r = params.rollout
    data_dir = processed(params.task)
    rows = pl.read_parquet(data_dir / "val.parquet").head(params.train.val_samples).to_dicts()
    episodes = [
        Episode(f"val-{row['id']}", f"val-{row['id']}", spec.make_env(row, data_dir=data_dir), row)
        for row in rows
    ]
    steps = _SESSION[name].play(
        episodes,
        max_steps=r.max_steps,
        max_prompt_len=r.max_prompt_len,
        max_response_len=r.max_response_len,
        context_window=r.context_window,
        temperature=0.0,
        seed=params.seed,
        desc=f"{name} validate {k}",
    )
    metrics = {**episode_metrics(steps), **spec.task_metrics(steps)}  # the task's own (recipe hook)
    return {f"val/{key}": v for key, v in metrics.items() if key != "n_episodes"}


@task(cache_key_fn=content_key("sft", "val_split", ignore=("name", "params")), persist_result=True)
def validate_sft(name: str, params: Params, sft: str, val_split: str, depends_on: dict) -> dict:
    """:func:`validate` of the SFT policy (iteration -1, greedy): the same for every run from one SFT
    checkpoint, so the first run of a pipeline plays it and the others read it from the Prefect
    cache, keyed on the checkpoint's and the val split's bytes and ``depends_on`` (the settings and
    the code it depends on; not the RL seed: greedy decoding draws nothing)."""
    return validate.fn(name, -1, params)


def _sft_val_depends_on(params: Params) -> dict:
    return {
        "code": source_digest(REPO / "components", REPO / "flows"),
        "task": params.task,
        "plugins": params.plugins,
        "tasks": params.tasks,
        "rollout": params.rollout.model_dump(),
        "val_samples": params.train.val_samples,
    }


# --- the flow ------------------------------------------------------------------------------------
def _open_session(params: Params, algo: str, *, rollout: bool = True) -> RLSession:
    """The run's session; ``rollout=False`` (a follower rank of a data-parallel world) has no rollout
    engine. With deepspeed.world_size > 1 vLLM runs in a process of its own (rank_mirror)."""
    parts, t, r, ds = resolved(params, algo), params.train, params.rollout, params.deepspeed
    cfg = SessionConfig(
        critic=parts["critic"],
        use_ref=t.kl_coef > 0,
        actor_lr=params.algorithms[algo].lr,
        critic_lr=t.critic_lr,
        zero_stage=ds.zero_stage,
        dtype=ds.dtype,
        grad_clip=t.grad_clip,
        warmup_steps=t.lr_warmup_steps,
        adam_eps=t.adam_eps,
        micro_batch_size=t.micro_batch_size,
        rollout=r.engine_settings(params.seed, updates=True, own_process=ds.world_size > 1)
        if rollout
        else None,
        seed=params.seed,
        old_logprobs=t.old_logprobs,
    )
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
    d, fp = run_dir(name), json.loads(json.dumps(fingerprint(params, algo)))
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
        print(f"{name}: {world} data-parallel ranks on this machine, {threads} torch thread(s) each")
    with local_world(world, _follower, (params, algo, threads)):  # this process is rank 0
        return _run(params, algo, rl_seed, sft_seed, name, run)


def _run(params: Params, algo: str, rl_seed: int, sft_seed: int, name: str, run: str) -> dict:
    import mlflow

    t = params.train
    session = _open_session(params, algo)
    if params.deepspeed.world_size > 1:
        session = Leader(session)
    _SESSION[name] = session
    done = [k for k in range(t.iterations) if _finished(name, k)]
    last = max(done, default=-1)
    if last >= 0:
        print(f"{name}: resuming after iteration {last}")
        session.restore(iter_dir(name, last) / "checkpoint")
    run_file = run_dir(name) / "mlflow_run.json"
    run_id = json.loads(run_file.read_text())["run_id"] if run_file.is_file() else None
    start = time.perf_counter()
    try:
        with train_mlflow_run(params, algo, rl_seed, sft_seed, run_id) as active:
            write_json({"run_id": active.info.run_id}, run_file)
            history_of = mlflow.tracking.MlflowClient().get_metric_history
            logged = {m.step for m in history_of(active.info.run_id, "timing_s/iteration")}
            initial = _initial_validation(params, name, resumed=last >= 0)
            history = [] if initial is None else [{"iteration": -1, "val/accuracy": initial}]
            for k in range(t.iterations):
                if _finished(name, k):
                    metrics = json.loads((iter_dir(name, k) / "metrics.json").read_text())
                else:
                    metrics = _iteration(params, algo, name, k, run)
                if k not in logged:  # exactly once per iteration, even across crashes
                    mlflow.log_metrics(metrics, step=k)
                    samples = iter_dir(name, k) / "samples.md"
                    if samples.is_file():
                        mlflow.log_artifact(str(samples), artifact_path=f"samples/iter_{k:04d}")
                history.append({"iteration": k, **metrics})
            summary = _finish(params, algo, name, history, time.perf_counter() - start)
            mlflow.log_artifacts(str(REPO / "models" / name / "final"), artifact_path="checkpoint")
            mlflow.log_artifact(str(REPO / "plots" / f"train_{name}.png"), artifact_path="plots")
            _evaluate_final(params.model_copy(update={"seed": sft_seed}), name)
    finally:
        session.close()
        _SESSION.pop(name, None)
    return summary


def _evaluate_final(params: Params, name: str) -> None:
    """Evaluate the final policy on the held-out split as the `evaluate_sft` stage evaluates SFT
    (``params.seed`` is the global seed again, so every model's sampled episodes use the same seed),
    on this run's rollout engine, which holds the final weights."""
    session = _SESSION[name]
    evaluate(params, name, session.rollout_engine, session.renderer)


def train_mlflow_run(params: Params, algo: str, rl_seed: int, sft_seed: int, run_id: str | None):
    """The run's MLflow run: the shared sections train, rollout and evaluate as they are, ``seed`` (the RL seed:
    ``params.seed`` is already replaced here; the SFT model's seed is the tag ``steprl.sft_seed``) and
    this algorithm's parts under ``algo.*`` (:func:`algo_params`); no other algorithm's block."""
    return mlflow_run(
        params,
        CompareParams.run_name(algo, rl_seed),
        ["train", "rollout", "evaluate"],
        run_id=run_id,
        tags={"steprl.algo": algo, "steprl.rl_seed": str(rl_seed), "steprl.sft_seed": str(sft_seed)},
        extra_params=algo_params(params, algo, rl_seed),
    )


def _initial_validation(params: Params, name: str, resumed: bool) -> float | None:
    """Greedy val accuracy of the starting (SFT) policy: the curves' point at iteration -1, computed
    once before the first update (None for a run resumed from a directory that lacks it)."""
    path = run_dir(name) / "val_initial.json"
    if not path.is_file():
        if resumed:
            return None
        val_split = processed(params.task) / "val.parquet"
        depends_on = _sft_val_depends_on(params)
        write_json(validate_sft(name, params, str(SFT), str(val_split), depends_on), path)
    return json.loads(path.read_text())["val/accuracy"]


def _iteration(params: Params, algo: str, name: str, k: int, run: str) -> dict:
    session, t = _SESSION[name], params.train
    policy = Path(session.version)
    policy_marker = str(policy / MARKER) if (policy / MARKER).is_file() else str(policy / "actor" / MARKER)
    timing = {}
    t0 = time.perf_counter()
    train_split = str(processed(params.task) / "train.parquet")
    rollouts = rollout(algo, name, k, policy_marker, train_split, params, run)
    timing["rollout"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    scored = score(name, k, rollouts, run)
    timing["score"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    batch = advantage(algo, name, k, scored, policy_marker, params, run)
    timing["advantage"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    out = update(algo, name, k, batch, policy_marker, params, run)
    timing["update"] = time.perf_counter() - t1
    if session.version != out["checkpoint"]:  # a cached update: the engines must hold its result
        session.restore(out["checkpoint"])
    t1 = time.perf_counter()
    sync(name)
    timing["sync"] = time.perf_counter() - t1
    batch_df = pl.read_parquet(batch)
    metrics = iteration_metrics(batch_df, out["metrics"])
    metrics.update(anchor_metrics(batch_df, resolved(params, algo)["estimator"]))  # gigpo/* (gigpo only)
    task_metrics = get_task(params.task).task_metrics(pl.read_parquet(rollouts).to_dicts())
    metrics.update({f"task/{key}": v for key, v in task_metrics.items()})  # the task's own (recipe hook)
    last = k == t.iterations - 1
    if (k + 1) % t.val_every == 0 or last:
        t1 = time.perf_counter()
        metrics.update(validate(name, k, params))
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


def _finish(params: Params, algo: str, name: str, history: list[dict], wall: float) -> dict:
    session = _SESSION[name]
    val = [h for h in history if "val/accuracy" in h]  # from iteration -1 (the SFT policy) on
    history = [h for h in history if h["iteration"] >= 0]
    save_hf(
        session.actor.module,
        session.tokenizer,
        REPO / "models" / name / "final",
        metadata={"algo": algo, "rl_seed": params.seed, "iterations": len(history)},
    )
    summary = {
        "algo": algo,
        "rl_seed": params.seed,
        "run": name,
        "iterations": len(history),
        "final_val_accuracy": val[-1]["val/accuracy"] if val else None,
        "generated_tokens": sum(h["perf/generated_tokens"] for h in history),
        "train_wall_time_s": sum(h["timing_s/iteration"] for h in history),
        "this_run_wall_time_s": wall,
    }
    write_json(summary, REPO / "metrics" / f"train_{name}.json")
    rows = [h for h in val if h["iteration"] < 0] + history
    write_text(
        "iteration,val_accuracy,score_mean\n"
        + "".join(
            f"{h['iteration']},{h.get('val/accuracy', '')},{h.get('critic/score/mean', '')}\n" for h in rows
        ),
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
    if p.deepspeed.world_size > 1 and p.deepspeed.zero_stage == 3:
        raise StageError(
            f"train: deepspeed.world_size={p.deepspeed.world_size} with deepspeed.zero_stage=3: rank 0 alone "
            "rolls out and scores with the actor, which needs whole weights on it (zero_stage 0-2)"
        )
    if not is_complete_checkpoint(SFT):
        raise StageError(f"train: {SFT} is not a complete checkpoint (run the sft stage first)")
    train_rows = pl.scan_parquet(processed(p.task) / "train.parquet").select(pl.len()).collect().item()
    if p.sft.rows is not None and p.sft.rows >= train_rows:
        raise StageError(
            f"sft.rows={p.sft.rows} leaves no RL prompts: the train split has {train_rows} rows "
            "(lower sft.rows, or give the train split more rows)"
        )
    # names and cross-field rules (e.g. group estimators need samples_per_prompt >= 2) were checked at load
    critic = resolved(p, algo)["critic"] is not None
    check_gpu_memory(p, SFT, trained_models=1 + critic, reference=p.train.kl_coef > 0, rollout=True)
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
