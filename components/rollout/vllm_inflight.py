"""The vLLM engine in a process of its own that takes new weights while it generates (in-flight
weight updates, ``rollout.inflight_updates``).

:class:`InflightVLLMEngine` drives vLLM's ``AsyncLLM`` (the engine core and its worker in processes
of their own, as :class:`~components.rollout.vllm_engine.VLLMEngine` with ``own_process``) from an
asyncio loop on a thread of its own. ``generate`` blocks its caller as the other engines do, and
``sync_weights`` may be called from any other thread at any time, a generation running or not: it
pauses the engine's scheduler between two decode steps, keeping the requests in flight
(``pause_generation(mode="keep")``), resets the KV and prefix caches (which preempts the running
requests, so they prefill their prompt and the tokens so far again under the new weights: vLLM's
``clear_cache``), loads the weights (the own-process engine's file sync,
:mod:`components.rollout.vllm_worker`) and resumes. Every sampled token is therefore a sample of one
version's weights given its whole prefix, and its log-prob is that version's: the tokens before the
push are the old version's, those after it the new one's (tests/rollout/test_vllm_inflight.py).

Each ``sync_weights`` counts one policy version (``policy_version``, or the caller's ``version``);
each generation is stamped with the version it started with (``Generation.policy_version``; tokens
after a push mid-generation are a newer version's, so the stamp is the oldest of its tokens).
``pushes_mid_generation`` counts the pushes that found a generation running.

Departures from :class:`VLLMEngine` (which it extends; the requests, seeds, chunks and prefix-cache
warm-up are the same):
1. Sampling stays seeded per request, but where a push falls depends on timing, so a rollout that a
   push lands in is not reproducible (the rollout of the same seeds without a push is).
2. ``prefix_cache_stats`` is not available (the async client has no metrics reader): it raises.
3. CPU and GPU alike; the engine never sleeps (it generates during the update).

Does not: decide which version a rollout should use (components.train.staleness), or keep weights.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import defaultdict
from collections.abc import Mapping
from concurrent.futures import Future
from types import SimpleNamespace

import torch

from components.rollout.base import EngineSettings
from components.rollout.vllm_engine import VLLMEngine, weights_file

__all__ = ["InflightVLLMEngine"]


class InflightVLLMEngine(VLLMEngine):
    def __init__(
        self, model_dir: str, settings: EngineSettings = EngineSettings(), *, version: int = 0, **kwargs
    ) -> None:
        """As :class:`VLLMEngine` (``settings.own_process`` must be set); ``version``: the policy version
        of the weights in ``model_dir``."""
        if not settings.own_process:
            raise ValueError("the in-flight engine runs vLLM in a process of its own: set own_process")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="steprl-vllm-loop", daemon=True)
        self._thread.start()
        self._ids = itertools.count()
        self._lock = threading.Lock()  # the version and the running generations
        self._running = 0
        self.pushes_mid_generation = 0
        self.tokens_generated = 0  # sampled tokens streamed so far (all generations)
        super().__init__(model_dir, settings, **kwargs)
        self.policy_version = version

    def _call(self, coro) -> object:
        """Run ``coro`` on the engine's loop and wait for its result (from any thread but the loop's)."""
        future: Future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result()

    def _start(self, **engine_args):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        async def build() -> AsyncLLM:  # on the loop: its tasks and queues belong to it
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))

        return self._call(build())

    def _run(self, requests: list[dict], params: list | object) -> list:
        """As :meth:`VLLMEngine._run`; the tokens are streamed as they are sampled (``tokens_generated``
        counts them) and each request's output is rebuilt from its deltas."""
        from vllm.sampling_params import RequestOutputKind

        each = params if isinstance(params, list) else [params] * len(requests)
        each = [p.clone() for p in each]
        for p in each:
            p.output_kind = RequestOutputKind.DELTA

        async def one(request: dict, sampling) -> SimpleNamespace:
            ids: dict[int, list] = defaultdict(list)
            lps: dict[int, list] = defaultdict(list)
            finish: dict[int, str | None] = {}
            async for out in self.llm.generate(request, sampling, request_id=f"steprl-{next(self._ids)}"):
                for c in out.outputs:
                    ids[c.index] += c.token_ids
                    lps[c.index] += c.logprobs or []
                    finish[c.index] = c.finish_reason
                    self.tokens_generated += len(c.token_ids)
            return SimpleNamespace(
                outputs=[
                    SimpleNamespace(index=i, token_ids=ids[i], logprobs=lps[i], finish_reason=finish[i])
                    for i in sorted(ids)
                ]
            )

        async def run_all() -> list:
            return list(await asyncio.gather(*(one(r, p) for r, p in zip(requests, each))))

        with self._lock:
            self._running += 1
        try:
            return self._call(run_all())
        finally:
            with self._lock:
                self._running -= 1

    def sync_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        """Load new weights, a generation running or not (module docstring); they are policy version
        ``version`` (None: the one after the version held)."""
        with weights_file((k, v.detach().to("cpu")) for k, v in state_dict.items()) as path:

            async def push() -> None:
                await self.llm.pause_generation(mode="keep", clear_cache=True)
                try:
                    await self.llm.collective_rpc("reload_weights_from_file", args=(path,))
                finally:
                    await self.llm.resume_generation()

            with self._lock:
                if self._running:
                    self.pushes_mid_generation += 1
                self._call(push())
                self.policy_version = self.policy_version + 1 if version is None else version

    def prefix_cache_stats(self) -> dict[str, float]:
        raise NotImplementedError("the in-flight engine does not read vLLM's prefix-cache counters")

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:

            async def shutdown() -> None:  # on the loop, whose tasks (the output handler) it cancels
                llm.shutdown()

            self._call(shutdown())
            del self.llm
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
