"""Full weights of a DeepSpeed engine whose parameters ZeRO-3 partitions across the ranks.

Under ZeRO stage 3 each rank holds a shard of every parameter (``engine.module``'s tensors are empty
outside a forward): whatever reads whole weights (the weight sync to the rollout engine, the final
HF model, the checkpoint's HF files) must gather them, and a gather is a collective that every rank
of the world joins. With ZeRO 0-2 these functions read the module as it is and talk to no other rank.

- :func:`gathered`: a context in which ``engine.module`` holds its full parameters on every rank
  (``deepspeed.zero.GatheredParameters`` over all of them; a no-op below stage 3).
- :func:`full_state_dict`: the module's full state dict on rank 0 (CPU tensors), None on the other
  ranks. Without LoRA it is DeepSpeed's own ``_zero3_consolidated_16bit_state_dict``, which gathers
  one module at a time (the peak is one layer, not the model) and keeps tied weights tied; with LoRA
  the whole model is gathered at once and the adapters merged (components.train.lora.merged_state_dict).

What it does not do: gather optimizer state (DeepSpeed's ``save_checkpoint`` writes each rank's
shard itself), or stream weights to the rollout engine layer by layer (rank 0 holds the whole state
dict in CPU memory for the sync).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from components.train.distributed import dp_rank_world

__all__ = ["full_state_dict", "gathered", "is_zero3"]


def is_zero3(engine: Any) -> bool:
    return engine.zero_optimization_stage() == 3


def gathered(engine: Any) -> contextlib.AbstractContextManager:
    """Context in which ``engine.module`` holds full weights (ZeRO-3 gathers them on every rank; read
    only: changes inside are not written back to the shards)."""
    if is_zero3(engine):
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None)
    return contextlib.nullcontext()


def full_state_dict(engine: Any, peft_model: Any | None = None) -> dict[str, torch.Tensor] | None:
    """ZeRO-3 only, on every rank: ``engine.module``'s full state dict (with ``peft_model``, its
    wrapper, the merged weights under the base model's names) on rank 0, None on the others."""
    if not is_zero3(engine):
        raise ValueError(
            f"full_state_dict: the engine runs ZeRO stage {engine.zero_optimization_stage()}, not 3"
        )
    rank = dp_rank_world()[0]
    if peft_model is None:
        return engine._zero3_consolidated_16bit_state_dict()  # rank 0: the dict; others: None
    from components.train.lora import merged_state_dict

    with gathered(engine):  # the merge reads W, A and B of each adapted layer
        if rank != 0:
            return None
        return {k: v.detach().to("cpu", copy=True) for k, v in merged_state_dict(peft_model).items()}
