"""Off-policy corrections of the policy loss (registry ``OFFPOLICY_CORRECTIONS``) and the
rollout/trainer log-prob mismatch (docs/algorithms.md, "Off-policy correction").

Each sampled token has three log-probs: log pi (the policy being trained), log pi_old (the trainer's
own pass over the weights that sampled the batch: ``train.old_logprobs`` recompute, or the update's
forward detached) and log pi_behav (the rollout engine's own, as it sampled). A correction turns
log w = log pi_old - log pi_behav into a detached weight that multiplies the policy loss of the token
(``components.algos.losses``); the clipped ratio stays pi / pi_old.

Corrections (one signature: ``weigh(w, cap) -> (weight, capped)``, w = exp(log w) >= 0, cap >= 1):
``none``       no weight (the loss is untouched).
``tis``        weight = min(w, C): truncated importance sampling of the rollout/trainer mismatch
               (verl's and slime's TIS).
``decoupled``  weight = w where w <= C, else 0: decoupled PPO's behaviour weight pi_prox / pi_behav
               (Hilton et al. 2021) with pi_prox = pi_old, capped as AReaL caps it.

The weight's granularity follows the loss's ratio (``level``): ``token`` (ppo, reinforce) takes log w
per token; ``sequence`` (gspo, StepPO's sequence ratio) takes the mean of log w over the row's
response tokens, the geometric mean of the token weights, as s is the geometric mean of the token
ratios, and gives it to every token of the row.

Does not: choose where the log-probs come from, run any model, or know about staleness (which
versions of the weights sampled a batch).

Departures from the papers:
1. ``decoupled``'s cap drops a token whose weight exceeds C (AReaL's ``behav_imp_weight_cap``); the
   paper's weight is uncapped.
2. log w is clamped to [-20, 20], as the policy ratio is.
3. With one policy version per batch (no staleness), pi_prox and pi_old are the same pass, so ``tis``
   and ``decoupled`` differ only in what their cap does: truncate, or drop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from components.registry import Registry

__all__ = [
    "OFFPOLICY_CORRECTIONS",
    "Correction",
    "correction_weights",
    "get_correction",
    "mismatch_metrics",
    "mismatch_sums",
]

LOG_W_CLAMP = 20.0
LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class Correction:
    """One correction: ``weigh(w, cap) -> (weight, capped)`` over (B, L) behaviour ratios (None for
    ``none``), and the ``train.old_logprobs`` sources that give it a trainer-side log pi_old apart
    from the rollout's log pi_behav."""

    weigh: Callable[[Tensor, float], tuple[Tensor, Tensor]] | None
    old_logprobs: tuple[str, ...]
    summary: str


OFFPOLICY_CORRECTIONS: Registry[Correction] = Registry("off-policy correction")


def _truncate(w: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    capped = w > cap
    return w.clamp(max=cap), capped


def _drop(w: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    capped = w > cap
    return torch.where(capped, torch.zeros((), dtype=w.dtype, device=w.device), w), capped


OFFPOLICY_CORRECTIONS.register("none", Correction(None, ("detached", "rollout", "recompute"), "no weight"))
# detached: pi_old = sg(pi), the update's own forward over the weights that sampled the batch (on-policy)
OFFPOLICY_CORRECTIONS.register(
    "tis", Correction(_truncate, ("detached", "recompute"), "weight min(pi_old / pi_behav, C)")
)
# pi_prox must be a pass of its own: with detached it would be pi itself and the clip could never act
OFFPOLICY_CORRECTIONS.register(
    "decoupled",
    Correction(_drop, ("recompute",), "weight pi_prox / pi_behav where <= C, else 0; ratio pi / pi_prox"),
)


def get_correction(name: str) -> Correction:
    """The correction registered as ``name``; unknown names raise UnknownNameError listing the known ones."""
    return OFFPOLICY_CORRECTIONS.get(name)


def correction_weights(
    *,
    old_logp: Tensor,  # (B, L) log pi_old (pi_prox for decoupled)
    behav_logp: Tensor,  # (B, L) log pi_behav, the rollout engine's
    response_mask: Tensor,  # (B, L)
    correction: str,
    cap: float,
    level: str,
) -> tuple[Tensor, Tensor] | None:
    """(weight (B, L), capped (B, L) bool), both detached and 0 / False outside ``response_mask``;
    None for ``none``. ``level``: "token" or "sequence" (one weight per row, module docstring)."""
    c = get_correction(correction)
    if c.weigh is None:
        return None
    if not cap >= 1.0:
        raise ValueError(f"the off-policy correction's cap must be >= 1, got {cap}")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if behav_logp.shape != old_logp.shape:
        raise ValueError(
            f"behav_logp has shape {tuple(behav_logp.shape)} but old_logp has {tuple(old_logp.shape)}"
        )
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=old_logp.dtype, device=old_logp.device)
    log_w = torch.where(mask, old_logp.detach() - behav_logp.detach(), zero)  # (B, L)
    if level == "sequence":
        row = log_w.sum(1) / mask.sum(1).clamp(min=1)  # (B,) mean log w over the row's tokens
        log_w = torch.where(mask, row[:, None].expand_as(log_w), zero)
    weight, capped = c.weigh(log_w.clamp(-LOG_W_CLAMP, LOG_W_CLAMP).exp(), cap)
    return torch.where(mask, weight, zero), capped & mask


def mismatch_sums(
    *,
    trainer_logp: Tensor,  # (B, L) the trainer's log-probs of the weights that sampled the tokens
    rollout_logp: Tensor,  # (B, L) the rollout engine's
    response_mask: Tensor,  # (B, L)
) -> dict[str, float]:
    """Sums over the valid tokens for :func:`mismatch_metrics`: ``kl_sum`` (k3 estimate of
    KL(pi_rollout || pi_trainer) per token: exp(d) - 1 - d, d = log pi_trainer - log pi_rollout, the
    tokens being samples of pi_rollout), ``tokens`` and ``max_abs_log_ratio`` (max |d|)."""
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=trainer_logp.dtype, device=trainer_logp.device)
    d = torch.where(mask, trainer_logp.detach() - rollout_logp.detach(), zero).clamp(
        -LOG_W_CLAMP, LOG_W_CLAMP
    )
    k3 = torch.where(mask, torch.expm1(d) - d, zero)
    return {
        "kl_sum": float(k3.sum()),
        "tokens": float(mask.sum()),
        "max_abs_log_ratio": float(d.abs().max()) if d.numel() else 0.0,
    }


def mismatch_metrics(sums: list[dict[str, float]]) -> dict[str, float]:
    """``kl`` (mean k3 per token) and ``max_abs_log_ratio`` over several :func:`mismatch_sums`; {} for none."""
    tokens = sum(s["tokens"] for s in sums)
    if not sums or tokens == 0:
        return {}
    return {
        "kl": sum(s["kl_sum"] for s in sums) / tokens,
        "max_abs_log_ratio": max(s["max_abs_log_ratio"] for s in sums),
    }
