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

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from components.registry import Registry

__all__ = ["AGG_MODES", "aggregate_loss", "loss_normalisers"]

# mode -> (row_sum (B,), mask (B, L) bool, global_tokens, global_rows, norm_const) -> scalar
AggMode = Callable[..., Tensor]
AGG_MODES: Registry[AggMode] = Registry("loss aggregation mode")


@AGG_MODES.register("token-mean")
def _token_mean(row_sum: Tensor, mask: Tensor, global_tokens, global_rows, norm_const) -> Tensor:
    n = float(mask.sum()) if global_tokens is None else float(global_tokens)
    return row_sum.sum() / max(n, 1.0)


@AGG_MODES.register("seq-mean-token-mean")
def _seq_mean_token_mean(row_sum: Tensor, mask: Tensor, global_tokens, global_rows, norm_const) -> Tensor:
    rows = float(mask.any(-1).sum()) if global_rows is None else float(global_rows)
    row_mean = row_sum / mask.sum(-1).clamp(min=1)  # (B,), 0 for empty rows
    return row_mean.sum() / max(rows, 1.0)


@AGG_MODES.register("seq-mean-token-sum")
def _seq_mean_token_sum(row_sum: Tensor, mask: Tensor, global_tokens, global_rows, norm_const) -> Tensor:
    rows = float(mask.any(-1).sum()) if global_rows is None else float(global_rows)
    return row_sum.sum() / max(rows, 1.0)


@AGG_MODES.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(row_sum: Tensor, mask: Tensor, global_tokens, global_rows, norm_const) -> Tensor:
    if norm_const is None or not norm_const > 0:
        raise ValueError(
            f"seq-mean-token-sum-norm needs norm_const > 0 (e.g. the max response length), got {norm_const}"
        )
    return row_sum.sum() / float(norm_const)


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
    agg = AGG_MODES.get(mode)
    if loss.shape != response_mask.shape or loss.dim() != 2:
        shapes = f"loss {tuple(loss.shape)} and response_mask {tuple(response_mask.shape)}"
        raise ValueError(f"{shapes} must both be (B, L)")
    mask = response_mask.bool()
    token_loss = torch.where(mask, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))  # (B, L)
    return agg(token_loss.sum(-1), mask, global_tokens, global_rows, norm_const)
