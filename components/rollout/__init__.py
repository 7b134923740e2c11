"""Rollout engines: token-in/token-out generation with log-probs, one interface (vLLM, transformers).

The package exports the interface; build an engine with
:func:`components.rollout.factory.make_engine` (not re-exported here: the engines import this package,
and the factory imports the engines).
"""

from components.rollout.base import EngineSettings, Generation, RolloutEngine, SamplingConfig

__all__ = ["EngineSettings", "Generation", "RolloutEngine", "SamplingConfig"]
