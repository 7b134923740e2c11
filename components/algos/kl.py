"""KL to the frozen reference policy, per token: as a loss term or as a per-token reward penalty.

Estimators (Schulman's k1/k2/k3, with d = logp_ref - logp):
``kl`` (k1): logp - logp_ref;  ``mse`` (k2): 0.5 (logp - logp_ref)^2;
``low_var_kl`` (k3): exp(d) - d - 1, clamped to [-10, 10].

Does not: aggregate (use ``aggregation.aggregate_loss``) or choose the coefficient.

Departures from docs/algorithms.md:
1. ``low_var_kl`` clamps d to [-20, 20] before exp (the policy ratio's clamp), so a huge gap gives
   the clamped value 10 with a zero, finite gradient instead of exp overflow and a NaN gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from components.algos.tensor_ops import place_on_last_token
from components.registry import Registry

__all__ = ["KL_ESTIMATORS", "KLTerm", "get_kl_estimator", "kl_penalty", "kl_reward"]


@dataclass(frozen=True)
class KLTerm:
    """The KL term to the reference policy: its coefficient, its estimator, and where it acts. The one
    place that decides it: the advantage stage reads :attr:`reward_coef` (a per-token reward penalty),
    the actor's loss :attr:`loss_coef`; at most one of them is non-zero."""

    coef: float = 0.0
    kind: str = "low_var_kl"
    in_reward: bool = False

    @property
    def reward_coef(self) -> float:
        return self.coef if self.in_reward else 0.0

    @property
    def loss_coef(self) -> float:
        return 0.0 if self.in_reward else self.coef


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return logp - ref_logp


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    d = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)


KL_ESTIMATORS: Registry[Callable[[Tensor, Tensor], Tensor]] = Registry("KL estimator")
KL_ESTIMATORS.register("kl", kl_k1)
KL_ESTIMATORS.register("mse", kl_k2)
KL_ESTIMATORS.register("low_var_kl", kl_k3)


def get_kl_estimator(name: str) -> Callable[[Tensor, Tensor], Tensor]:
    """The KL estimator registered as ``name``; unknown names raise UnknownNameError listing the known ones."""
    return KL_ESTIMATORS.get(name)


def kl_penalty(*, logp: Tensor, ref_logp: Tensor, response_mask: Tensor, kind: str) -> Tensor:
    """Per-token KL estimate (B, L), 0 outside ``response_mask`` (padding values are ignored)."""
    if ref_logp.shape != logp.shape or response_mask.shape != logp.shape:
        raise ValueError(
            f"logp {tuple(logp.shape)}, ref_logp {tuple(ref_logp.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must have the same shape"
        )
    est = get_kl_estimator(kind)
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    kl = est(torch.where(mask, logp, zero), torch.where(mask, ref_logp, zero))  # (B, L)
    return torch.where(mask, kl, zero)


def kl_reward(*, rewards: Tensor, response_mask: Tensor, logp: Tensor, ref_logp: Tensor, kind: str,
              coef: float) -> Tensor:  # fmt: skip
    """Token rewards (B, L) = step reward on the row's last response token - coef * KL per token.

    ``rewards`` is (B,) or already (B, L); ``logp`` is the sampling policy's log-probs. The result is
    a valid ``rewards`` argument for every advantage estimator. No gradient flows."""
    with torch.no_grad():
        kl = kl_penalty(logp=logp, ref_logp=ref_logp, response_mask=response_mask, kind=kind)
        if rewards.dim() == 1:
            rewards = place_on_last_token(rewards.to(kl.dtype), response_mask)
        elif rewards.shape != kl.shape:
            raise ValueError(f"rewards must be (B,) or {tuple(kl.shape)}, got {tuple(rewards.shape)}")
        return torch.where(response_mask.bool(), rewards - coef * kl, torch.zeros_like(kl))
