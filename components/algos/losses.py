"""Per-token policy losses (registry ``POLICY_LOSSES``), the clipped value loss and token entropy.

Every policy loss takes the same keyword arguments and returns ``(loss, metrics)``: ``loss`` (B, L)
is the per-token loss, 0 outside ``response_mask`` (turn it into one number with
``aggregation.aggregate_loss``); ``metrics`` holds detached 0-dim tensors averaged over this call's
valid tokens (``clipfrac``, ``approx_kl`` = mean((ratio - 1) - log ratio), and ``dual_clipfrac`` for
ppo). Values outside ``response_mask`` are ignored, even inf/NaN, and get no gradient.

Off-policy correction (``components.algos.offpolicy``): ``correction`` (``none`` by default: the loss
is untouched), with ``behav_logp`` (B, L), the rollout engine's log-probs, and ``correction_cap``,
multiplies each token's loss by a detached weight from log pi_old - log pi_behav, per token for ppo
and reinforce, per step row for gspo (the granularity of its sequence ratio); the metrics then add
``is_capped_frac`` (valid tokens whose weight was capped) and ``is_weight_mean``.

Does not: aggregate, add KL or entropy terms to the loss (the trainer sums the terms it wants).

Departures from the papers / docs/algorithms.md:
1. gspo uses sg(s) * exp(logp - sg(logp)) per token (GSPO-token with the sequence ratio s
   stop-gradiented, as in the GSPO paper): its value is s, and with equal advantages within a row and
   `seq-mean-token-mean` its gradient equals the gradient of the sequence-level GSPO objective.
2. gspo clamps the mean log-ratio of a row to [-20, 20] (the token ratio's clamp) and has no dual
   clip; ``clip_ratio_c`` is accepted for the common signature and unused by gspo and reinforce.
3. reinforce ignores ``old_logp`` for the loss (L = -A logp); it is only used for the metrics and
   an off-policy correction's weight.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from components.algos.offpolicy import correction_weights, get_correction
from components.algos.tensor_ops import masked_mean
from components.registry import Registry

__all__ = ["POLICY_LOSSES", "entropy_from_logits", "get_policy_loss", "value_loss"]

LOG_RATIO_CLAMP = 20.0

LossOut = tuple[Tensor, dict[str, Tensor]]  # per-token loss (B, L), metrics
PolicyLoss = Callable[..., LossOut]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")
_register = POLICY_LOSSES.register


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss registered as ``name``; unknown names raise UnknownNameError listing the known ones."""
    return POLICY_LOSSES.get(name)


def _check(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, response_mask: Tensor,
    clip_low: float, clip_high: float, clip_ratio_c: float,
) -> Tensor:  # fmt: skip
    for name, x in (("old_logp", old_logp), ("advantages", advantages), ("response_mask", response_mask)):
        if x.shape != logp.shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)} but logp has {tuple(logp.shape)}")
    if logp.dim() != 2:
        raise ValueError(f"logp must have shape (B, L), got {tuple(logp.shape)}")
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (dual clip), got {clip_ratio_c}")
    return response_mask.bool()


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    """x where mask, 0 elsewhere (no inf/NaN and no gradient leaks from padding)."""
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _corrected(
    loss: Tensor, metrics: dict[str, Tensor], *, old_logp: Tensor, behav_logp: Tensor | None,
    mask: Tensor, correction: str, cap: float, level: str,
) -> Tensor:  # fmt: skip
    """``loss`` (B, L) times the correction's detached weight (``none``: ``loss`` itself, untouched);
    adds ``is_capped_frac`` and ``is_weight_mean`` to ``metrics``."""
    if get_correction(correction).weigh is None:  # none
        return loss
    if behav_logp is None:
        raise ValueError(f"correction={correction!r} needs behav_logp, the rollout engine's log-probs")
    weight, capped = correction_weights(
        old_logp=old_logp, behav_logp=behav_logp, response_mask=mask, correction=correction, cap=cap,
        level=level,
    )  # type: ignore[misc]  # fmt: skip
    metrics["is_capped_frac"] = masked_mean(capped.to(loss.dtype), mask).detach()
    metrics["is_weight_mean"] = masked_mean(weight, mask).detach()
    return loss * weight


def _approx_kl(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """k3 estimate of KL(old || new) over valid tokens: mean((ratio - 1) - log ratio)."""
    return masked_mean(torch.expm1(log_ratio) - log_ratio, mask).detach()


@_register("ppo")
def ppo(
    *,
    logp: Tensor,  # (B, L) log-probs of the current policy
    old_logp: Tensor,  # (B, L) log-probs of the policy that sampled the tokens
    advantages: Tensor,  # (B, L)
    response_mask: Tensor,  # (B, L)
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    behav_logp: Tensor | None = None,  # (B, L) the rollout engine's log-probs (a correction's pi_behav)
    correction: str = "none",  # components.algos.offpolicy.OFFPOLICY_CORRECTIONS
    correction_cap: float = 2.0,
) -> LossOut:
    """Dual-clip PPO: L = max(-A r, -A clip(r, 1-eps_low, 1+eps_high)); where A < 0, L = min(L, -A c)."""
    mask = _check(logp, old_logp, advantages, response_mask, clip_low, clip_high, clip_ratio_c)
    A = _masked(advantages, mask)  # (B, L)
    log_ratio = _masked(logp - old_logp, mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, L)
    ratio = log_ratio.exp()
    loss_unclipped = -A * ratio
    loss_clipped = -A * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)  # (B, L)
    dual = -A * clip_ratio_c
    dual_active = (A < 0) & (dual < loss)  # (B, L)
    loss = torch.where(dual_active, dual, loss)
    metrics = {
        "clipfrac": masked_mean((loss_clipped > loss_unclipped).to(logp.dtype), mask).detach(),
        "dual_clipfrac": masked_mean(dual_active.to(logp.dtype), mask).detach(),
        "approx_kl": _approx_kl(log_ratio, mask),
    }
    loss = _corrected(
        loss, metrics, old_logp=old_logp, behav_logp=behav_logp, mask=mask, correction=correction,
        cap=correction_cap, level="token",
    )  # fmt: skip
    return _masked(loss, mask), metrics


@_register("gspo")
def gspo(
    *,
    logp: Tensor,  # (B, L)
    old_logp: Tensor,  # (B, L)
    advantages: Tensor,  # (B, L), normally constant within a step row
    response_mask: Tensor,  # (B, L)
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    clip_ratio_c: float = 3.0,
    behav_logp: Tensor | None = None,  # (B, L) the rollout engine's log-probs (a correction's pi_behav)
    correction: str = "none",  # components.algos.offpolicy.OFFPOLICY_CORRECTIONS
    correction_cap: float = 2.0,
) -> LossOut:
    """GSPO: s = exp(mean_j(logp - logp_old)) per step row, applied per token as
    sg(s) * exp(logp - sg(logp)); L = max(-A s, -A clip(s, 1-eps_low, 1+eps_high))."""
    mask = _check(logp, old_logp, advantages, response_mask, clip_low, clip_high, clip_ratio_c)
    A = _masked(advantages, mask)  # (B, L)
    lp = _masked(logp, mask)  # (B, L)
    log_ratio = _masked(logp - old_logp, mask)  # (B, L)
    log_s = (log_ratio.sum(1) / mask.sum(1).clamp(min=1)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B,)
    s = torch.exp(log_s.detach()[:, None] + lp - lp.detach())  # (B, L): value s, gradient per token
    loss_unclipped = -A * s
    loss_clipped = -A * s.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)  # (B, L)
    metrics = {
        "clipfrac": masked_mean((loss_clipped > loss_unclipped).to(logp.dtype), mask).detach(),
        "approx_kl": _approx_kl(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), mask),
    }
    loss = _corrected(
        loss, metrics, old_logp=old_logp, behav_logp=behav_logp, mask=mask, correction=correction,
        cap=correction_cap, level="sequence",
    )  # fmt: skip
    return _masked(loss, mask), metrics


@_register("reinforce")
def reinforce(
    *,
    logp: Tensor,  # (B, L)
    old_logp: Tensor,  # (B, L), metrics only
    advantages: Tensor,  # (B, L)
    response_mask: Tensor,  # (B, L)
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    behav_logp: Tensor | None = None,  # (B, L) the rollout engine's log-probs (a correction's pi_behav)
    correction: str = "none",  # components.algos.offpolicy.OFFPOLICY_CORRECTIONS
    correction_cap: float = 2.0,
) -> LossOut:
    """REINFORCE: L = -A logp."""
    mask = _check(logp, old_logp, advantages, response_mask, clip_low, clip_high, clip_ratio_c)
    loss = -_masked(advantages, mask) * _masked(logp, mask)  # (B, L)
    log_ratio = _masked(logp - old_logp, mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    metrics = {"clipfrac": torch.zeros((), dtype=logp.dtype), "approx_kl": _approx_kl(log_ratio, mask)}
    loss = _corrected(
        loss, metrics, old_logp=old_logp, behav_logp=behav_logp, mask=mask, correction=correction,
        cap=correction_cap, level="token",
    )  # fmt: skip
    return loss, metrics


def value_loss(
    *,
    values: Tensor,  # (B, L) or any shape: current critic values
    old_values: Tensor,  # same shape: critic values when the batch was scored
    returns: Tensor,  # same shape: targets R
    value_mask: Tensor,  # same shape: positions that are trained
    clip_value: float,
) -> LossOut:
    """Clipped value loss 0.5 * max((v - R)^2, (v_old + clip(v - v_old, -c, c) - R)^2), 0 outside
    ``value_mask``. Any shape: (B, L) with the response mask for gae, or a mask with one position per
    row (the last prompt token) for step_gae. Aggregate with ``aggregate_loss(mode="token-mean")``."""
    for name, x in (("old_values", old_values), ("returns", returns), ("value_mask", value_mask)):
        if x.shape != values.shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)} but values has {tuple(values.shape)}")
    if clip_value < 0:
        raise ValueError(f"clip_value must be >= 0, got {clip_value}")
    mask = value_mask.bool()
    v, v_old, R = _masked(values, mask), _masked(old_values, mask), _masked(returns, mask)
    v_clipped = v_old + (v - v_old).clamp(-clip_value, clip_value)
    loss_unclipped, loss_clipped = (v - R) ** 2, (v_clipped - R) ** 2
    loss = 0.5 * torch.maximum(loss_unclipped, loss_clipped)
    metrics = {"vf_clipfrac": masked_mean((loss_clipped > loss_unclipped).to(v.dtype), mask).detach()}
    return _masked(loss, mask), metrics


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the last dim: (..., V) -> (...). H = logsumexp(z) - sum p z."""
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)
