"""vLLM gets a LoRA actor's merged weights: its log-probs equal the trainer's (adapters on) after a sync."""

from __future__ import annotations

import pytest
import torch

from components.model.tiny import save_hf
from components.model.tokenizer import build_tokenizer
from components.rollout import EngineSettings, SamplingConfig
from components.rollout.factory import make_engine
from components.train.lora import LoraSettings, add_lora, merged_state_dict
from components.train.policy import make_token_batch, response_logprobs
from tests.tiny_vllm_models import noisy_tiny_model

pytestmark = pytest.mark.vllm

TOL = 1e-3  # as tests/rollout/test_rollout_sync.py: fp32, max |logp_vllm - logp_trainer|


def _max_diff(tok, model, engine, seed: int) -> float:
    prompts = [tok.encode(f"add {a} and") for a in (3, 17, 42, 99, 123, 250)]
    gens = engine.generate(
        prompts, SamplingConfig(max_tokens=24, temperature=1.0), seeds=[seed + i for i in range(len(prompts))]
    )
    batch = make_token_batch(prompts, [g[0].token_ids for g in gens], pad_id=tok.pad_token_id)
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch)
    return max(
        (logp[i, : len(g[0].logprobs)] - torch.tensor(g[0].logprobs)).abs().max().item()
        for i, g in enumerate(gens)
    )


def test_merged_lora_weights_give_vllm_the_trainers_logprobs(tmp_path):
    corpus = [f"<|im_start|>user\nadd {a} and {a * 7}<|im_end|>\n" for a in range(300)]
    tok = build_tokenizer(corpus, vocab_size=400)
    model = noisy_tiny_model(tok, max_position_embeddings=256, scale=0.1)
    path = save_hf(model, tok, tmp_path / "m")
    engine = make_engine(
        EngineSettings("vllm", max_model_len=256, seed=0), str(path), stop_token_ids=[tok.eos_token_id]
    )
    try:
        targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
        peft_model = add_lora(model, LoraSettings(rank=4, alpha=8.0, target_modules=targets))
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():  # "trained" adapters: B is 0 at the start
            for name, p in peft_model.named_parameters():
                if ".lora_B." in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        trainer = peft_model.get_base_model().eval()
        stale = _max_diff(tok, trainer, engine, seed=1)
        assert stale > 10 * TOL, "the test cannot tell the base weights from the merged ones"
        engine.sync_weights(merged_state_dict(peft_model))
        after = _max_diff(tok, trainer, engine, seed=1)
        print(
            f"max |logp_vllm - logp_trainer| with LoRA: stale {stale:.2e}, after the merged sync {after:.2e}"
        )
        assert after <= TOL
    finally:
        engine.close()
