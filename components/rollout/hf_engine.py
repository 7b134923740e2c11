"""transformers ``generate`` rollout engine: the fallback when vLLM is not available.

Same interface as the vLLM engine. Prompts are left-padded into one batch per call; log-probs are the
log-softmax of the processed scores at each sampled token.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import AutoModelForCausalLM

from components.rollout.base import Generation, SamplingConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class HFEngine:
    def __init__(self, model_dir: str, *, stop_token_ids: list[int], dtype: str = "float32") -> None:
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=_DTYPES[dtype]).eval()
        self.stop_token_ids = list(stop_token_ids)
        cfg = self.model.config
        self.pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else self.stop_token_ids[0]

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int] | None = None
    ) -> list[list[Generation]]:
        # transformers samples a whole batch from one generator: seed it from the first request.
        if seeds:
            torch.manual_seed(seeds[0])
        expanded = [p for p in prompts for _ in range(sampling.n)]
        width = max(len(p) for p in expanded)
        ids = torch.full((len(expanded), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(expanded):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        greedy = sampling.temperature == 0
        out = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=sampling.max_tokens,
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None,
            eos_token_id=self.stop_token_ids,
            pad_token_id=self.pad_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        new = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1).float()  # (N, T, V) raw logits, as vLLM reports
        logps = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        gens: list[Generation] = []
        for row, lp in zip(new.tolist(), logps.tolist()):
            cut = next((j + 1 for j, t in enumerate(row) if t in self.stop_token_ids), None)
            n = cut if cut is not None else len(row)
            gens.append(Generation(row[:n], lp[:n], "stop" if cut is not None else "length"))
        return [gens[i * sampling.n : (i + 1) * sampling.n] for i in range(len(prompts))]

    def sync_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.model.load_state_dict(dict(state_dict), strict=True)

    def close(self) -> None:
        del self.model
