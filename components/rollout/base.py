"""The rollout engine interface and a factory by name.

An engine turns prompt token ids into sampled response token ids with the log-prob of every sampled
token, and accepts new actor weights in place (no restart). It never sees text: token ids in, token
ids out, so what the trainer scores is exactly what was sampled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from components.precision import resolve_rollout_dtype


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
) -> RolloutEngine:
    """Build the engine called ``name`` ("vllm" or "hf") on the HF checkpoint in ``model_dir``;
    ``dtype`` float32, bfloat16 or auto (:func:`components.precision.resolve_rollout_dtype`)."""
    dtype = resolve_rollout_dtype(dtype)
    if name == "vllm":
        from components.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            model_dir,
            stop_token_ids=stop_token_ids,
            dtype=dtype,
            max_model_len=max_model_len,
            kv_cache_gib=kv_cache_gib,
            seed=seed,
        )
    if name == "hf":
        from components.rollout.hf_engine import HFEngine

        return HFEngine(model_dir, stop_token_ids=stop_token_ids, dtype=dtype)
    raise ValueError(f"unknown rollout engine {name!r}; valid: ['hf', 'vllm']")
