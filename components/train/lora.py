"""LoRA adapters (peft) on the RL actor and critic: only the adapters train, the base stays frozen.

What it does:
- ``LoraSettings``: rank, alpha, dropout and target module names, checked when built.
- ``linear_module_names`` / ``check_target_modules``: the model's Linear layers by the last part of
  their name (what peft's ``target_modules`` matches), and an error listing them when a target is not
  one; ``check_model_dir`` does it on a checkpoint's config alone (meta device, nothing loaded).
- ``add_lora``: wraps a transformers model in a ``peft.PeftModel``. The model itself is changed in
  place (peft swaps each target Linear for a LoRA layer around it) and stays a transformers model:
  ``peft_model.get_base_model()`` is what the DeepSpeed engine trains, so the trainer's code
  (``get_decoder``, the critic's ``score``) does not change. ``with peft_model.disable_adapter():``
  runs the frozen base: the KL reference, without a second copy of the weights. ``train_modules``
  (the critic's value head) are trained in full and saved with the adapters (peft's
  ``modules_to_save``).
- ``merged_state_dict``: the weights the model computes with, W + (alpha / rank) B A for each adapted
  layer, under the base model's own names (what vLLM's ``reload_weights`` and ``from_pretrained``
  take), without changing the trained model; ``merged_model``: a plain transformers model holding them.

What it does not do: quantise the base (QLoRA), several adapters at once, or LoRA on embeddings.
Departures from peft's defaults:
1. ``lora_dropout`` defaults to 0: dropout makes the update's forward differ from the rollout's, so the
   first PPO ratio is not 1.
2. A target must name a Linear layer of the model (peft accepts any name that matches some module and
   ignores the rest), and the output head is refused when it is tied to the input embeddings (a merged
   head would no longer be the embedding matrix vLLM ties it to).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "LoraSettings",
    "add_lora",
    "check_model_dir",
    "check_target_modules",
    "linear_module_names",
    "merged_model",
    "merged_state_dict",
    "trainable_parameters",
]


@dataclass(frozen=True)
class LoraSettings:
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank <= 0:
            raise ValueError(f"lora rank={self.rank!r} must be an int > 0")
        if not self.alpha > 0:
            raise ValueError(f"lora alpha={self.alpha!r} must be > 0")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora dropout={self.dropout!r} must be in [0, 1)")
        if isinstance(self.target_modules, str) or not self.target_modules:
            raise ValueError(f"lora target_modules={self.target_modules!r}: expected a list of module names")
        object.__setattr__(self, "target_modules", tuple(self.target_modules))


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The last part of the name of every ``torch.nn.Linear`` of ``model``, sorted, each once."""
    return sorted(
        {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    )


def _output_head_name(model: torch.nn.Module) -> str | None:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        return None
    return next((n.rsplit(".", 1)[-1] for n, m in model.named_modules() if m is head), None)


def check_target_modules(model: torch.nn.Module, targets: Sequence[str], *, where: str = "the model") -> None:
    """ValueError naming the targets that are not Linear layers of ``model`` and listing those it has."""
    names = linear_module_names(model)
    missing = [t for t in targets if t not in names]
    if missing:
        raise ValueError(
            f"model.lora.target_modules {missing}: {where} has no Linear layer of that name "
            f"(its Linear layers: {names})"
        )
    head = _output_head_name(model)
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if head is not None and head in targets and tied:
        raise ValueError(
            f"model.lora.target_modules lists {head!r}, the output head, which {where} ties to its input "
            "embeddings: an adapter there would untie them; leave it out"
        )


def check_model_dir(model_dir: str | Path, targets: Sequence[str]) -> None:
    """:func:`check_target_modules` on the HF checkpoint in ``model_dir``, built on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    check_target_modules(model, targets, where=f"the model in {model_dir}")


def add_lora(model: torch.nn.Module, settings: LoraSettings, *, train_modules: Sequence[str] = ()) -> Any:
    """``model`` with LoRA adapters (changed in place), wrapped in a ``peft.PeftModel``.

    Every base weight is frozen; the adapters (B initialised to 0, so the model computes what it did)
    and ``train_modules`` (trained in full, e.g. the critic's ``score``) train."""
    from peft import LoraConfig, get_peft_model

    check_target_modules(model, settings.target_modules)
    config = LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        modules_to_save=list(train_modules) or None,
        bias="none",
    )
    return get_peft_model(model, config)


def trainable_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def merged_state_dict(peft_model: Any) -> dict[str, torch.Tensor]:
    """The base model's state dict with each adapted weight replaced by W + scale * B @ A (detached).

    Keys are the base model's own (``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``);
    the trained model is not changed. A module of ``train_modules`` gives its trained copy."""
    from peft.tuners.lora import LoraLayer
    from peft.utils import ModulesToSaveWrapper

    base = peft_model.get_base_model()
    adapter = peft_model.active_adapter
    merged: dict[str, torch.Tensor] = {}
    replaced: dict[str, torch.nn.Module] = {}  # module name -> the module its keys come from
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            replaced[name] = module
        elif isinstance(module, ModulesToSaveWrapper):
            replaced[name] = module.modules_to_save[adapter]
    skip = tuple(f"{n}." for n in replaced)
    with torch.no_grad():
        for key, value in base.state_dict().items():
            if not key.startswith(skip):
                merged[key] = value.detach()
        for name, module in replaced.items():
            if isinstance(module, LoraLayer):
                layer = module.get_base_layer()
                for pname, value in layer.state_dict().items():
                    merged[f"{name}.{pname}"] = value.detach()
                if adapter in module.lora_A:
                    weight = layer.weight
                    delta = module.get_delta_weight(adapter).to(weight.dtype)
                    merged[f"{name}.weight"] = weight.detach() + delta
            else:
                for pname, value in module.state_dict().items():
                    merged[f"{name}.{pname}"] = value.detach()
    return merged


def merged_model(peft_model: Any, *, dtype: torch.dtype | None = None) -> Any:
    """A plain transformers model (no peft) of the base's class holding :func:`merged_state_dict`."""
    from components.train.model_state import model_with_state

    return model_with_state(peft_model.get_base_model(), merged_state_dict(peft_model), dtype=dtype)
