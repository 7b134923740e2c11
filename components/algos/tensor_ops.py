"""Masked statistics and small tensor helpers shared by the advantage estimators.

Does: masked means, whitening (eps 1e-8), per-group mean/std with the singleton rule (mean 0, std 1),
reverse discounted sums along zero-padded rows, and placing a step reward on the row's last response
token. Does not: know about trajectories or steps (see ``step_layout``), or compute any advantage.

Departures from the usual formulas:
1. ``whiten`` of fewer than two elements only centres them (the unbiased std is undefined), so a
   single value whitens to 0 instead of NaN; flat values (the rule of 2.) whiten to exactly 0.
2. ``group_center`` gives exactly 0 to every member of a flat group (two or more values whose spread
   max - min is at most ``GROUP_FLAT_RTOL`` times the group's largest |x|): the float32 mean of equal
   values can miss them by an ulp, and a division by std + 1e-6 would blow that up.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "GROUP_STD_EPS",
    "WHITEN_EPS",
    "dense_ids",
    "discounted_reverse_cumsum",
    "group_center",
    "group_stats",
    "masked_mean",
    "per_token",
    "place_on_last_token",
    "shift_left",
    "whiten",
]

GROUP_STD_EPS = 1e-6  # A = (S - mean_g) / (std_g + GROUP_STD_EPS)
WHITEN_EPS = 1e-8  # whiten(x) = (x - mean) / (std + WHITEN_EPS)
GROUP_FLAT_RTOL = 1e-5  # a group is flat when max - min <= GROUP_FLAT_RTOL * max |x| (float32 eps ~1.2e-7)


def _flat(hi: Tensor, lo: Tensor) -> Tensor:
    """Whether values whose max is ``hi`` and min is ``lo`` are equal up to rounding: max - min at most
    ``GROUP_FLAT_RTOL`` times the largest |x| (elementwise over groups)."""
    return (hi - lo) <= GROUP_FLAT_RTOL * torch.maximum(hi.abs(), lo.abs())


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` where ``mask`` is true (0 where nothing is valid). Values outside the mask are
    ignored even if they are inf/NaN."""
    m = mask.bool()
    total = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if dim is None:
        return total.sum() / m.sum().clamp(min=1)
    return total.sum(dim) / m.sum(dim).clamp(min=1)


def whiten(x: Tensor, mask: Tensor) -> Tensor:
    """(x - mean) / (std + 1e-8) over the elements where ``mask`` is true; 0 elsewhere. std unbiased.
    Flat values (max - min <= GROUP_FLAT_RTOL * max |x|, as ``group_center``) whiten to exactly 0:
    their float32 mean misses them by an ulp, which divided by std + 1e-8 came out near +-1."""
    m = mask.bool()
    vals = x[m]  # (K,)
    if vals.numel() == 0:
        return torch.zeros_like(x)
    if vals.numel() > 1 and bool(_flat(vals.max(), vals.min())):
        return torch.zeros_like(x)
    mean = vals.mean()
    std = vals.std() if vals.numel() > 1 else torch.ones((), dtype=x.dtype, device=x.device)
    return torch.where(m, (x - mean) / (std + WHITEN_EPS), torch.zeros_like(x))


def dense_ids(*keys: Tensor) -> tuple[Tensor, int]:
    """Map rows of one or more (K,) integer keys to dense ids 0..G-1 (same key tuple -> same id)."""
    if len(keys) == 1:
        uniq, inv = torch.unique(keys[0], return_inverse=True)
    else:
        uniq, inv = torch.unique(torch.stack(keys, dim=1), dim=0, return_inverse=True)
    return inv, int(uniq.shape[0])


def group_stats(x: Tensor, group: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-element group mean, unbiased group std and group size of ``x`` (K,) grouped by dense ids
    ``group`` (K,). A group of one has mean 0 and std 1 (so (x - mean) / std = x)."""
    n_groups = int(group.max()) + 1
    count = torch.bincount(group, minlength=n_groups).to(x.dtype)  # (G,)
    mean = x.new_zeros(n_groups).index_add_(0, group, x) / count.clamp(min=1)  # (G,)
    dev = x - mean[group]  # (K,)
    var = x.new_zeros(n_groups).index_add_(0, group, dev * dev) / (count - 1).clamp(min=1)  # (G,)
    n = count[group]  # (K,)
    single = n == 1
    mean_k = torch.where(single, torch.zeros_like(x), mean[group])
    std_k = torch.where(single, torch.ones_like(x), var[group].sqrt())
    return mean_k, std_k, n


def group_center(x: Tensor, group: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """x - group mean, group std and group size (K,) each, of ``x`` (K,) grouped by dense ids
    ``group`` (K,), as ``group_stats`` (a group of one: x itself, std 1); the centred value is exactly
    0 in a flat group (max - min <= GROUP_FLAT_RTOL * max |x|, two or more members), so that
    (x - mean) / (std + eps) is 0 there at every magnitude of x."""
    mean, std, n = group_stats(x, group)
    n_groups = int(group.max()) + 1
    hi = x.new_zeros(n_groups).scatter_reduce_(0, group, x, "amax", include_self=False)  # (G,)
    lo = x.new_zeros(n_groups).scatter_reduce_(0, group, x, "amin", include_self=False)  # (G,)
    flat = _flat(hi, lo)[group] & (n > 1)  # (K,)
    return torch.where(flat, torch.zeros_like(x), x - mean), std, n


def discounted_reverse_cumsum(x: Tensor, factor: float) -> Tensor:
    """y[:, k] = x[:, k] + factor * y[:, k + 1], with y = 0 past the end. x: (N, P) -> (N, P).

    Rows are zero-padded at the end, so the padding contributes nothing (it is the "V = 0 after the
    final step" boundary when x holds TD errors)."""
    out = torch.empty_like(x)
    running = x.new_zeros(x.shape[0])  # (N,)
    for k in range(x.shape[1] - 1, -1, -1):
        running = x[:, k] + factor * running
        out[:, k] = running
    return out


def shift_left(x: Tensor) -> Tensor:
    """x[:, k + 1] at position k, 0 at the last position. (N, P) -> (N, P): the "next value"."""
    return torch.cat([x[:, 1:], x.new_zeros(x.shape[0], 1)], dim=1)


def per_token(x: Tensor, mask: Tensor) -> Tensor:
    """Broadcast a per-row value (B,) to every valid token of the row: (B, L), 0 outside ``mask``."""
    m = mask.bool()
    return torch.where(m, x[:, None].expand(m.shape), torch.zeros((), dtype=x.dtype, device=x.device))


def place_on_last_token(rewards: Tensor, mask: Tensor) -> Tensor:
    """Token rewards (B, L): each row's reward (B,) on its last valid token, 0 elsewhere.
    A row without valid tokens gets no reward (callers reject such rows)."""
    m = mask.bool()
    pos = torch.arange(1, m.shape[1] + 1, device=m.device)  # (L,)
    last = (m * pos).argmax(dim=1)  # (B,) index of the last valid token
    out = torch.zeros(m.shape, dtype=rewards.dtype, device=rewards.device)
    out[torch.arange(m.shape[0], device=m.device), last] = rewards
    return torch.where(m, out, torch.zeros_like(out))
