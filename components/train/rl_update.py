"""The RL update: PPO-style epochs over an iteration's step rows, for the actor and the critic.

Rows are agent steps (exact prompt/response ids) with what the advantage stage computed: per-token
advantages, old log-probs (recomputed by the trainer before the update), reference log-probs (when a
KL loss is on), returns and old critic values. Mini-batches are split into micro-batches; every
micro-batch loss is normalised by the counts of its WHOLE mini-batch (``loss_normalisers``), so the
micro-batch size never changes the update. Tensors are built on the CPU (``step_tensors``) and moved to
the engine's device in the loss (``components.device.to_device``). Non-finite losses or gradients
skip that update (``train_step``) and are counted.

Losses, estimators and aggregation come from ``components.algos`` by name; this module never
branches on an algorithm's name. The off-policy correction (``ActorSettings.correction``,
``components.algos.offpolicy``) weighs the policy loss by the trainer's old log-probs against the
rollout engine's (the rows' ``response_logprobs``); whenever both exist (module ``actor_update``) the
update also logs their mismatch, ``mismatch/*``, which reads detached tensors and changes nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from components.algos import aggregate_loss, get_policy_loss, loss_normalisers
from components.algos.kl import kl_penalty
from components.algos.losses import value_loss
from components.algos.offpolicy import get_correction, mismatch_metrics, mismatch_sums
from components.device import model_device, to_device
from components.train.engine import train_step
from components.train.policy import TokenBatch, critic_values, make_token_batch, pad_rows, response_logprobs


@dataclass(frozen=True)
class ActorSettings:
    """How the actor learns from an iteration's rows: the algorithm's loss and clip range, the KL loss
    coefficient (``KLTerm.loss_coef``: 0 when the KL is a reward penalty or off), the entropy bonus,
    and the PPO epochs and batch sizes."""

    policy_loss: str
    loss_agg: str
    clip_low: float
    clip_high: float
    clip_ratio_c: float
    kl_coef: float
    kl_kind: str
    entropy_coef: float
    norm_const: float  # seq-mean-token-sum-norm's constant (the longest response)
    temperature: float  # log-probs of softmax(logits / temperature), the rollout's distribution
    epochs: int
    mini_batch_size: int
    micro_batch_size: int
    packed: bool = False  # forwards packed end to end (make_token_batch), train.packed_forward
    # The off-policy correction of the policy loss (components.algos.offpolicy: none, tis, decoupled)
    # and its cap C >= 1; algorithms.<name>.correction / correction_cap.
    correction: str = "none"
    correction_cap: float = 2.0


@dataclass(frozen=True)
class CriticSettings:
    """How the critic learns: the value-loss clip range, its epochs and batch sizes."""

    value_clip: float
    epochs: int
    mini_batch_size: int
    micro_batch_size: int
    packed: bool = False  # forwards packed end to end (make_token_batch), train.packed_forward


@dataclass
class StepTensors:
    batch: TokenBatch
    advantages: Tensor  # (B, L)
    old_logp: Tensor  # (B, L)
    ref_logp: Tensor | None  # (B, L)
    returns: Tensor  # (B, L) per token, or (B,) per step
    old_values: Tensor | None  # same shape as returns
    traj_ids: list[str] | None = None  # each row's trajectory, for traj-mean-token-mean
    behav_logp: Tensor | None = None  # (B, L) the rollout engine's log-probs (rows' response_logprobs)


def step_tensors(
    rows: Sequence[dict[str, Any]],
    pad_id: int,
    per_step_values: bool,
    share_prefix: bool = False,
    traj_ids: list[str] | None = None,
    packed: bool = False,
) -> StepTensors:
    """Tensors of ``rows`` (dicts with prompt_ids, response_ids, advantages, old_logprobs, returns,
    and optionally ref_logprobs, values, response_logprobs), and ``traj_ids`` as given.
    ``share_prefix``: the actor forwards each shared prompt once (``make_token_batch``), and so does
    the critic."""
    batch = make_token_batch(
        [r["prompt_ids"] for r in rows],
        [r["response_ids"] for r in rows],
        pad_id,
        share_prefix=share_prefix,
        packed=packed,
    )
    L = batch.response_ids.size(1)
    has_ref = rows[0].get("ref_logprobs") is not None
    has_values = rows[0].get("values") is not None
    has_behav = all(r.get("response_logprobs") is not None for r in rows)
    if per_step_values:
        returns = torch.tensor([float(r["returns"][0]) if len(r["returns"]) else 0.0 for r in rows])
        old_values = torch.tensor([float(r["values"][0]) for r in rows]) if has_values else None
    else:
        returns = pad_rows([r["returns"] for r in rows], L)
        old_values = pad_rows([r["values"] for r in rows], L) if has_values else None
    return StepTensors(
        batch=batch,
        advantages=pad_rows([r["advantages"] for r in rows], L),
        old_logp=pad_rows([r["old_logprobs"] for r in rows], L),
        ref_logp=pad_rows([r["ref_logprobs"] for r in rows], L) if has_ref else None,
        returns=returns,
        old_values=old_values,
        traj_ids=traj_ids,
        behav_logp=pad_rows([r["response_logprobs"] for r in rows], L) if has_behav else None,
    )


def _fill(units: list, size: int, rows_of: Callable[[Any], int] = len) -> list[list]:
    """Consecutive units grouped so a group holds at most ``size`` rows (``rows_of(unit)`` each); a
    unit is never split (a unit larger than ``size`` is a group of its own)."""
    groups: list[list] = []
    rows = 0
    for u in units:
        n = rows_of(u)
        if groups and rows + n <= size:
            groups[-1].append(u)
            rows += n
        else:
            groups.append([u])
            rows = n
    return groups


def _mini_batches(
    rows: Sequence[dict[str, Any]], size: int, micro: int, epochs: int, seed: int
) -> list[list[list[int]]]:
    """Row indices: one list per optimizer step, holding micro-batches of at most ``micro`` rows.

    Groups (the samples of one prompt) are shuffled whole and never split across optimizer steps:
    a group's advantages sum to zero, so the tokens its samples share cancel within one step instead
    of pushing the policy up in one step and down in the next. A trajectory's steps stay in one
    micro-batch (unless it alone has more than ``micro`` steps), so packing (``make_token_batch``)
    forwards each trajectory once. A group larger than ``size`` is one step of its own. Rows without
    ``traj_id`` are a trajectory of their own; rows without ``group_id`` a group with their trajectory.
    """
    rng = random.Random(seed)
    by_group: dict[str, list[list[int]]] = {}  # group -> its trajectories' rows
    for traj in _rows_by_trajectory(rows):
        g = rows[traj[0]].get("group_id")
        by_group.setdefault(f"traj-{traj[0]}" if g is None else str(g), []).append(traj)
    steps = []
    for _ in range(epochs):
        groups = list(by_group.values())
        rng.shuffle(groups)
        for mini in _fill(groups, size, rows_of=lambda g: sum(map(len, g))):
            trajs = [t for g in mini for t in g]
            steps.append([[i for t in m for i in t] for m in _fill(trajs, micro)])
    return steps


def trajectory_chunks(rows: Sequence[dict[str, Any]], size: int) -> list[list[int]]:
    """Row indices in chunks of at most ``size`` rows, each trajectory's steps in one chunk (for packing)."""
    return [[i for t in g for i in t] for g in _fill(_rows_by_trajectory(rows), size)]


def _traj_id(rows: Sequence[dict[str, Any]], i: int) -> str:
    """Row i's trajectory (a row without ``traj_id`` is a trajectory of its own)."""
    t = rows[i].get("traj_id")
    return f"row-{i}" if t is None else str(t)


def _rows_by_trajectory(rows: Sequence[dict[str, Any]]) -> list[list[int]]:
    """Row indices of each trajectory, in order of first appearance (a row without ``traj_id`` is a
    trajectory of its own)."""
    by_traj: dict[str, list[int]] = {}
    for i in range(len(rows)):
        by_traj.setdefault(_traj_id(rows, i), []).append(i)
    return list(by_traj.values())


def _mean_metrics(history: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for h in history for k in h}
    return {k: sum(h.get(k, 0.0) for h in history) / len(history) for k in sorted(keys)}


def actor_update(
    engine: Any,
    rows: Sequence[dict[str, Any]],
    settings: ActorSettings,
    *,
    pad_id: int,
    seed: int,
    detach_old: bool = False,
    old_from_rollout: bool = False,
) -> dict[str, float]:
    """PPO epochs of the actor over ``rows``; returns metrics averaged over optimizer steps, and
    ``pg_clipfrac/step_<j>``, the clipped share of the j-th optimizer step (0-based) alone.

    Log-probs are of softmax(logits / temperature), the distribution the rollout sampled from.
    ``seed`` shuffles the mini-batches. ``detach_old``: the old log-probs are this forward's own,
    detached (ratio exactly 1 at the first step; only on-policy: one epoch, one mini-batch). The rows' ``old_logprobs`` are then the rollout's
    and give ``logprob_gap``, the mean |trainer - rollout| log-prob per response token.
    ``old_from_rollout``: the rows' ``old_logprobs`` are the rollout's (``train.old_logprobs:
    rollout``), so there is no trainer-side old log-prob.

    The trainer's old log-probs (this forward's own with ``detach_old``, else the rows') against the
    rollout's (the rows' ``response_logprobs``; the engines report the tempered distribution's, as
    the trainer computes them), give ``mismatch/kl`` (mean k3 per response token),
    ``mismatch/max_abs_log_ratio`` and, under a correction, ``mismatch/capped_frac`` (the capped share
    of tokens, averaged over optimizer steps) and ``pg_is_weight_mean``."""
    a = settings
    loss_fn_pg = get_policy_loss(a.policy_loss)
    has_behav = all(r.get("response_logprobs") is not None for r in rows)
    both = has_behav and not old_from_rollout  # trainer and rollout log-probs
    if get_correction(a.correction).weigh is not None and not both:
        raise ValueError(
            f"correction={a.correction!r} needs the trainer's old log-probs beside the rollout's "
            f"(response_logprobs in every row: {has_behav}; old log-probs not the rollout's: "
            f"{not old_from_rollout})"
        )
    history, sums = [], []
    for plan in _mini_batches(rows, a.mini_batch_size, a.micro_batch_size, a.epochs, seed):
        micro = [
            step_tensors(
                [rows[i] for i in idx],
                pad_id,
                per_step_values=False,
                share_prefix=True,
                traj_ids=[_traj_id(rows, i) for i in idx],
                packed=a.packed,
            )
            for idx in plan
        ]
        norms = loss_normalisers(
            response_masks=[m.batch.response_mask for m in micro],
            norm_const=a.norm_const,
            traj_ids=[m.traj_ids for m in micro],
        )
        tokens = max(norms["global_tokens"], 1.0)
        # micro-batch -> its mismatch sums, once however often train_step forwards it
        step_sums: dict[int, dict[str, float]] = {}

        def loss_fn(eng: Any, cpu_m: StepTensors) -> tuple[Tensor, dict[str, Tensor]]:
            m = to_device(cpu_m, model_device(eng.module))  # built on the CPU by step_tensors
            mask = m.batch.response_mask
            logp, entropy = response_logprobs(
                eng.module, m.batch, temperature=a.temperature, with_entropy=True
            )
            old_logp = logp.detach() if detach_old else m.old_logp
            pg, pg_metrics = loss_fn_pg(
                logp=logp,
                old_logp=old_logp,
                advantages=m.advantages,
                response_mask=mask,
                clip_low=a.clip_low,
                clip_high=a.clip_high,
                clip_ratio_c=a.clip_ratio_c,
                behav_logp=m.behav_logp,
                correction=a.correction,
                correction_cap=a.correction_cap,
            )
            if both:
                step_sums[id(cpu_m)] = mismatch_sums(
                    trainer_logp=old_logp, rollout_logp=m.behav_logp, response_mask=mask
                )
            pg_loss = aggregate_loss(
                loss=pg, response_mask=mask, mode=a.loss_agg, traj_ids=m.traj_ids, **norms
            )
            loss = pg_loss
            share = mask.sum() / tokens  # this micro-batch's share of the mini-batch's tokens
            metrics = {"pg_loss": pg_loss.detach()}
            metrics.update({f"pg_{k}": v * share for k, v in pg_metrics.items()})
            metrics["entropy"] = (entropy.detach() * mask).sum() / tokens
            if detach_old:
                metrics["logprob_gap"] = ((logp.detach() - m.old_logp).abs() * mask).sum() / tokens
            if a.entropy_coef > 0:
                loss = loss - a.entropy_coef * aggregate_loss(
                    loss=entropy, response_mask=mask, mode=a.loss_agg, traj_ids=m.traj_ids, **norms
                )
            if a.kl_coef > 0 and m.ref_logp is not None:
                kl = kl_penalty(logp=logp, ref_logp=m.ref_logp, response_mask=mask, kind=a.kl_kind)
                kl_loss = aggregate_loss(loss=kl, response_mask=mask, mode="token-mean", **norms)
                loss = loss + a.kl_coef * kl_loss
                metrics["kl_loss"] = kl_loss.detach()
            return loss, metrics

        history.append(train_step(engine, micro, loss_fn))
        sums += step_sums.values()
    # The clipped share per optimizer step as well as its mean: with the rollout's log-probs as the
    # old policy the first step's ratio is ~1, and later steps show how far the policy has moved.
    per_step = {
        f"pg_clipfrac/step_{j}": h["pg_clipfrac"] for j, h in enumerate(history) if "pg_clipfrac" in h
    }
    out = {**_mean_metrics(history), **per_step}
    if "pg_is_capped_frac" in out:
        out["mismatch/capped_frac"] = out.pop("pg_is_capped_frac")
    return {**out, **{f"mismatch/{k}": v for k, v in mismatch_metrics(sums).items()}}


def critic_update(
    engine: Any,
    rows: Sequence[dict[str, Any]],
    settings: CriticSettings,
    *,
    pad_id: int,
    per_step: bool,
    seed: int,
) -> dict[str, float]:
    """Clipped value regression of the critic on the stored returns (one value per step if ``per_step``)."""
    c = settings
    history = []
    for plan in _mini_batches(rows, c.mini_batch_size, c.micro_batch_size, c.epochs, seed + 1):
        micro = [
            step_tensors(
                [rows[i] for i in idx], pad_id, per_step_values=per_step, share_prefix=True, packed=c.packed
            )
            for idx in plan
        ]
        if per_step:
            count = float(sum(m.returns.numel() for m in micro))
        else:
            count = float(sum(m.batch.response_mask.sum() for m in micro))
        count = max(count, 1.0)

        def loss_fn(eng: Any, m: StepTensors) -> tuple[Tensor, dict[str, Tensor]]:
            m = to_device(m, model_device(eng.module))  # built on the CPU by step_tensors
            v = critic_values(eng.module, m.batch, per_step=per_step)
            mask = torch.ones_like(v) if per_step else m.batch.response_mask
            old = m.old_values if m.old_values is not None else v.detach()
            per_item, extra = value_loss(
                values=v, old_values=old, returns=m.returns, value_mask=mask, clip_value=c.value_clip
            )
            loss = (per_item * mask).sum() / count
            share = mask.sum() / count
            return loss, {"vf_loss": loss.detach(), **{k: t * share for k, t in extra.items()}}

        history.append(train_step(engine, micro, loss_fn))
    return _mean_metrics(history)
