"""From params.yaml to the typed settings of one RL run: what the train stage hands to the library.

Each function reads the sections it needs and returns one frozen object of ``components``; the
library never reads params.yaml. The KL term is decided once (:func:`kl_term`) and both the
advantage stage and the actor's loss read that object.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from components.algos.kl import KLTerm
from components.config import Params
from components.model.tiny import is_complete_checkpoint
from components.train.group_filter import GroupFilter
from components.train.lora import LoraSettings
from components.train.rl_session import SessionConfig
from components.train.rl_update import ActorSettings, CriticSettings
from flows import REPO

CRITIC = REPO / "models" / "critic"


def rl_prompts(train: pl.DataFrame, params: Params) -> pl.DataFrame:
    """The train rows RL samples prompts from: those after the first ``sft.rows`` (all if None)."""
    return train.slice(params.sft.rows or 0)


def run_dir(name: str) -> Path:
    return REPO / "runs" / name


def iter_dir(name: str, k: int) -> Path:
    return run_dir(name) / f"iter_{k:04d}"


def prompts_per_iteration(params: Params, algo: str) -> int:
    """The prompts an iteration's batch needs: trajectories_per_iteration / samples_per_prompt."""
    return max(params.train.trajectories_per_iteration // params.algorithms[algo].samples_per_prompt, 1)


def resolved(params: Params, algo: str) -> dict:
    """The algorithm's parts: its preset with every non-null override applied (AlgoParams.parts)."""
    return params.algorithms[algo].parts()


def kl_term(params: Params) -> KLTerm:
    t = params.train
    return KLTerm(coef=t.kl_coef, kind=t.kl_kind, in_reward=t.kl_in_reward)


def actor_settings(params: Params, algo: str) -> ActorSettings:
    t, a, parts = params.train, params.algorithms[algo], resolved(params, algo)
    return ActorSettings(
        policy_loss=parts["policy_loss"],
        loss_agg=parts["loss_agg"],
        clip_low=a.clip_low,
        clip_high=a.clip_high,
        clip_ratio_c=a.clip_ratio_c,
        kl_coef=kl_term(params).loss_coef,
        kl_kind=t.kl_kind,
        entropy_coef=t.entropy_coef,
        norm_const=float(params.rollout.max_response_len),
        temperature=t.temperature,
        epochs=t.ppo_epochs,
        mini_batch_size=t.mini_batch_size,
        micro_batch_size=t.micro_batch_size,
        packed=t.packed_forward,
        correction=a.correction,
        correction_cap=a.correction_cap,
    )


def critic_settings(params: Params) -> CriticSettings:
    t = params.train
    return CriticSettings(
        value_clip=t.value_clip,
        epochs=t.ppo_epochs,
        mini_batch_size=t.critic_mini_batch_size or t.mini_batch_size,
        micro_batch_size=t.micro_batch_size,
        packed=t.packed_forward,
    )


def group_filter(params: Params, algo: str) -> GroupFilter:
    """The prompt-group filter of ``algo``'s runs: train.std_filter_keep, and dynamic sampling as
    ``algorithms.<algo>.dynamic_sampling`` or else train.dynamic_sampling says."""
    t = params.train
    return GroupFilter(
        keep=t.std_filter_keep, dynamic=params.dynamic_sampling(algo), max_rounds=t.dynamic_sampling_rounds
    )


def warm_critic(critic: Path = CRITIC) -> Path | None:
    """The critic_warmup stage's fitted critic, None when the stage is off (it then leaves a marker
    only, off.json, and a checkpoint beside that marker is not this stage's output: never used)."""
    off = (critic / "off.json").exists()
    return critic if is_complete_checkpoint(critic) and not off else None


def lora_settings(params: Params) -> LoraSettings | None:
    """model.lora as the library's settings; None when its rank is 0 (off)."""
    lora = params.model.lora
    if not lora.enabled:
        return None
    return LoraSettings(
        rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout, target_modules=tuple(lora.target_modules)
    )


def session_config(
    params: Params, algo: str, *, rollout: bool = True, critic: Path | None = None
) -> SessionConfig:
    """The run's session settings; ``rollout=False`` (a follower rank of a data-parallel world) has no
    rollout engine; ``critic``: a fitted critic to start from (critic-based algorithms only). vLLM runs
    in a process of its own where rollout.own_process asks, beside several data-parallel ranks, and
    at rollout.staleness >= 1, where
    it generates while the update runs: in this process its kernels changed the update's last bits
    (the same update gave other weights in one of three tries beside an in-process generation, in
    none of five beside an own-process one), and a resume must reach the same weights."""
    parts, t, r, ds = resolved(params, algo), params.train, params.rollout, params.deepspeed
    return SessionConfig(
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
        rollout=r.engine_settings(params.seed, updates=True, own_process=params.engine_in_own_process())
        if rollout
        else None,
        seed=params.seed,
        old_logprobs=t.old_logprobs,
        critic_init=str(critic) if critic is not None and parts["critic"] is not None else None,
        critic_lr_warmup_steps=t.lr_warmup_steps
        if t.critic_lr_warmup_steps is None
        else t.critic_lr_warmup_steps,
        lora=lora_settings(params),
        packed_forward=t.packed_forward,
    )
