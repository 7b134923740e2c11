"""Supervised fine-tuning: token-mean next-token cross-entropy over a whole optimizer batch.

What it does:
- ``split_micro_batches``: cut a collated batch (``input_ids``/``labels``/``attention_mask``, (B, T))
  into micro-batches of at most ``micro_batch_size`` rows.
- ``token_nll_sum``: summed next-token negative log-likelihood over the labelled positions
  (``labels != -100``, shifted by one) and their count, from the final hidden states: the output
  head runs on the labelled positions only (on the default about half of the forwarded positions
  are prompt, tool output or padding, whose logits the loss never reads).
- ``sft_loss_fn``: a ``train_step`` loss function whose micro-batch loss is that sum divided by the
  number of labelled tokens in the WHOLE optimizer batch (all micro-batches, whatever rank trains them), so the
  update is the same however the batch is cut into micro-batches.
- ``common_prefix``: the micro-batch's rows all start with the same system prompt and tool listing
  (about 65 of ~150 tokens on the embedded default). When they share at least ``min_prefix`` tokens
  before the first labelled one, the loss forwards that prefix once and every row's rest on top of
  its keys/values (``components.train.policy.shared_prefix_hidden``, as the RL update does): the same
  loss and gradients up to float rounding, about 30% fewer tokens forwarded.
- ``run_sft``: ``steps`` optimizer steps with a tqdm bar showing the loss; each step's metrics
  (loss, grad_norm, lr, tokens/s, ...) go to ``on_step(step, metrics)`` and are returned.

What it does not do: tokenise, collate or pad (``components.model.sft_data``), save checkpoints
(``components.train.checkpoint``), or log to MLflow (the flow does, from ``on_step``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import torch
from tqdm.auto import tqdm

from components.device import model_device, to_device
from components.train.distributed import dp_rank_world
from components.train.engine import train_step
from components.train.policy import SharedPrefix, head_logits, shared_prefix_hidden

__all__ = [
    "IGNORE_INDEX",
    "common_prefix",
    "count_label_tokens",
    "run_sft",
    "sft_loss_fn",
    "split_micro_batches",
    "token_nll_sum",
]

IGNORE_INDEX = -100
_KEYS = ("input_ids", "labels", "attention_mask")

Batch = Mapping[str, torch.Tensor]


def _check_batch(batch: Batch, where: str) -> None:
    if not isinstance(batch, Mapping):
        raise TypeError(f"{where}: expected a dict with {list(_KEYS)}, got {type(batch).__name__}")
    missing = [k for k in _KEYS if k not in batch]
    if missing:
        raise KeyError(f"{where}: missing keys {missing} (has {sorted(batch)})")
    shape = tuple(batch["input_ids"].shape)
    if len(shape) != 2:
        raise ValueError(f"{where}: input_ids must be (B, T), got shape {shape}")
    for k in ("labels", "attention_mask"):
        if tuple(batch[k].shape) != shape:
            raise ValueError(f"{where}: {k} has shape {tuple(batch[k].shape)}, input_ids has {shape}")


def split_micro_batches(batch: Batch, micro_batch_size: int) -> list[dict[str, torch.Tensor]]:
    """Rows of ``batch`` (tensors (B, T)) in consecutive micro-batches of ``micro_batch_size`` rows."""
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size!r} must be a positive int")
    _check_batch(batch, "batch")
    n = batch["input_ids"].shape[0]
    if n == 0:
        raise ValueError("batch has no rows")
    return [{k: v[i : i + micro_batch_size] for k, v in batch.items()} for i in range(0, n, micro_batch_size)]


def count_label_tokens(labels: torch.Tensor) -> int:
    """Number of positions that are predicted: labels[:, 1:] != -100. labels: (B, T)."""
    return int((labels[:, 1:] != IGNORE_INDEX).sum())


def token_nll_sum(
    *, hidden: torch.Tensor, labels: torch.Tensor, head: torch.nn.Module
) -> tuple[torch.Tensor, int]:
    """Summed next-token NLL over labelled positions, and their count.

    hidden: (B, T, H) final hidden states, position t predicts token t+1; labels: (B, T), IGNORE_INDEX
    where not trained; head: the output embedding, (N, H) -> (N, V) logits, applied to the N
    predicting positions only. Computed in fp32 whatever the model dtype.
    """
    if hidden.ndim != 3 or labels.shape != hidden.shape[:2]:
        raise ValueError(
            f"hidden (B, T, H) {tuple(hidden.shape)} and labels (B, T) {tuple(labels.shape)} disagree"
        )
    targets = labels[:, 1:]  # (B, T-1)
    keep = targets != IGNORE_INDEX
    logits = head_logits(head, hidden[:, :-1][keep])  # (N, V) fp32
    nll_sum = torch.nn.functional.cross_entropy(logits, targets[keep], reduction="sum")
    return nll_sum, int(keep.sum())


def common_prefix(batch: Batch, min_prefix: int = 8) -> SharedPrefix | None:
    """The rows of ``batch`` as one shared prefix + their own suffixes, or None when sharing does not pay.

    The prefix is the longest run of leading tokens every row has, cut so that no row's first
    labelled token is predicted from it (the prefix's logits are never needed) and every row keeps
    at least one token of its own; shorter than ``min_prefix``, or a single row: None."""
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]  # (B, T)
    B = ids.shape[0]
    if B < 2:
        return None
    same = (ids == ids[:1]).all(dim=0) & (mask == 1).all(dim=0)  # (T,) column shared by every row
    lcp = int(same.long().cumprod(0).sum())
    first_label = int((labels != IGNORE_INDEX).long().argmax(dim=1).min())
    n = min(lcp, first_label - 1, int(mask.sum(1).min()) - 1)
    if n < min_prefix:
        return None
    return SharedPrefix(
        prefix_ids=ids[:1, :n],
        prefix_mask=mask[:1, :n],
        group=torch.zeros(B, dtype=torch.long),
        length=torch.full((B,), n, dtype=torch.long),
        suffix_ids=ids[:, n:],
        suffix_mask=mask[:, n:],
    )


def sft_hidden(model: torch.nn.Module, micro_batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(final hidden states, the labels they predict, forwarded tokens) of ``micro_batch`` (CPU tensors,
    moved to the model's device), on the rows' common prefix when they have one."""
    batch = to_device({k: micro_batch[k] for k in _KEYS}, model_device(model))
    shared = common_prefix(batch)
    decoder = model.get_decoder()
    if shared is None:
        hidden = decoder(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
        return hidden, batch["labels"], batch["attention_mask"].sum()
    # tokens from the prefix on: positions >= P predict tokens > P, all the loss needs
    _, hidden = shared_prefix_hidden(decoder, shared)  # (B, T - P, H)
    labels = batch["labels"][:, shared.prefix_ids.shape[1] :]
    return hidden, labels, shared.prefix_mask.sum() + shared.suffix_mask.sum()


def sft_loss_fn(
    engine: Any, micro_batch: Batch, *, normaliser: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """``train_step`` loss: this micro-batch's summed NLL / ``normaliser`` (labelled tokens in the batch),
    forwarded on the rows' common prefix when they have one (:func:`common_prefix`)."""
    model = engine.module
    hidden, labels, n_forwarded = sft_hidden(model, micro_batch)
    nll_sum, n_labels = token_nll_sum(hidden=hidden, labels=labels, head=model.get_output_embeddings())
    return nll_sum / normaliser, {
        "n_label_tokens": float(n_labels),
        "n_tokens": float(micro_batch["attention_mask"].sum()),
        "n_forwarded_tokens": float(n_forwarded),
    }


def run_sft(
    engine: Any,
    batches_iter: Iterable[Sequence[Batch]],
    *,
    steps: int,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    progress: bool = True,
) -> list[dict[str, float]]:
    """Train ``steps`` optimizer steps; each item of ``batches_iter`` is one optimizer batch given as a
    list of micro-batches (dicts of (B, T) tensors ``input_ids``, ``labels``, ``attention_mask``).

    Loss = summed NLL over labelled tokens / labelled tokens in the whole batch. Data parallel: every
    rank passes the whole batch and trains its share of the micro-batches (``train_step``), so the
    update is the same for any world size. A batch with no labelled
    token raises. Returns one metrics dict per step (step numbers start at 1); skipped steps (non-finite
    loss/gradient) are included with ``skipped=1``.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be a positive int")
    is_main = dp_rank_world()[0] == 0
    history: list[dict[str, float]] = []
    it = iter(batches_iter)
    bar = tqdm(total=steps, desc="sft", disable=not (progress and is_main), dynamic_ncols=True)
    try:
        for step in range(1, steps + 1):
            try:
                micro_batches = list(next(it))
            except StopIteration:
                raise ValueError(f"batches_iter ran out after {step - 1} of steps={steps} batches") from None
            for j, mb in enumerate(micro_batches):
                _check_batch(mb, f"step {step} micro-batch {j}")
            total = sum(count_label_tokens(mb["labels"]) for mb in micro_batches)
            if total == 0:
                raise ValueError(
                    f"step {step}: the batch has no labelled tokens (all labels are {IGNORE_INDEX})"
                )
            start = time.perf_counter()
            metrics = train_step(engine, micro_batches, partial(sft_loss_fn, normaliser=total))
            elapsed = time.perf_counter() - start
            metrics["tokens_per_s"] = metrics["n_tokens"] / max(elapsed, 1e-9)
            history.append(metrics)
            if on_step is not None:
                on_step(step, metrics)
            bar.set_postfix(loss=f"{metrics['loss']:.4f}", lr=f"{metrics['lr']:.2e}", refresh=False)
            bar.update(1)
    finally:
        bar.close()
    return history
