"""Numeric precision of training and generation: what ``auto`` means on this hardware, and autocast.

Training dtypes (``deepspeed.dtype``):
- ``fp32``: fp32 weights, fp32 arithmetic.
- ``amp_bf16``: fp32 weights, gradients and optimizer state (the master copy); the backbone's forward
  and backward run under ``torch.autocast`` in bf16 (matmuls and attention), while the output head,
  the softmax, the losses and the critic's value head stay in fp32 (``components.train.policy.head_logits``).
- ``bf16``: DeepSpeed's bf16 mode: bf16 weights in the model, fp32 master weights in the optimizer
  (ZeRO >= 1 accumulates gradients in fp32); the usual choice on GPUs.
- ``auto``: ``amp_bf16`` where the hardware multiplies bf16 natively, else ``fp32``.

TF32: under ``auto`` on CUDA, ``use_tf32`` lets fp32 matmuls use TF32 tensor cores
(``torch.set_float32_matmul_precision("high")``, which also sets ``torch.backends.cuda.matmul.allow_tf32``):
the fp32 parts (the output head, the value head, and fp32 master weights' matmuls) run several times faster
on Ampere and later, with a 10-bit mantissa in the multiply and fp32 accumulation.
``build_engine`` calls it. On a CPU it changes nothing (TF32 is a GPU format); explicit ``fp32`` never
turns it on.

Generation dtypes (``rollout.dtype``): ``float32``, ``bfloat16``, or ``auto`` (``bfloat16`` where the
hardware has it, else ``float32``).

"Has bf16" means a CUDA device that supports it, or a CPU with AVX-512 BF16 or AMX-BF16: on a CPU
without them bf16 matmuls are emulated and several times *slower* than fp32, so ``auto`` never picks
bf16 there. What this module does not do: choose per-layer precision or scale losses (bf16 needs no
loss scaling).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Literal, get_args

import torch

__all__ = [
    "RolloutDtype",
    "TrainDtype",
    "autocast",
    "cpu_has_bf16",
    "has_bf16",
    "resolve_rollout_dtype",
    "resolve_train_dtype",
    "use_tf32",
]

TrainDtype = Literal["fp32", "bf16", "amp_bf16"]
RolloutDtype = Literal["float32", "bfloat16"]
_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_has_bf16(cpuinfo: str) -> bool:
    """True if a ``/proc/cpuinfo`` text lists a native bf16 matmul instruction set (AVX-512 BF16, AMX-BF16)."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return any(f in flags for f in _BF16_CPU_FLAGS)
    return False


def has_bf16(device_type: str = "cpu") -> bool:
    """Whether ``device_type`` (cpu or cuda) multiplies bf16 natively (see the module docstring)."""
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:
        return cpu_has_bf16(Path("/proc/cpuinfo").read_text())
    except OSError:  # not Linux: no way to tell cheaply, so no bf16
        return False


def _device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _resolve(dtype: str, what: str, choices: tuple[str, ...], native: str) -> str:
    """``auto`` -> ``native`` where this machine has bf16, else the fp32 choice (the first); any other
    value as it is, if it is one of ``choices``."""
    if dtype == "auto":
        return native if has_bf16(_device_type()) else choices[0]
    if dtype not in choices:
        raise ValueError(f"{what} dtype {dtype!r}: expected one of {', '.join(choices)}, auto")
    return dtype


def resolve_train_dtype(dtype: str) -> TrainDtype:
    """``auto`` -> ``amp_bf16`` or ``fp32`` for this machine; any other value as it is."""
    return _resolve(dtype, "training", get_args(TrainDtype), "amp_bf16")  # type: ignore[return-value]


def resolve_rollout_dtype(dtype: str) -> RolloutDtype:
    """``auto`` -> ``bfloat16`` or ``float32`` for this machine; any other value as it is."""
    return _resolve(dtype, "rollout", get_args(RolloutDtype), "bfloat16")  # type: ignore[return-value]


def use_tf32(dtype: str, device_type: str | None = None) -> bool:
    """For the training dtype *setting* ``dtype`` (before resolving): ``auto`` on CUDA sets fp32 matmul
    precision to ``high`` (TF32) and returns True; anything else, or a CPU, changes nothing and returns
    False. ``device_type``: where training runs (default: this process's stage device)."""
    if device_type is None:
        from components.device import stage_device

        device_type = stage_device().type
    if dtype != "auto" or device_type != "cuda":
        return False
    torch.set_float32_matmul_precision("high")
    return True


def autocast(dtype: str, device_type: str = "cpu") -> contextlib.AbstractContextManager:
    """The forward-pass context of a (resolved) training dtype: bf16 autocast for ``amp_bf16``, else nothing."""
    if dtype == "amp_bf16":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
