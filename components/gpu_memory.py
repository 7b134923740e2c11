"""Will a stage fit on its GPU? A pre-flight estimate from the parameter count, before any engine starts.

An RL stage holds, for the whole run, the DeepSpeed actor (and the critic for critic-based estimators)
with their gradients and Adam states, the frozen KL reference, and the rollout engine's weights and
KV cache. Their floor, in bytes per parameter ``n``:

- a trained model (actor, critic): weights + gradients + Adam's two moments, ``16 n`` in fp32 (and
  ``amp_bf16``, whose weights and optimizer stay fp32); DeepSpeed's bf16 mode keeps bf16 weights and
  gradients beside an fp32 master copy and the moments, also ``16 n`` at least;
- the frozen reference: its weights, ``4 n`` (fp32) or ``2 n`` (bf16);
- vLLM: ``gpu_memory_utilization`` of the GPU's total memory, fixed at start (weights + KV cache),
  which must hold at least its weights in the rollout dtype; the trainer gets the rest of what is free.
  Sleep mode frees vLLM's share during the update only: the trainer's persistent state must fit beside
  an awake vLLM;
- the ``hf`` rollout engine: one more copy of the weights in the rollout dtype;
- with LoRA (``model.lora``) a trained model is its frozen weights in the training dtype (``4 n``, or
  ``2 n`` in bf16 mode) plus ``16`` bytes per trained parameter ``m`` (the adapters: weights,
  gradients, Adam's moments, a master copy in bf16 mode), and the reference costs nothing (it is the
  actor with its adapters off). The critic's value head (``hidden_size`` parameters) is left out.

Activations come on top and depend on the micro-batch; :data:`HEADROOM_BYTES` stands for them and
for the CUDA context. The estimate is a lower bound: a run that fails it cannot fit, a run that passes
it may still run out of memory (``train.micro_batch_size`` is the knob then).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "HEADROOM_BYTES",
    "GPUMemoryPlan",
    "GiB",
    "count_lora_parameters",
    "count_parameters",
    "plan_gpu_memory",
]

GiB = 1024**3
HEADROOM_BYTES = 1 * GiB  # CUDA context, allocator slack and the smallest activations

_TRAINED_BYTES_PER_PARAM = 16  # weights + grads + Adam exp_avg + exp_avg_sq (fp32 or bf16 + master)
_WEIGHT_BYTES = {"fp32": 4, "amp_bf16": 4, "bf16": 2, "float32": 4, "bfloat16": 2}


def count_parameters(model_dir: str | Path) -> int:
    """Parameters of the HF checkpoint in ``model_dir``, counted on the meta device (nothing loaded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def count_lora_parameters(model_dir: str | Path, *, rank: int, target_modules: list[str]) -> int:
    """Parameters of rank-``rank`` LoRA adapters on ``target_modules`` of the checkpoint in
    ``model_dir``: r (in + out) per adapted Linear layer, counted on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    targets = set(target_modules)
    return sum(
        rank * (m.in_features + m.out_features)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets
    )


def _weight_bytes(dtype: str) -> int:
    if dtype not in _WEIGHT_BYTES:
        raise ValueError(f"dtype {dtype!r}: expected one of {sorted(_WEIGHT_BYTES)}")
    return _WEIGHT_BYTES[dtype]


@dataclass(frozen=True)
class GPUMemoryPlan:
    """What a stage needs and has, in bytes. ``vllm_share`` is 0 where no vLLM engine runs."""

    n_params: int
    total: int
    free: int
    vllm_share: float
    trainer_needs: int  # persistent: trained models, reference, hf engine weights, headroom
    vllm_needs: int  # vLLM's weights (0 without vLLM)

    @property
    def vllm_room(self) -> int:
        return int(self.vllm_share * self.total)

    @property
    def trainer_room(self) -> int:
        return self.free - self.vllm_room

    @property
    def vllm_fits(self) -> bool:
        return self.vllm_needs <= self.vllm_room

    @property
    def trainer_fits(self) -> bool:
        return self.trainer_needs <= self.trainer_room


def plan_gpu_memory(
    n_params: int,
    *,
    free: int,
    total: int,
    trained_models: int,
    train_dtype: str = "fp32",
    reference: bool = False,
    rollout_engine: str | None = None,
    rollout_dtype: str = "bfloat16",
    vllm_share: float = 0.0,
    lora_params: int = 0,
) -> GPUMemoryPlan:
    """The floor of a stage's GPU memory (module docstring) against ``free`` / ``total`` bytes.

    ``trained_models``: DeepSpeed engines (SFT 1; RL 1, or 2 with a critic). ``rollout_engine``: None
    (no rollout in this stage), ``"hf"`` or ``"vllm"`` (which takes ``vllm_share`` of ``total``).
    ``lora_params``: the LoRA adapters' parameters of each trained model (0: every weight trains)."""
    if n_params <= 0 or total <= 0 or free < 0 or lora_params < 0:
        raise ValueError(
            f"n_params={n_params}, total={total}, free={free}, lora_params={lora_params}: "
            "expected positive sizes"
        )
    if lora_params:
        per_model = _weight_bytes(train_dtype) * n_params + _TRAINED_BYTES_PER_PARAM * lora_params
        trainer = trained_models * per_model  # the reference is the actor with its adapters off
    else:
        trainer = trained_models * _TRAINED_BYTES_PER_PARAM * n_params
        if reference:
            trainer += _weight_bytes(train_dtype) * n_params
    vllm = 0
    if rollout_engine == "hf":
        trainer += _weight_bytes(rollout_dtype) * n_params
    elif rollout_engine == "vllm":
        vllm = _weight_bytes(rollout_dtype) * n_params
    else:
        vllm_share = 0.0
    if trainer:
        trainer += HEADROOM_BYTES
    return GPUMemoryPlan(n_params, total, free, vllm_share, trainer, vllm)
