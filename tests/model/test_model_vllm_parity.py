"""A saved tiny model serves in vLLM (CPU, in-process) and greedy tokens match transformers exactly."""

from __future__ import annotations

import os

import pytest
import torch

from components.model.tiny import load_hf, save_hf
from tests.tiny_vllm_models import noisy_tiny_model

pytestmark = pytest.mark.vllm

MAX_NEW = 16


@pytest.fixture(scope="module")
def served(tok, tmp_path_factory):
    """(model dir, vLLM engine): one engine start for the whole module."""
    model = noisy_tiny_model(tok, max_position_embeddings=512, scale=0.15)
    out = save_hf(model, tok, tmp_path_factory.mktemp("vllm") / "tiny")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    vllm = pytest.importorskip("vllm")
    llm = vllm.LLM(model=str(out), dtype="float32", max_model_len=512, enforce_eager=True, seed=0)
    yield out, llm
    del llm


def test_vllm_greedy_matches_transformers(tok, served, calc_tool, calc_messages):
    from vllm import SamplingParams

    out, llm = served
    render = dict(tools=[calc_tool], tokenize=False, add_generation_prompt=True)
    prompts = [
        tok.encode(tok.apply_chat_template(calc_messages[:2], **render)),
        tok.encode(tok.apply_chat_template(calc_messages[:4], **render)),
        tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is 7 * 8?"}], **render)),
        tok.encode("12345 + 678 ="),
    ]
    results = llm.generate(
        [{"prompt_token_ids": ids} for ids in prompts],
        SamplingParams(temperature=0, max_tokens=MAX_NEW, detokenize=False, logprobs=0),
    )
    got = [list(r.outputs[0].token_ids) for r in results]
    got_logprobs = [
        [d[t].logprob for d, t in zip(r.outputs[0].logprobs, r.outputs[0].token_ids)] for r in results
    ]
    assert sum(len(set(g)) for g in got) > 2 * len(got), f"degenerate outputs, weak comparison: {got}"

    model, _ = load_hf(out)
    eos = model.generation_config.eos_token_id
    for ids, vllm_ids, vllm_lp in zip(prompts, got, got_logprobs):
        x = torch.tensor([ids])
        hf = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_NEW, do_sample=False)
        hf_ids = hf[0, len(ids) :].tolist()
        assert vllm_ids == hf_ids, (ids, vllm_ids, hf_ids)
        assert len(vllm_ids) == MAX_NEW or vllm_ids[-1] == eos
        # the numbers agree too, not just the argmax: log-probs of the chosen tokens
        with torch.no_grad():
            logits = model(hf[:, :-1]).logits[0, len(ids) - 1 :]  # (new, V)
        hf_lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(hf_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(vllm_lp), hf_lp, atol=1e-4), (vllm_lp, hf_lp.tolist())
    assert len({tuple(g) for g in got}) > 1, "outputs do not depend on the prompt"
