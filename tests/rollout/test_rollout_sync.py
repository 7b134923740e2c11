"""vLLM rollout engine: log-probs equal the trainer's, before and right after an in-place weight sync,
at a sampling temperature other than 1 (the tempered distribution's, as the trainer computes them),
and after a sync of a LoRA actor's merged weights (components.train.lora). One engine for the module."""

from __future__ import annotations

import copy

import pytest
import torch

from components.model.tiny import save_hf
from components.model.tokenizer import build_tokenizer
from components.rollout import EngineSettings, SamplingConfig
from components.rollout.factory import make_engine
from components.train.lora import LoraSettings, add_lora, merged_state_dict
from components.train.policy import make_token_batch, response_logprobs
from tests.tiny_vllm_models import noisy_tiny_model, perturb

pytestmark = pytest.mark.vllm

TOL = 1e-3  # issue target for fp32: max |logp_vllm - logp_trainer| <= 1e-3


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    corpus = [f"<|im_start|>user\nadd {a} and {a * 7}<|im_end|>\n" for a in range(300)]
    tok = build_tokenizer(corpus, vocab_size=400)
    model = noisy_tiny_model(tok, max_position_embeddings=256, scale=0.1)
    path = save_hf(model, tok, tmp_path_factory.mktemp("sync") / "m")
    engine = make_engine(
        EngineSettings("vllm", max_model_len=256, seed=0), str(path), stop_token_ids=[tok.eos_token_id]
    )
    yield tok, model.eval(), engine
    engine.close()


def _max_diff(
    tok, model, engine, seed: int, temperature: float = 1.0, trainer_temperature: float | None = None
) -> tuple[float, int]:
    """max |log-prob of vLLM - the trainer's| over responses sampled at ``temperature``, the trainer's
    at ``trainer_temperature`` (None: the same), and their tokens."""
    prompts = [tok.encode(f"add {a} and") for a in (3, 17, 42, 99, 123, 250)]
    cfg = SamplingConfig(max_tokens=24, temperature=temperature)
    gens = engine.generate(prompts, cfg, seeds=[seed + i for i in range(len(prompts))])
    responses = [g[0].token_ids for g in gens]
    batch = make_token_batch(prompts, responses, pad_id=tok.pad_token_id)
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch, temperature=trainer_temperature or temperature)
    diffs = [
        (logp[i, : len(g[0].logprobs)] - torch.tensor(g[0].logprobs)).abs().max().item()
        for i, g in enumerate(gens)
    ]
    return max(diffs), sum(len(r) for r in responses)


def test_logprobs_match_trainer_before_and_after_sync(setup):
    tok, model, engine = setup
    before, n = _max_diff(tok, model, engine, seed=1)
    assert n > 20
    assert before <= TOL, f"before sync: max |dlogp| = {before:.2e}"

    perturb(model, 0.05, 1)  # an "update": the engine still holds the old weights
    stale, _ = _max_diff(tok, model, engine, seed=2)
    assert stale > 10 * TOL, "the test cannot tell stale weights from synced ones"

    engine.sync_weights(model.state_dict())
    after, _ = _max_diff(tok, model, engine, seed=2)
    print(
        f"max |logp_vllm - logp_trainer|: before sync {before:.2e}, stale {stale:.2e}, after sync {after:.2e}"
    )
    assert after <= TOL, f"after sync: max |dlogp| = {after:.2e}"


def test_logprobs_are_the_tempered_distributions(setup):
    """At T=0.4 (the profiles' training temperature) vLLM reports log_softmax(logits / T) of the
    sampled token (logprobs_mode processed_logprobs), which is what the trainer computes at T, not the
    raw logits' log-probs (vLLM's default): an off-policy correction weighs the two against each other."""
    tok, model, engine = setup
    tempered, n = _max_diff(tok, model, engine, seed=5, temperature=0.4)
    assert n > 20
    assert tempered <= TOL, f"T=0.4: max |dlogp| = {tempered:.2e}"
    # the same samples against the untempered log-probs differ: the comparison can tell them apart
    untempered, _ = _max_diff(tok, model, engine, seed=5, temperature=0.4, trainer_temperature=1.0)
    assert untempered > 10 * TOL, f"untempered log-probs are as close ({untempered:.2e}): a weak test"


def test_seeded_sampling_is_reproducible(setup):
    tok, _, engine = setup
    prompts = [tok.encode("add 5 and"), tok.encode("add 6 and")]
    cfg = SamplingConfig(max_tokens=16, temperature=1.0)
    a = engine.generate(prompts, cfg, seeds=[7, 8])
    b = engine.generate(prompts[::-1], cfg, seeds=[8, 7])
    assert a[0][0].token_ids == b[1][0].token_ids and a[1][0].token_ids == b[0][0].token_ids


def test_n_samples_per_prompt(setup):
    tok, _, engine = setup
    out = engine.generate([tok.encode("add 1 and")], SamplingConfig(max_tokens=8, n=4), seeds=[3])
    assert len(out) == 1 and len(out[0]) == 4
    assert len({tuple(g.token_ids) for g in out[0]}) > 1
    for g in out[0]:
        assert len(g.token_ids) == len(g.logprobs) and g.finish_reason in ("stop", "length")


def test_merged_lora_weights_give_vllm_the_trainers_logprobs(setup):
    """vLLM gets a LoRA actor's merged weights: its log-probs equal the trainer's (adapters on)."""
    tok, model, engine = setup
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    peft_model = add_lora(copy.deepcopy(model), LoraSettings(rank=4, alpha=8.0, target_modules=targets))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # "trained" adapters: B is 0 at the start
        for name, p in peft_model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    trainer = peft_model.get_base_model().eval()
    try:
        stale, _ = _max_diff(tok, trainer, engine, seed=1)  # the engine holds the module's model
        assert stale > 10 * TOL, "the test cannot tell the base weights from the merged ones"
        engine.sync_weights(merged_state_dict(peft_model))
        after, _ = _max_diff(tok, trainer, engine, seed=1)
        print(
            f"max |logp_vllm - logp_trainer| with LoRA: stale {stale:.2e}, after the merged sync {after:.2e}"
        )
        assert after <= TOL
    finally:  # the module's other tests (in any order) find the engine holding the module's model
        engine.sync_weights(model.state_dict())
