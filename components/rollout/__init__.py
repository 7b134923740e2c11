"""Rollout engines: token-in/token-out generation with log-probs, one interface (vLLM, transformers)."""

from components.rollout.base import Generation, RolloutEngine, SamplingConfig, make_engine

__all__ = ["Generation", "RolloutEngine", "SamplingConfig", "make_engine"]
