"""Turn a per-token loss (B, L) into one number, invariant to micro-batching.

Modes (docs/algorithms.md):
``token-mean``              sum over valid tokens / number of valid tokens
``seq-mean-token-mean``     mean over rows of each row's token mean (each step row weighs the same)
``seq-mean-token-sum``      mean over rows of each row's token sum
``seq-mean-token-sum-norm`` sum over rows and tokens / a constant (max response length; Dr.GRPO)
``traj-mean-token-mean``    mean over trajectories of each trajectory's token mean (its step rows'
                            tokens pooled): every episode weighs the same whatever its number of turns,
                            as verl's ``seq-mean-token-mean`` does where one sequence is a whole
                            multi-turn episode (RAGEN's layout). Without trajectory ids each row is
                            its own trajectory (= ``seq-mean-token-mean``).

Gradient accumulation: compute the counts of the whole mini-batch once with
``loss_normalisers(response_masks=[...all micro-batch masks...], norm_const=..., traj_ids=[...])``
and pass them to every micro-batch's ``aggregate_loss(..., **norms, traj_ids=...)`` (the micro-batch's
own ids); the sum of the micro-batch losses then equals the full mini-batch loss (and so do the
gradients). "Rows" counts rows with at least one valid token, "trajectories" those with one.

Does not: all-reduce across data-parallel ranks, or undo an engine's own scaling. If the counts are
summed over W ranks and the engine averages gradients over ranks, multiply the loss by W; if the
engine divides the loss by its gradient-accumulation steps (DeepSpeed does), multiply that back too.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from components.registry import Registry

__all__ = ["AGG_MODES", "Counts", "aggregate_loss", "loss_normalisers"]


@dataclass(frozen=True)
class Counts:
    """What a mode divides by: the whole mini-batch's counts where given, else this batch's own."""

    mask: Tensor  # (B, L) bool
    tokens: float  # valid tokens
    rows: float  # rows with a valid token
    norm_const: float | None
    row_traj_tokens: Tensor  # (B,) valid tokens of each row's trajectory
    trajs: float  # trajectories with a valid token


# mode -> (row_sum (B,): each row's summed token loss, Counts) -> scalar
AggMode = Callable[[Tensor, Counts], Tensor]
AGG_MODES: Registry[AggMode] = Registry("loss aggregation mode")


@AGG_MODES.register("token-mean")
def _token_mean(row_sum: Tensor, c: Counts) -> Tensor:
    return row_sum.sum() / max(c.tokens, 1.0)


@AGG_MODES.register("seq-mean-token-mean")
def _seq_mean_token_mean(row_sum: Tensor, c: Counts) -> Tensor:
    row_mean = row_sum / c.mask.sum(-1).clamp(min=1)  # (B,), 0 for empty rows
    return row_mean.sum() / max(c.rows, 1.0)


@AGG_MODES.register("seq-mean-token-sum")
def _seq_mean_token_sum(row_sum: Tensor, c: Counts) -> Tensor:
    return row_sum.sum() / max(c.rows, 1.0)


@AGG_MODES.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(row_sum: Tensor, c: Counts) -> Tensor:
    if c.norm_const is None or not c.norm_const > 0:
        raise ValueError(
            f"seq-mean-token-sum-norm needs norm_const > 0 (e.g. the max response length), got {c.norm_const}"
        )
    return row_sum.sum() / float(c.norm_const)


@AGG_MODES.register("traj-mean-token-mean")
def _traj_mean_token_mean(row_sum: Tensor, c: Counts) -> Tensor:
    per_traj = row_sum / c.row_traj_tokens.clamp(min=1)  # 0 for empty trajectories
    return per_traj.sum() / max(c.trajs, 1.0)


def _traj_tokens(masks: Sequence[Tensor], traj_ids: Sequence[Sequence[Hashable]]) -> dict[Hashable, float]:
    """Valid tokens per trajectory id over ``masks``, ``traj_ids[j]`` naming the rows of ``masks[j]``."""
    if len(traj_ids) != len(masks):
        raise ValueError(f"traj_ids: {len(traj_ids)} lists for {len(masks)} micro-batch masks")
    counts: dict[Hashable, float] = {}
    for j, (m, ids) in enumerate(zip(masks, traj_ids)):
        if len(ids) != len(m):
            raise ValueError(f"traj_ids of micro-batch {j}: {len(ids)} ids for {len(m)} rows")
        for t, n in zip(ids, m.bool().sum(-1).tolist()):
            counts[t] = counts.get(t, 0.0) + float(n)
    return counts


def loss_normalisers(
    *,
    response_masks: Tensor | Sequence[Tensor],
    norm_const: float | None = None,
    traj_ids: Sequence[Hashable] | Sequence[Sequence[Hashable]] | None = None,
) -> dict:
    """Global counts of a mini-batch given as one mask (B, L) or its micro-batch masks:
    {"global_tokens": valid tokens, "global_rows": rows with a valid token, "norm_const": norm_const,
    "traj_tokens": valid tokens per trajectory id}. ``traj_ids``: each row's trajectory id (one list
    per micro-batch mask; one list for one mask); None: every row is a trajectory of its own."""
    single = isinstance(response_masks, Tensor)
    masks = [response_masks] if single else list(response_masks)
    if traj_ids is not None and single:
        traj_ids = [traj_ids]  # type: ignore[list-item]
    tokens = sum(float(m.bool().sum()) for m in masks)
    rows = sum(float(m.bool().any(-1).sum()) for m in masks)
    return {
        "global_tokens": tokens,
        "global_rows": rows,
        "norm_const": norm_const,
        "traj_tokens": _traj_tokens(masks, traj_ids) if traj_ids is not None else None,  # type: ignore[arg-type]
    }


def aggregate_loss(
    *,
    loss: Tensor,  # (B, L) per-token loss
    response_mask: Tensor,  # (B, L)
    mode: str,
    global_tokens: float | None = None,  # valid tokens in the whole mini-batch
    global_rows: float | None = None,  # rows with a valid token in the whole mini-batch
    norm_const: float | None = None,  # divisor of seq-mean-token-sum-norm
    traj_tokens: Mapping[Hashable, float] | None = None,  # valid tokens per trajectory, whole mini-batch
    traj_ids: Sequence[Hashable] | None = None,  # this batch's rows' trajectory ids
) -> Tensor:
    """One scalar from ``loss`` (B, L) over ``response_mask`` (B, L).

    ``global_tokens`` / ``global_rows`` / ``traj_tokens``: the counts of the whole mini-batch
    (default: this batch's, i.e. no accumulation). ``traj_ids`` (one per row) name the rows'
    trajectories for ``traj-mean-token-mean`` (without them every row is a trajectory of its own).
    ``norm_const`` is required by ``seq-mean-token-sum-norm``. A zero count gives a zero loss
    (nothing to learn from), not NaN."""
    agg = AGG_MODES.get(mode)
    if loss.shape != response_mask.shape or loss.dim() != 2:
        shapes = f"loss {tuple(loss.shape)} and response_mask {tuple(response_mask.shape)}"
        raise ValueError(f"{shapes} must both be (B, L)")
    mask = response_mask.bool()
    token_loss = torch.where(mask, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))  # (B, L)
    rows = float(mask.any(-1).sum()) if global_rows is None else float(global_rows)
    if traj_ids is None:  # every row a trajectory of its own
        row_traj_tokens, trajs = mask.sum(-1).to(loss.dtype), rows
    else:
        ids = list(traj_ids)
        if len(ids) != len(mask):
            raise ValueError(f"traj_ids: {len(ids)} ids for {len(mask)} rows")
        if traj_tokens is None:
            traj_tokens = _traj_tokens([mask], [ids])
        missing = [t for t in ids if t not in traj_tokens]
        if missing:
            raise ValueError(f"traj_ids {missing[:3]} are not in traj_tokens (the mini-batch's counts)")
        row_traj_tokens = torch.tensor(
            [float(traj_tokens[t]) for t in ids], dtype=loss.dtype, device=loss.device
        )
        trajs = float(sum(1 for n in traj_tokens.values() if n > 0))
    tokens = float(mask.sum()) if global_tokens is None else float(global_tokens)
    counts = Counts(mask, tokens, rows, norm_const, row_traj_tokens, trajs)
    return agg(token_loss.sum(-1), counts)
