"""vLLM prefix caching: prompts sharing a long prefix hit the cache (also the samples of one prompt
within one call), and a weight sync invalidates it (generation after the sync equals a fresh
engine's on the new weights, not the old cached prefix's)."""

from __future__ import annotations

import pytest

from components.model.tiny import save_hf
from components.model.tokenizer import build_tokenizer
from components.rollout import EngineSettings, SamplingConfig
from components.rollout.vllm_engine import VLLMEngine
from tests.tiny_vllm_models import noisy_tiny_model, perturb

pytestmark = pytest.mark.vllm


def _generate(engine: VLLMEngine, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    gens = engine.generate(prompts, SamplingConfig(max_tokens=12, temperature=0.0))
    return [(g[0].token_ids, g[0].logprobs) for g in gens]


def test_weight_sync_invalidates_the_prefix_cache(tmp_path):
    corpus = [f"<|im_start|>system\nyou add {a} and {a * 7} with the tool<|im_end|>\n" for a in range(300)]
    tok = build_tokenizer(corpus, vocab_size=400)
    model = noisy_tiny_model(tok, max_position_embeddings=512, scale=0.1)
    old = save_hf(model, tok, tmp_path / "old")
    system = tok.encode(" ".join(corpus[:12]))  # a long shared prefix: several KV blocks
    assert len(system) >= 64
    prompts = [system + tok.encode(f"add {a} and") for a in (3, 17, 42)]
    stop = [tok.eos_token_id]

    engine = VLLMEngine(str(old), EngineSettings(max_model_len=512), stop_token_ids=stop, log_stats=True)
    try:
        before = _generate(engine, prompts)
        assert _generate(engine, prompts) == before  # the cached prefix gives the same generation
        stats = engine.prefix_cache_stats()
        assert stats["hits"] >= len(system), f"the shared prefix was not served from the cache: {stats}"

        # Samples of one prompt in one call (a GRPO group) read its blocks, prefilled once, from the cache.
        engine.sync_weights(model.state_dict())  # unchanged weights; the cache is reset
        hits = engine.prefix_cache_stats()["hits"]
        engine.generate([prompts[0]] * 4, SamplingConfig(max_tokens=4, temperature=1.0), seeds=[0, 1, 2, 3])
        full_blocks = len(prompts[0]) // 32 * 32  # KV blocks of 32 tokens; only full ones are cached
        assert engine.prefix_cache_stats()["hits"] - hits >= 3 * full_blocks

        perturb(model, 0.2, 1)
        engine.sync_weights(model.state_dict())
        after = _generate(engine, prompts)
    finally:
        engine.close()
    assert after != before, "the test cannot tell the new weights from the old ones"

    fresh_engine = VLLMEngine(
        str(save_hf(model, tok, tmp_path / "new")), EngineSettings(max_model_len=512), stop_token_ids=stop
    )
    try:
        fresh = _generate(fresh_engine, prompts)
    finally:
        fresh_engine.close()
    for (ids_a, lp_a), (ids_f, lp_f) in zip(after, fresh):
        assert ids_a == ids_f
        assert max(abs(a - b) for a, b in zip(lp_a, lp_f)) <= 1e-4
