"""A plain transformers model of a module's class holding a given state dict (:func:`model_with_state`):
what ``final`` saves when the trained weights are not the module's own (LoRA merged, ZeRO-3 gathered).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["model_with_state"]


def model_with_state(
    base: torch.nn.Module, state: dict[str, torch.Tensor], *, dtype: torch.dtype | None = None
) -> Any:
    """A model of ``base``'s class and config holding ``state`` (its tensors, not copies), with
    ``base``'s non-persistent buffers (rotary ``inv_freq``: ZeRO-3 does not partition buffers)."""
    with torch.device("meta"):
        model = type(base)(base.config)
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    buffers = dict(base.named_buffers())  # non-persistent ones (rotary inv_freq) are not in the state
    for name, buf in list(model.named_buffers()):
        if buf.is_meta:
            owner, _, attr = name.rpartition(".")
            model.get_submodule(owner)._buffers[attr] = buffers[name].detach().clone()
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()
