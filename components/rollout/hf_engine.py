"""transformers ``generate`` rollout engine: the fallback when vLLM is not available.

Same interface as the vLLM engine. The model sits on the stage's device
(``components.device.stage_device``); prompts are left-padded into one batch per call and moved to
the model's device. Log-probs are those of the distribution sampled from at the request's temperature
T, log_softmax(logits / T) (the raw logits' when greedy), as the vLLM engine reports them and the
trainer computes them; top-p, which the pipeline never sets, is not applied to them.

Departure from ``generate(output_logits=True)``: that keeps every step's full-vocabulary logits,
(N, T, V) floats (64 sequences x 256 tokens x a 151,936-token vocabulary is 10 GB, then stacked and
log-softmaxed into two more copies). A forward hook (:class:`SampledLogprobs`) instead keeps one
step's log-softmax until the next forward reveals the sampled token, and one float per sampled
token after that (``benchmarks/hf_engine_memory.py`` measures the difference).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from components.device import model_device, stage_device, to_device
from components.precision import resolve_rollout_dtype
from components.rollout.base import EngineSettings, Generation, SamplingConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class SampledLogprobs:
    """A forward hook (``register_forward_hook(..., with_kwargs=True)``) on a causal LM inside
    ``generate``: each forward's last-position log-softmax waits in ``pending`` until the next forward,
    whose ``input_ids`` end with the token sampled from it; then only that token's log-prob is kept.
    After ``generate``, :meth:`finish` takes the last sampled token's. ``temperature``: the logits are
    divided by it first (1.0: the raw logits)."""

    def __init__(self, temperature: float = 1.0) -> None:
        self.temperature = temperature
        self.pending: torch.Tensor | None = None  # (N, V) the latest step's log-softmax
        self.steps: list[torch.Tensor] = []  # (N,) per sampled token

    def __call__(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if self.pending is not None:
            ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
            self._take(ids[:, -1])
        self.pending = torch.log_softmax(output.logits[:, -1].float() / self.temperature, dim=-1)

    def _take(self, tokens: torch.Tensor) -> None:
        assert self.pending is not None
        self.steps.append(self.pending.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))
        self.pending = None

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """(N, T) log-probs of ``new_tokens`` (N, T), the tokens ``generate`` added."""
        if self.pending is not None:
            self._take(new_tokens[:, len(self.steps)])
        if len(self.steps) != new_tokens.size(1):
            raise RuntimeError(f"{len(self.steps)} log-probs recorded for {new_tokens.size(1)} new tokens")
        return torch.stack(self.steps, dim=1)


class HFEngine:
    def __init__(
        self, model_dir: str, settings: EngineSettings = EngineSettings("hf"), *, stop_token_ids: list[int]
    ) -> None:
        """Of ``settings`` only ``dtype`` acts here (auto resolved for this machine)."""
        from transformers import AutoModelForCausalLM  # any architecture; imported when a model is loaded

        dtype = _DTYPES[resolve_rollout_dtype(settings.dtype)]
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        self.model = model.to(stage_device())
        self.stop_token_ids = list(stop_token_ids)
        cfg = self.model.config
        self.pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else self.stop_token_ids[0]

    def prompt_batch(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded (ids, attention mask), on the CPU."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        return ids, mask

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int] | None = None
    ) -> list[list[Generation]]:
        # transformers samples a whole batch from one generator: seed it from the first request.
        if seeds:
            torch.manual_seed(seeds[0])
        expanded = [p for p in prompts for _ in range(sampling.n)]
        ids, mask = to_device(self.prompt_batch(expanded), model_device(self.model))
        greedy = sampling.temperature == 0
        recorder = SampledLogprobs(1.0 if greedy else sampling.temperature)
        hook = self.model.register_forward_hook(recorder, with_kwargs=True)
        try:
            sequences = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=sampling.max_tokens,
                do_sample=not greedy,
                temperature=None if greedy else sampling.temperature,
                top_p=None if greedy else sampling.top_p,
                top_k=None,
                eos_token_id=self.stop_token_ids,
                pad_token_id=self.pad_id,
            )
        finally:
            hook.remove()
        new = sequences[:, ids.size(1) :]
        logps = recorder.finish(new)
        gens: list[Generation] = []
        for row, lp in zip(new.tolist(), logps.tolist()):
            cut = next((j + 1 for j, t in enumerate(row) if t in self.stop_token_ids), None)
            n = cut if cut is not None else len(row)
            gens.append(Generation(row[:n], lp[:n], "stop" if cut is not None else "length"))
        return [gens[i * sampling.n : (i + 1) * sampling.n] for i in range(len(prompts))]

    def sync_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.model.load_state_dict(dict(state_dict), strict=True)

    def sleep(self) -> bool:
        return False  # the model is small beside the trainer's; nothing is freed

    def wake_up(self) -> None:
        pass

    def close(self) -> None:
        del self.model
