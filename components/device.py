"""Where a stage computes, and the one way anything gets there.

- ``stage_device``: the device of this process: ``cuda:LOCAL_RANK`` when CUDA is available and
  DeepSpeed's accelerator is CUDA (``DS_ACCELERATOR`` unset or ``cuda``), else ``cpu``. The DeepSpeed
  engines put their models there (``components.train.distributed`` reads it from here), and so do
  the models built outside DeepSpeed (the frozen reference, the ``hf`` rollout engine).
- ``model_device``: the device of a model = the device of its parameters. Everything that feeds a
  model moves its inputs to ``model_device(model)`` at the point of use, so a batch built on the CPU
  (``make_token_batch``, ``collate``) is right whatever device the model sits on.
- ``to_device``: the seam that moves a tensor, a dataclass of tensors (``TokenBatch``,
  ``SharedPrefix``, ``StepTensors``), or a dict/list/tuple of them. Nothing else calls ``.cuda()``.

What it does not do: pick GPUs for other ranks (the launcher does), or move models (callers do, with
``model.to(stage_device())``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import TypeVar

import torch

__all__ = ["model_device", "on_cuda", "stage_device", "to_device"]

T = TypeVar("T")


def stage_device() -> torch.device:
    """``cuda:LOCAL_RANK`` when CUDA is available and DeepSpeed's accelerator is CUDA, else ``cpu``."""
    if torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "cuda") == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def on_cuda() -> bool:
    """Whether this process computes on a CUDA device (:func:`stage_device`)."""
    return stage_device().type == "cuda"


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s (first) parameter."""
    return next(model.parameters()).device


def to_device(x: T, device: torch.device | str) -> T:
    """``x`` with every tensor in it on ``device``: a tensor, None, a dataclass instance (fields moved,
    same class), or a Mapping/list/tuple of these (recursively). A tensor already there is returned
    as it is; anything else (ints, strings) unchanged."""
    if isinstance(x, torch.Tensor):
        return x.to(device)  # type: ignore[return-value]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(
            x, **{f.name: to_device(getattr(x, f.name), device) for f in dataclasses.fields(x) if f.init}
        )
    if isinstance(x, Mapping):
        return {k: to_device(v, device) for k, v in x.items()}  # type: ignore[return-value]
    if isinstance(x, (list, tuple)):
        return type(x)(to_device(v, device) for v in x)  # type: ignore[return-value]
    return x
