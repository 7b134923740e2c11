"""Adam's moments of a DeepSpeed engine, by parameter name: read from one engine, loaded into another.

The critic warm-up (components/train/critic_fit.py) ends with Adam moments that match its weights; a
run whose critic starts from those weights with fresh moments takes its first steps at full size in
directions the warm-up had already damped (on sokoban the held-out explained variance of 0.07-0.21
fell below 0 at the first in-run update in 9 of 10 runs). So the warm-up's moments travel with its
weights (models/critic/adam_moments.pt) and the run's critic engine starts from them.

Does: read and load the per-parameter state (``exp_avg``, ``exp_avg_sq``, ``step``) of a plain torch
Adam(W), the optimizer DeepSpeed steps under fp32 and amp_bf16 with ZeRO-0 (the project's default).
Does not: carry the state of DeepSpeed's own optimizers (bf16 master weights, ZeRO partitions: flat
buffers laid out per rank and stage); :func:`load_adam_moments` then returns why, and the caller says
so and starts fresh.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["ADAM_MOMENTS", "adam_moments", "carry_adam_moments", "load_adam_moments"]

ADAM_MOMENTS = "adam_moments.pt"  # the file, beside a fitted critic's weights
_KEYS = ("exp_avg", "exp_avg_sq", "step")


def _plain_adam(engine: Any) -> torch.optim.Optimizer | None:
    opt = engine.optimizer
    if isinstance(opt, torch.optim.Optimizer) and not hasattr(opt, "overflow"):
        return opt
    return None


def _names(engine: Any) -> dict[int, str]:
    return {id(p): name for name, p in engine.module.named_parameters()}


def adam_moments(engine: Any) -> dict[str, Any] | None:
    """{"betas", "eps", "params": {name: {exp_avg, exp_avg_sq, step}}} (CPU copies) of ``engine``'s
    plain Adam(W); None where DeepSpeed's own optimizer holds the state (bf16, ZeRO >= 1)."""
    opt = _plain_adam(engine)
    if opt is None:
        return None
    names, params = _names(engine), {}
    for group in opt.param_groups:
        for p in group["params"]:
            state = opt.state.get(p, {})
            if all(k in state for k in _KEYS):
                params[names[id(p)]] = {k: torch.as_tensor(state[k]).detach().cpu().clone() for k in _KEYS}
    group = opt.param_groups[0]
    return {"betas": tuple(group["betas"]), "eps": float(group["eps"]), "params": params}


def load_adam_moments(engine: Any, saved: dict[str, Any]) -> str | None:
    """Load ``saved`` (from :func:`adam_moments`) into ``engine``'s plain Adam(W); None when loaded,
    else the reason nothing was loaded (the engine's optimizer is untouched then)."""
    opt = _plain_adam(engine)
    if opt is None:
        return (
            f"the engine's optimizer is DeepSpeed's {type(engine.optimizer).__name__} (bf16 or ZeRO >= 1), "
            "whose state is not carried"
        )
    if not saved["params"]:
        return "the warm-up kept its step-0 weights (the linear probe), before any Adam step: no moments"
    group = opt.param_groups[0]
    if tuple(saved["betas"]) != tuple(group["betas"]) or float(saved["eps"]) != float(group["eps"]):
        return f"Adam betas/eps differ: saved {saved['betas']}/{saved['eps']}, run {group['betas']}/{group['eps']}"
    by_name = dict(engine.module.named_parameters())
    moments = saved["params"]
    if set(moments) != {n for n, p in by_name.items() if p.requires_grad}:
        missing = sorted({n for n, p in by_name.items() if p.requires_grad} ^ set(moments))[:3]
        return f"parameter names differ (e.g. {missing})"
    for name, m in moments.items():
        p = by_name[name]
        if m["exp_avg"].shape != p.shape:
            return f"{name}: saved moments of shape {tuple(m['exp_avg'].shape)}, parameter {tuple(p.shape)}"
    for name, m in moments.items():
        p = by_name[name]
        opt.state[p] = {
            "step": m["step"].clone(),
            "exp_avg": m["exp_avg"].to(p.device, p.dtype).clone(),
            "exp_avg_sq": m["exp_avg_sq"].to(p.device, p.dtype).clone(),
        }
    return None


def carry_adam_moments(engine: Any, path: str | Path) -> str:
    """Load the Adam moments saved at ``path`` (``torch.save`` of :func:`adam_moments`) into
    ``engine``; returns the line to log: what was carried, or why the optimizer starts fresh."""
    path = Path(path)
    if not path.is_file():
        return f"critic Adam moments: none saved at {path}; the run's critic optimizer starts fresh"
    why = load_adam_moments(engine, torch.load(path, weights_only=True))
    if why is not None:
        return f"critic Adam moments NOT carried from {path}: {why}; the run's critic optimizer starts fresh"
    return f"critic Adam moments carried from {path}"
