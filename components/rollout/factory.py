"""The rollout engine called by name: :func:`make_engine` builds the vLLM or the transformers engine
from one :class:`~components.rollout.base.EngineSettings`.

It sits above both engines (they import only :mod:`components.rollout.base`), and decides what only
holds on this machine: ``dtype`` auto, and vLLM's GPU settings, which act on CUDA only.
"""

from __future__ import annotations

import dataclasses
import logging

from components.device import on_cuda
from components.precision import resolve_rollout_dtype
from components.rollout.base import EngineSettings, RolloutEngine

__all__ = ["make_engine"]

log = logging.getLogger(__name__)


def make_engine(settings: EngineSettings, model_dir: str, *, stop_token_ids: list[int]) -> RolloutEngine:
    """Build engine ``settings.engine`` ("vllm" or "hf") on the HF checkpoint in ``model_dir``.

    ``settings.gpu_memory_utilization`` and ``settings.sleep_mode`` act on vLLM on CUDA only;
    elsewhere they are accepted and one log line says they do nothing. ``own_process`` acts on vLLM
    only."""
    settings = dataclasses.replace(settings, dtype=resolve_rollout_dtype(settings.dtype))
    cuda = on_cuda()
    if settings.engine != "vllm" or not cuda:
        where = "on CPU" if not cuda else f"with the {settings.engine!r} engine"
        log.info(
            "rollout.gpu_memory_utilization=%s and rollout.sleep_during_update=%s do nothing %s "
            "(vLLM on CUDA only)",
            settings.gpu_memory_utilization,
            settings.sleep_mode,
            where,
        )
    if settings.engine == "vllm" and settings.inflight_updates:
        from components.rollout.vllm_inflight import InflightVLLMEngine

        return InflightVLLMEngine(model_dir, settings, stop_token_ids=stop_token_ids, gpu=cuda)
    if settings.engine == "vllm":
        from components.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(model_dir, settings, stop_token_ids=stop_token_ids, gpu=cuda)
    from components.rollout.hf_engine import HFEngine

    return HFEngine(model_dir, settings, stop_token_ids=stop_token_ids)
