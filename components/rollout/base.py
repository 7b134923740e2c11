"""The rollout engine interface and a factory by name.

An engine turns prompt token ids into sampled response token ids with the log-prob of every sampled
token, and accepts new actor weights in place (no restart). It never sees text: token ids in, token
ids out, so what the trainer scores is exactly what was sampled.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from components.device import on_cuda
from components.precision import resolve_rollout_dtype

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplingConfig:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    # "stop" (the stop token was emitted; it is the last id) or "length" (cut at max_tokens).
    finish_reason: str


class RolloutEngine(Protocol):
    def generate(
        self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int] | None = None
    ) -> list[list[Generation]]:
        """One list of ``sampling.n`` generations per prompt, in prompt order.

        ``seeds[i]`` seeds prompt i's sampling, so a request is reproducible whatever else is batched.
        """

    def sync_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load new actor weights into the running engine."""

    def sleep(self) -> bool:
        """Free this engine's accelerator memory for a while (vLLM on CUDA: weights to CPU, KV cache
        dropped); True if it did, False where there is nothing to free (then no ``wake_up`` is needed)."""

    def wake_up(self) -> None:
        """Undo ``sleep`` before the next ``generate`` or ``sync_weights``."""

    def close(self) -> None: ...


def make_engine(
    name: str,
    model_dir: str,
    *,
    stop_token_ids: list[int],
    dtype: str = "float32",
    max_model_len: int = 1024,
    kv_cache_gib: float = 1.0,
    seed: int = 0,
    gpu_memory_utilization: float = 0.3,
    sleep_mode: bool = True,
    own_process: bool = False,
) -> RolloutEngine:
    """Build the engine called ``name`` ("vllm" or "hf") on the HF checkpoint in ``model_dir``;
    ``dtype`` float32, bfloat16 or auto (:func:`components.precision.resolve_rollout_dtype`).

    ``gpu_memory_utilization`` (vLLM's share of the GPU's memory, weights + KV cache) and
    ``sleep_mode`` (vLLM may :meth:`RolloutEngine.sleep` during the update) act on vLLM on CUDA only;
    elsewhere they are accepted and one log line says they do nothing. ``own_process``: vLLM runs in a
    process of its own, apart from a data-parallel trainer's torch.distributed world (the "hf" engine
    never touches that world and stays in this process)."""
    if not 0.0 < gpu_memory_utilization < 1.0:
        raise ValueError(f"gpu_memory_utilization={gpu_memory_utilization!r} must be in (0, 1)")
    dtype = resolve_rollout_dtype(dtype)
    cuda = on_cuda()
    if name != "vllm" or not cuda:
        where = "on CPU" if not cuda else f"with the {name!r} engine"
        log.info(
            "rollout.gpu_memory_utilization=%s and rollout.sleep_during_update=%s do nothing %s "
            "(vLLM on CUDA only)",
            gpu_memory_utilization,
            sleep_mode,
            where,
        )
    if name == "vllm":
        from components.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            model_dir,
            stop_token_ids=stop_token_ids,
            dtype=dtype,
            max_model_len=max_model_len,
            kv_cache_gib=kv_cache_gib,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization if cuda else None,
            sleep_mode=sleep_mode and cuda,
            own_process=own_process,
        )
    if name == "hf":
        from components.rollout.hf_engine import HFEngine

        return HFEngine(model_dir, stop_token_ids=stop_token_ids, dtype=dtype)
    raise ValueError(f"unknown rollout engine {name!r}; valid: ['hf', 'vllm']")
