"""The DeepSpeed engine wrapper: a pure config builder, the engine factory and one optimizer step.

What it does:
- ``make_ds_config``: the DeepSpeed config dict from flat arguments (AdamW with ``torch_adam`` so no
  C++ op is compiled, gradient clipping, ZeRO stage, a ``bf16`` section for bf16). Pure.
- ``lr_factor``: the learning-rate multiplier of update k (linear warmup, then linear decay to 0 at
  ``total_steps`` or constant). Pure; ``build_engine`` hands it to DeepSpeed as a torch ``LambdaLR``.
- ``build_engine``: joins (or starts) the distributed world and wraps a model in a DeepSpeed engine.
  Any number of engines can live in one process (the RL trainer holds an actor and a critic).
- ``train_step``: one optimizer step over a list of micro-batches with a caller-supplied
  ``loss_fn(engine, micro_batch) -> (loss, metrics)``. The caller has ALREADY divided each micro-batch
  loss by the global normaliser of the whole optimizer batch, so gradients are plainly summed over
  micro-batches: ``engine.backward(loss, scale_wrt_gas=False)`` switches off DeepSpeed's division by
  ``gradient_accumulation_steps``, and the accumulation boundary is set explicitly, so any number of
  micro-batches makes exactly one update. A non-finite loss or gradient skips the whole update
  (weights, optimizer state and learning-rate schedule unchanged) and is reported as ``skipped: 1``.
  Data parallel: every rank passes the WHOLE optimizer batch; rank r of W trains micro-batches
  r, r + W, ... (a rank left without one forwards the first at weight 0, so it still meets the others
  in the gradient all-reduce; under ZeRO-3, where each forward gathers the layers' shards from every
  rank, a rank with fewer forwards as many at weight 0), its backward is scaled by W because
  DeepSpeed averages gradients over ranks (so the update is the sum over the batch, as with one
  process), and the loss and metrics are summed over ranks: the same update and the same numbers for
  any world size.

What it does not do: compute losses, split batches or save checkpoints (``sft``, ``checkpoint``).

Departures from DeepSpeed defaults:
1. DeepSpeed divides every micro-batch loss by ``gradient_accumulation_steps``; we do not (see above).
   ``gradient_accumulation_steps`` in the config is informational (it sizes ``train_batch_size``).
2. DeepSpeed skips a non-finite update only inside its ZeRO/bf16 optimizers; plain fp32 ZeRO-0 would
   apply it. We check that path ourselves, and we turn a non-finite *loss* into non-finite gradients
   (``loss * nan``) so every rank and every optimizer wrapper takes the same skip decision.
3. The schedule is a torch ``LambdaLR`` (``lr_factor``), not DeepSpeed's WarmupLR/WarmupDecayLR:
   in DeepSpeed 0.19 those run the first two updates at lr 0, force at least 2 warmup steps, and with
   no warmup (min lr = max lr) never decay. Update k (0-based) runs at lr * (k + 1) / W during a
   warmup of W updates (no update at lr 0), then lr * (T - k) / (T - W) (``linear_decay``, T =
   ``total_steps``), lr (``constant``), or lr until the last D updates and then lr * (T - k) / D
   (``wsd``, warmup-stable-decay, D = ``decay_steps`` or T - W when fewer). DeepSpeed still steps it after each applied
   update and saves it in engine checkpoints.
4. ``amp_bf16`` is not a DeepSpeed mode: the engine is fp32 (weights, gradients, optimizer) and
   ``train_step`` runs each ``loss_fn`` under bf16 autocast (``components.precision``); the backward
   pass runs outside the autocast region, as torch recommends. ``engine.steprl_dtype`` records it.
5. ZeRO-3 accumulates a micro-batch's gradients into the step's (instead of overwriting them) only
   once its micro-batch counter moved, which ``engine.forward`` does; the loss functions call
   ``engine.module``, so ``train_step`` makes that call (``optimizer.clear_backward_seen_flag``) before
   each micro-batch itself. Without it an update of several micro-batches kept the last one's.
6. bf16 with ZeRO >= 1 accumulates gradients in fp32 (``data_types.grad_accum_dtype``); DeepSpeed cannot
   do that with ZeRO-0, where bf16 gradients accumulate in bf16: prefer ZeRO >= 1 for bf16.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Literal, get_args

import torch

from components.device import to_device
from components.precision import TrainDtype, autocast, resolve_train_dtype, use_tf32
from components.train.distributed import dp_rank_world, init_distributed

__all__ = [
    "LossFn",
    "LrSchedule",
    "autocast_for",
    "build_engine",
    "lr_factor",
    "make_ds_config",
    "train_step",
]

# loss_fn(engine, micro_batch) -> (scalar loss already divided by the global normaliser, metrics)
LossFn = Callable[[Any, Any], "tuple[torch.Tensor, Mapping[str, float | torch.Tensor]]"]

_DTYPES = get_args(TrainDtype)
LrSchedule = Literal["linear_decay", "constant", "wsd"]
_SCHEDULES = get_args(LrSchedule)


def _check_number(name: str, value: Any, *, low: float, strict: bool, integer: bool = False) -> None:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        want = "an int" if integer else "a number"
        raise ValueError(f"{name}={value!r} must be {want}")
    if not math.isfinite(value) or (value <= low if strict else value < low):
        raise ValueError(f"{name}={value!r} must be {'>' if strict else '>='} {low}")


def make_ds_config(
    *,
    lr: float,
    weight_decay: float,
    zero_stage: int,
    dtype: TrainDtype,
    grad_clip: float,
    micro_batch_size: int,
    grad_accum_steps: int,
    warmup_steps: int,
    total_steps: int,
    world_size: int = 1,
    lr_schedule: LrSchedule = "linear_decay",
    decay_steps: int = 0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> dict[str, Any]:
    """The DeepSpeed config dict for these settings (pure; raises ValueError naming a bad argument).

    ``warmup_steps``/``total_steps``/``lr_schedule`` are validated here (one place for every bad
    argument) but the schedule itself is :func:`lr_factor`, not a config section.
    """
    _check_number("lr", lr, low=0.0, strict=True)
    _check_number("weight_decay", weight_decay, low=0.0, strict=False)
    _check_number("grad_clip", grad_clip, low=0.0, strict=True)
    _check_number("eps", eps, low=0.0, strict=True)
    _check_number("micro_batch_size", micro_batch_size, low=1, strict=False, integer=True)
    _check_number("grad_accum_steps", grad_accum_steps, low=1, strict=False, integer=True)
    _check_number("warmup_steps", warmup_steps, low=0, strict=False, integer=True)
    _check_number("total_steps", total_steps, low=1, strict=False, integer=True)
    _check_number("world_size", world_size, low=1, strict=False, integer=True)
    if isinstance(zero_stage, bool) or zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={zero_stage!r} must be one of 0, 1, 2, 3")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} must be one of {list(_DTYPES)}")
    if lr_schedule not in _SCHEDULES:
        raise ValueError(f"lr_schedule={lr_schedule!r} must be one of {list(_SCHEDULES)}")
    if warmup_steps > total_steps:
        raise ValueError(f"warmup_steps={warmup_steps} > total_steps={total_steps}")
    _check_number("decay_steps", decay_steps, low=0, strict=False, integer=True)
    if lr_schedule == "wsd" and decay_steps < 1:
        raise ValueError(f"decay_steps={decay_steps} must be at least 1 for lr_schedule='wsd'")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"betas={betas!r} must be two numbers in [0, 1)")

    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": grad_accum_steps,
        "train_batch_size": micro_batch_size * grad_accum_steps * world_size,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": lr,
                "betas": list(betas),
                "eps": eps,
                "weight_decay": weight_decay,
                "torch_adam": True,
            },
        },
        "gradient_clipping": grad_clip,
        "zero_optimization": {"stage": zero_stage},
        "steps_per_print": 2**31 - 1,  # we log; silence DeepSpeed's own progress lines
        "wall_clock_breakdown": False,
    }
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
        if zero_stage >= 1:
            # Accumulate micro-batch gradients in fp32 (ZeRO >= 1 only; DeepSpeed's ZeRO-0 bf16 path
            # supports bf16 accumulation alone).
            config["data_types"] = {"grad_accum_dtype": "fp32"}
    if zero_stage == 3:
        # save_checkpoint/HF export gather the full weights themselves (components.train.checkpoint).
        config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = False
    return config


def lr_factor(
    step: int, *, warmup_steps: int, total_steps: int, lr_schedule: LrSchedule, decay_steps: int = 0
) -> float:
    """Multiplier of the base lr for update ``step`` (0-based).

    Warmup: (step + 1) / warmup_steps for step < warmup_steps. Then ``linear_decay``:
    (total_steps - step) / (total_steps - warmup_steps), 0 from ``total_steps`` on; ``constant``: 1;
    ``wsd`` (warmup-stable-decay, Hu et al. 2024, MiniCPM): 1 until the last D updates, then
    (total_steps - step) / D, with D = min(``decay_steps``, total_steps - warmup_steps).
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if lr_schedule == "constant":
        return 1.0
    if lr_schedule == "wsd":
        decay = min(decay_steps, total_steps - warmup_steps)
        return max(0.0, min(1.0, (total_steps - step) / max(1, decay)))
    if lr_schedule != "linear_decay":
        raise ValueError(f"lr_schedule={lr_schedule!r} must be one of {list(_SCHEDULES)}")
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices only; norms, biases (1-D) are not decayed."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_engine(
    model: torch.nn.Module,
    *,
    lr: float,
    weight_decay: float,
    zero_stage: int,
    dtype: TrainDtype | Literal["auto"],
    grad_clip: float,
    micro_batch_size: int,
    grad_accum_steps: int,
    warmup_steps: int,
    total_steps: int,
    lr_schedule: LrSchedule = "linear_decay",
    decay_steps: int = 0,
    eps: float = 1e-8,
) -> Any:
    """Wrap ``model`` in a DeepSpeed engine (gloo/CPU or NCCL/GPU, as the process was launched).

    Returns the ``deepspeed.DeepSpeedEngine``; ``engine.module`` is the (possibly bf16-cast) model, and
    ``engine.steprl_dtype`` the training dtype (read by :func:`autocast_for`).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"model {type(model).__name__} has no trainable parameters")
    dist = init_distributed()
    use_tf32(dtype, dist.device.type)  # auto on CUDA: TF32 fp32 matmuls
    dtype = resolve_train_dtype(dtype)
    config = make_ds_config(
        lr=lr,
        weight_decay=weight_decay,
        zero_stage=zero_stage,
        dtype=dtype,
        grad_clip=grad_clip,
        micro_batch_size=micro_batch_size,
        grad_accum_steps=grad_accum_steps,
        warmup_steps=warmup_steps,
        total_steps=total_steps,
        world_size=dist.world_size,
        lr_schedule=lr_schedule,
        decay_steps=decay_steps,
        eps=eps,
    )
    import deepspeed

    factor = partial(
        lr_factor,
        warmup_steps=warmup_steps,
        total_steps=total_steps,
        lr_schedule=lr_schedule,
        decay_steps=decay_steps,
    )
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        config=config,
        model_parameters=_param_groups(model, weight_decay),
        lr_scheduler=lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, factor),
    )
    engine.steprl_dtype = dtype
    return engine


def autocast_for(engine: Any) -> Any:
    """The forward-pass context of ``engine``'s training dtype (bf16 autocast under ``amp_bf16``)."""
    device_type = next(engine.module.parameters()).device.type
    return autocast(getattr(engine, "steprl_dtype", "fp32"), device_type)


def _is_plain_optimizer(engine: Any) -> bool:
    """True when DeepSpeed steps a bare torch optimizer (fp32, ZeRO-0): no built-in overflow skip."""
    return isinstance(engine.optimizer, torch.optim.Optimizer) and not hasattr(engine.optimizer, "overflow")


def _sum_over_ranks(loss_sum: float, summed: dict[str, float], engine: Any) -> tuple[float, dict[str, float]]:
    """``loss_sum`` and each metric summed over the data-parallel ranks (same keys on every rank)."""
    keys = sorted(summed)
    values = torch.tensor([loss_sum, *(summed[k] for k in keys)], dtype=torch.float64)
    values = to_device(values, next(engine.module.parameters()).device)  # NCCL reduces on the GPU
    torch.distributed.all_reduce(values)
    total = values.tolist()
    return total[0], dict(zip(keys, total[1:], strict=True))


def _grad_norm_plain(engine: Any) -> float:
    grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.nn.utils.get_total_norm(grads, norm_type=2.0))


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"loss_fn metric {name!r} must be a scalar, got shape {tuple(value.shape)}")
        return float(value.detach())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"loss_fn metric {name!r} must be a number or scalar tensor, got {type(value).__name__}")


def train_step(engine: Any, micro_batches: Sequence[Any], loss_fn: LossFn) -> dict[str, float]:
    """One optimizer update from ``micro_batches``; returns metrics.

    Each ``loss_fn`` loss must already be divided by the normaliser of the WHOLE batch: gradients are
    summed over micro-batches unscaled. Metrics from ``loss_fn`` are summed over micro-batches (so
    return per-batch contributions, e.g. normalised sums). Returned keys: ``loss`` (sum of micro-batch
    losses), ``grad_norm`` (before clipping; inf/nan when skipped), ``lr`` (used by this update),
    ``skipped`` (1.0 if the update was not applied), ``n_micro_batches``, ``step_time_s``, and the
    summed ``loss_fn`` metrics.
    """
    if isinstance(micro_batches, (str, bytes)) or not isinstance(micro_batches, Sequence):
        raise TypeError(f"micro_batches must be a list of micro-batches, got {type(micro_batches).__name__}")
    if len(micro_batches) == 0:
        raise ValueError("micro_batches is empty: an optimizer step needs at least one micro-batch")
    start = time.perf_counter()
    engine.train()
    lr = float(engine.get_lr()[0])
    rank, world = dp_rank_world()
    mine = [(mb, 1.0) for mb in micro_batches[rank::world]] or [(micro_batches[0], 0.0)]
    if world > 1 and engine.zero_optimization_stage() == 3:
        # every forward gathers each layer's shards from all ranks: every rank makes as many forwards
        # (a rank with one micro-batch fewer forwards the first again, at weight 0)
        mine += [(micro_batches[0], 0.0)] * (-(-len(micro_batches) // world) - len(mine))
    loss_sum = 0.0
    nonfinite_loss = False
    summed: dict[str, float] = {}
    n = len(mine)
    zero3 = engine.zero_optimization_stage() == 3
    for i, (micro_batch, weight) in enumerate(mine):
        engine.set_gradient_accumulation_boundary(i == n - 1)
        if zero3:  # what engine.forward does first: ZeRO-3 counts micro-batches there, to accumulate
            engine.optimizer.clear_backward_seen_flag()
        with autocast_for(engine):
            loss, metrics = loss_fn(engine, micro_batch)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError(f"loss_fn must return a scalar tensor loss, got {type(loss).__name__}")
        if not loss.requires_grad:
            raise ValueError(
                "loss_fn returned a loss that does not require grad (was it computed under no_grad?)"
            )
        value = float(loss.detach())
        if not math.isfinite(value):
            nonfinite_loss = True
            # Make the gradients non-finite too, so the skip is decided from them on every path/rank.
            loss = loss * float("nan")
        loss_sum += value * weight
        for key, v in metrics.items():
            summed[key] = summed.get(key, 0.0) + _as_float(key, v) * weight
        engine.backward((loss * (weight * world)).reshape(()), scale_wrt_gas=False)
    engine.set_gradient_accumulation_boundary(True)

    if _is_plain_optimizer(engine):
        grad_norm = _grad_norm_plain(engine)
        skipped = not math.isfinite(grad_norm)
        if skipped:
            engine.zero_grad()  # discard; the optimizer and the schedule never see this batch
            engine.skipped_steps += 1
            engine.global_steps += 1  # as DeepSpeed counts its own skipped (overflow) steps
        else:
            engine.step()
    else:
        before = engine.skipped_steps
        engine.step()
        skipped = engine.skipped_steps > before
        norm = engine.get_global_grad_norm()
        grad_norm = float(norm) if norm is not None else float("nan")
    if nonfinite_loss and not skipped:  # cannot happen unless a DeepSpeed wrapper stops checking
        raise RuntimeError("a non-finite loss produced an applied update; DeepSpeed did not skip it")
    if skipped and math.isfinite(grad_norm):
        grad_norm = float("nan")
    if world > 1:
        loss_sum, summed = _sum_over_ranks(loss_sum, summed, engine)
    return {
        "loss": loss_sum,
        "grad_norm": grad_norm,
        "lr": lr,
        "skipped": float(skipped),
        "n_micro_batches": float(len(micro_batches)),
        "step_time_s": time.perf_counter() - start,
        **summed,
    }
