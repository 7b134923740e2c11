"""Turn a per-token loss (B, L) into one number, invariant to micro-batching.

Modes (docs/algorithms.md):
``token-mean``              sum over valid tokens / number of valid tokens
``seq-mean-token-mean``     mean over rows of each row's token mean (each step row weighs the same)
``seq-mean-token-sum``      mean over rows of each row's token sum
``seq-mean-token-sum-norm`` sum over rows and tokens / a constant (max response length; Dr.GRPO)

Gradient accumulation: compute the counts of the whole mini-batch once with
``loss_normalisers(response_masks=[...all micro-batch masks...], norm_const=...)`` and pass them to
every micro-batch's ``aggregate_loss(..., **norms)``; the sum of the micro-batch losses then equals
the full mini-batch loss (and so do the gradients). "Rows" counts rows with at least one valid token.

Does not: all-reduce across data-parallel ranks, or undo an engine's own scaling. If the counts are
summed over W ranks and the engine averages gradients over ranks, multiply the loss by W; if the
engine divides the loss by its gradient-accumulation steps (DeepSpeed does), multiply that back too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["AGG_MODES", "aggregate_loss", "loss_normalisers"]

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def loss_normalisers(
    *, response_masks: Tensor | Sequence[Tensor], norm_const: float | None = None
) -> dict[str, float | None]:
    """Global counts of a mini-batch given as one mask (B, L) or its micro-batch masks:
    {"global_tokens": valid tokens, "global_rows": rows with a valid token, "norm_const": norm_const}."""
    masks = [response_masks] if isinstance(response_masks, Tensor) else list(response_masks)
    tokens = sum(float(m.bool().sum()) for m in masks)
    rows = sum(float(m.bool().any(-1).sum()) for m in masks)
    return {"global_tokens": tokens, "global_rows": rows, "norm_const": norm_const}


def aggregate_loss(
    *,
    loss: Tensor,  # (B, L) per-token loss
    response_mask: Tensor,  # (B, L)
    mode: str,
    global_tokens: float | None = None,  # valid tokens in the whole mini-batch
    global_rows: float | None = None,  # rows with a valid token in the whole mini-batch
    norm_const: float | None = None,  # divisor of seq-mean-token-sum-norm
) -> Tensor:
    """One scalar from ``loss`` (B, L) over ``response_mask`` (B, L).

    ``global_tokens`` / ``global_rows``: the counts of the whole mini-batch (default: this batch's,
    i.e. no accumulation). ``norm_const`` is required by ``seq-mean-token-sum-norm``. A zero count
    gives a zero loss (nothing to learn from), not NaN."""
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; valid: {list(AGG_MODES)}")
    if loss.shape != response_mask.shape or loss.dim() != 2:
        shapes = f"loss {tuple(loss.shape)} and response_mask {tuple(response_mask.shape)}"
        raise ValueError(f"{shapes} must both be (B, L)")
    mask = response_mask.bool()
    token_loss = torch.where(mask, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))  # (B, L)
    row_sum = token_loss.sum(-1)  # (B,)

    if mode == "token-mean":
        n = float(mask.sum()) if global_tokens is None else float(global_tokens)
        return row_sum.sum() / max(n, 1.0)
    if mode == "seq-mean-token-sum-norm":
        if norm_const is None or not norm_const > 0:
            raise ValueError(
                "seq-mean-token-sum-norm needs norm_const > 0 (e.g. the max response length), "
                f"got {norm_const}"
            )
        return row_sum.sum() / float(norm_const)
    rows = float(mask.any(-1).sum()) if global_rows is None else float(global_rows)
    if mode == "seq-mean-token-mean":
        row_mean = row_sum / mask.sum(-1).clamp(min=1)  # (B,), 0 for empty rows
        return row_mean.sum() / max(rows, 1.0)
    return row_sum.sum() / max(rows, 1.0)  # seq-mean-token-sum
