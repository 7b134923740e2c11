"""The small random model the vLLM tests serve, the weight noise they use as an "update", and the
own-process engine's weight-sync check (tests/train/fault_world.py, tests/rollout/test_vllm_own_process.py)."""

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


def logprob_gap(tok, model, engine, seed: int) -> float:
    """max |logp_vllm - logp_trainer| over 4 answers ``engine`` samples (T=1, seeded)."""
    from components.rollout import SamplingConfig
    from components.train.policy import make_token_batch, response_logprobs

    prompts = [tok.encode(f"add {a} and") for a in (3, 17, 42, 99)]
    gens = engine.generate(
        prompts, SamplingConfig(max_tokens=24, temperature=1.0), seeds=[seed + i for i in range(4)]
    )
    batch = make_token_batch(prompts, [g[0].token_ids for g in gens], pad_id=tok.pad_token_id)
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch)
    return max(
        float((logp[i, : len(g[0].logprobs)] - torch.tensor(g[0].logprobs)).abs().max())
        for i, g in enumerate(gens)
    )


def sync_check(engine, tok, model) -> dict:
    """An engine serving ``model`` against the trainer: the engine client's class, the log-prob gap
    before an "update" of ``model`` (``before``), after it (``stale``) and after the weight sync
    (``after``), and the trainer's world size."""
    import torch.distributed as dist

    result = {"client": type(engine.llm.llm_engine.engine_core).__name__}
    result["before"] = logprob_gap(tok, model, engine, 1)
    perturb(model, 0.05, 1)
    result["stale"] = logprob_gap(tok, model, engine, 2)
    engine.sync_weights(model.state_dict())
    result["after"] = logprob_gap(tok, model, engine, 2)
    result["world"] = dist.get_world_size()
    return result
