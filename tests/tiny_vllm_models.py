"""The small random model the vLLM tests serve, and the weight noise they use as an "update"."""

from __future__ import annotations

import torch

from components.model.tiny import build_tiny_model


def perturb(model, scale: float, seed: int) -> None:
    """Add seeded Gaussian noise of std ``scale`` to every parameter, in place."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def noisy_tiny_model(tok, *, max_position_embeddings: int, scale: float):
    """A 2-layer tiny model (seed 0) with noise of std ``scale`` (seed 0) on its weights: a fresh init
    is near-uniform and repeats one token; larger random weights make outputs vary with the prompt."""
    model = build_tiny_model(
        tok,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        max_position_embeddings=max_position_embeddings,
        seed=0,
    )
    perturb(model, scale, 0)
    return model
