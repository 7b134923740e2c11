"""The GPU pre-flight of a stage: stop with one line naming the setting when the run cannot fit.

On a CPU it does nothing. On CUDA it estimates the stage's floor (components.gpu_memory) from the
checkpoint's parameter count and this GPU's free and total memory, before any engine is built, so a
``model.path`` too large for the card or a ``rollout.gpu_memory_utilization`` that starves vLLM or the
trainer ends the stage with ``error: ...`` instead of a CUDA out-of-memory trace minutes later.
"""

from __future__ import annotations

from pathlib import Path

import torch

from components.config import Params
from components.device import on_cuda, stage_device
from components.gpu_memory import GiB, count_lora_parameters, count_parameters, plan_gpu_memory
from components.precision import resolve_rollout_dtype, resolve_train_dtype
from flows._stage import StageError


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def check_gpu_memory(
    params: Params,
    model_dir: str | Path,
    *,
    trained_models: int,
    reference: bool = False,
    rollout: bool = False,
    lora: bool | None = None,
) -> None:
    """Raise StageError (one line) when the stage's floor does not fit this GPU; nothing on a CPU.

    ``trained_models``: DeepSpeed engines the stage builds (SFT 1, RL 1 or 2); ``reference``: a frozen
    KL reference; ``rollout``: the stage runs ``rollout.engine``. ``lora``: the trained models carry
    model.lora's adapters (True), could (False: the refusal says so), or cannot (None, SFT)."""
    if not on_cuda():
        return
    free, total = torch.cuda.mem_get_info(stage_device())
    n = count_parameters(model_dir)
    lo = params.model.lora
    m = count_lora_parameters(model_dir, rank=lo.rank, target_modules=lo.target_modules) if lora else 0
    r = params.rollout
    share = r.gpu_memory_utilization if rollout and r.engine == "vllm" else 0.0
    plan = plan_gpu_memory(
        n,
        free=free,
        total=total,
        trained_models=trained_models,
        train_dtype=resolve_train_dtype(params.deepspeed.dtype),
        reference=reference,
        rollout_engine=r.engine if rollout else None,
        rollout_dtype=resolve_rollout_dtype(r.dtype),
        vllm_share=share,
        lora_params=m,
    )
    model = f"model.path={params.model.path}" if params.model.path else f"the model in {model_dir}"
    size = f"{n / 1e9:.2f}B parameters" if n >= 1e8 else f"{n / 1e6:.1f}M parameters"
    if not plan.vllm_fits:
        raise StageError(
            f"rollout.gpu_memory_utilization={share} gives vLLM {_gib(plan.vllm_room)} of this GPU's "
            f"{_gib(total)}, less than the {_gib(plan.vllm_needs)} that {model} ({size}) needs for its "
            f"weights in {resolve_rollout_dtype(r.dtype)} before any KV cache: raise it"
        )
    if not plan.trainer_fits:
        beside = (
            f" and rollout.gpu_memory_utilization={share} reserves {_gib(plan.vllm_room)} for vLLM"
            if share
            else ""
        )
        if m:
            what = (
                f"{trained_models} trained model(s) with model.lora.rank={lo.rank}: frozen weights in "
                f"{resolve_train_dtype(params.deepspeed.dtype)} and {m / 1e6:.1f}M adapter parameters at "
                "16 bytes each for weights, gradients and Adam states"
            )
        else:
            what = (
                f"{trained_models} trained model(s) at 16 bytes per parameter for weights, gradients and "
                f"Adam states{', a KL reference' if reference else ''}"
            )
        raise StageError(
            f"{model} ({size}) needs at least {_gib(plan.trainer_needs)} of GPU memory for training "
            f"({what}), but this GPU has {_gib(free)} "
            f"free{beside}, leaving the trainer {_gib(max(plan.trainer_room, 0))}: use a smaller "
            "model.path"
            + (" or lower rollout.gpu_memory_utilization" if share else "")
            + (" or train LoRA adapters (model.lora.rank=16)" if lora is False else "")
        )
