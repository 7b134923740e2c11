"""The rollout engine interface: what an engine takes (:class:`EngineSettings`), what it does
(:class:`RolloutEngine`), and what it returns (:class:`Generation`). The engines (``vllm_engine``,
``hf_engine``) import this module; the factory that picks one by name is
:mod:`components.rollout.factory`, above both.

An engine turns prompt token ids into sampled response token ids with the log-prob of every sampled
token, and accepts new actor weights in place (no restart). It never sees text: token ids in, token
ids out, so what the trainer scores is exactly what was sampled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

ENGINES = ("hf", "vllm")


@dataclass(frozen=True)
class EngineSettings:
    """How a rollout engine is built: params.yaml's ``rollout`` section as the engines read it, with
    the run's seed. Passed whole to :func:`components.rollout.factory.make_engine` and the engines."""

    engine: str = "vllm"  # "vllm" or "hf" (transformers generate)
    # float32, bfloat16 or auto (components.precision.resolve_rollout_dtype)
    dtype: str = "float32"
    max_model_len: int = 1024  # prompt + response tokens of one step
    kv_cache_gib: float = 1.0  # the vLLM CPU backend's KV cache, GiB
    seed: int = 0
    # vLLM on CUDA only: its share of the GPU's memory (weights + KV cache), in (0, 1), and whether it
    # may sleep (weights to CPU memory, KV cache freed) while the actor and critic update.
    gpu_memory_utilization: float = 0.3
    sleep_mode: bool = True
    # vLLM in a process of its own, apart from a data-parallel trainer's torch.distributed world (the
    # "hf" engine never touches that world and stays in this process).
    own_process: bool = False
    # The CPUs an own-process engine's worker binds to (vLLM's VLLM_CPU_OMP_THREADS_BIND): auto, nobind
    # or a list ("1", "0,2-3"). The in-process engine leaves the environment as it is.
    cpu_bind: str = "auto"
    # An own-process vLLM engine that takes new weights while it generates
    # (components.rollout.vllm_inflight); needs own_process.
    inflight_updates: bool = False

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"unknown rollout engine {self.engine!r}; valid: {list(ENGINES)}")
        if not 0.0 < self.gpu_memory_utilization < 1.0:
            raise ValueError(f"gpu_memory_utilization={self.gpu_memory_utilization!r} must be in (0, 1)")
        if self.inflight_updates and not (self.engine == "vllm" and self.own_process):
            raise ValueError("inflight_updates needs the vllm engine in its own process (own_process=True)")


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
    # The policy version of the weights the generation started with, where the engine counts versions
    # (the in-flight engine, components.rollout.vllm_inflight: later tokens may be a newer version's);
    # None where the caller knows which weights it synced.
    policy_version: int | None = None


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


def cpu_ids(spec: str) -> list[int]:
    """The CPU ids of a list such as ``"0,2-3"`` ([] when it is not one)."""
    ids: list[int] = []
    for part in spec.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()) or (sep and int(hi) < int(lo)):
            return []
        ids.extend(range(int(lo), int(hi if sep else lo) + 1))
    return sorted(set(ids))


def cpu_bind_problem(bind: str, allowed: set[int]) -> str | None:
    """Why an own-process vLLM engine cannot bind its worker as ``bind`` says on a process allowed the
    CPUs ``allowed`` (None when it can): a listed CPU it may not run on, or ``auto`` with one CPU,
    where vLLM keeps that CPU for its scheduler and leaves the worker none."""
    if bind == "nobind":
        return None
    if bind == "auto":
        if len(allowed) < 2:
            return (
                f"the rollout engine in its own process binds its worker with rollout.engine_cpus=auto, "
                f"which keeps one CPU for vLLM's scheduler, and this process may run on {len(allowed)}: "
                "set rollout.engine_cpus nobind, or give the stage 2 CPUs or more"
            )
        return None
    missing = sorted(set(cpu_ids(bind)) - allowed)
    if missing:
        return (
            f"rollout.engine_cpus={bind!r} names CPU(s) {missing} this process may not run on "
            f"(allowed: {sorted(allowed)})"
        )
    return None
