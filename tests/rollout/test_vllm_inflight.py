"""The in-flight engine (components.rollout.vllm_inflight, rollout.inflight_updates): weights pushed
from another thread while a generation runs take effect between two decode steps.

In a fresh process (vLLM caches its environment once an in-process engine has started), an
:class:`InflightVLLMEngine` serves a tiny model; one thread generates long answers while the main
thread pushes an "update" of the weights. Every answer is then the old weights' samples up to a
point and the new weights' after it: the log-prob of each token equals the old model's (before the
point) or the new model's (after it), computed by transformers over the whole prefix, within the
engine's tolerance. At least one answer straddles the push, the push is counted as landing in a
running generation, the answers carry the version they started with (0), and the next generation
is the new version's (1) throughout.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from components.train.launch import run_local

pytestmark = pytest.mark.vllm

TOL = 1e-3  # as tests/rollout/test_rollout_sync.py
MAX_TOKENS = 600


def _token_logprobs(model, prompt: list[int], ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]


def _split(old: torch.Tensor, new: torch.Tensor, got: torch.Tensor) -> int | None:
    """The point b at which the tokens stop matching ``old`` and match ``new`` (len: all old), or None
    when no such point exists."""
    ok_old, ok_new = (old - got).abs() <= TOL, (new - got).abs() <= TOL
    for b in range(len(got) + 1):
        if bool(ok_old[:b].all()) and bool(ok_new[b:].all()):
            return b
    return None


def _body(rank: int, workdir: str, out: str) -> None:
    import copy

    from components.model.tiny import save_hf
    from components.model.tokenizer import build_tokenizer
    from components.rollout import EngineSettings, SamplingConfig
    from components.rollout.factory import make_engine
    from tests.tiny_vllm_models import noisy_tiny_model, perturb

    corpus = [f"<|im_start|>user\nadd {a} and {a * 7}<|im_end|>\n" for a in range(300)]
    tok = build_tokenizer(corpus, vocab_size=400)
    old = noisy_tiny_model(tok, max_position_embeddings=1024, scale=0.1).eval()
    path = save_hf(old, tok, f"{workdir}/m")
    new = copy.deepcopy(old)
    perturb(new, 0.05, 1)
    settings = EngineSettings("vllm", max_model_len=1024, seed=0, own_process=True, inflight_updates=True)
    engine = make_engine(settings, str(path), stop_token_ids=[tok.eos_token_id])
    result: dict = {"engine": type(engine).__name__}
    try:
        prompts = [tok.encode(f"add {a} and") for a in (3, 17, 42, 99, 123, 250, 7, 77)]
        cfg = SamplingConfig(max_tokens=MAX_TOKENS, temperature=1.0)
        seeds = list(range(len(prompts)))
        box: dict = {}
        gen = threading.Thread(target=lambda: box.update(gens=engine.generate(prompts, cfg, seeds=seeds)))
        gen.start()
        while engine.tokens_generated < 40 * len(prompts) and gen.is_alive():  # some tokens in
            time.sleep(0.005)
        engine.sync_weights(new.state_dict())
        gen.join()
        result["pushes_mid_generation"] = engine.pushes_mid_generation
        result["version_after"] = engine.policy_version
        result["stamps"] = [g[0].policy_version for g in box["gens"]]
        result["splits"], result["lengths"] = [], []
        for p, (g,) in zip(prompts, box["gens"]):
            got = torch.tensor(g.logprobs)
            b = _split(_token_logprobs(old, p, g.token_ids), _token_logprobs(new, p, g.token_ids), got)
            result["splits"].append(b)
            result["lengths"].append(len(g.token_ids))
        after = engine.generate(prompts[:4], SamplingConfig(max_tokens=32, temperature=1.0), seeds=seeds[:4])
        result["after_stamps"] = [g[0].policy_version for g in after]
        result["after_gap"] = max(
            float((_token_logprobs(new, p, g.token_ids) - torch.tensor(g.logprobs)).abs().max())
            for p, (g,) in zip(prompts, after)
        )
    finally:
        engine.close()
    torch.save(result, out)


def test_a_push_lands_between_two_decode_steps_of_a_running_generation(tmp_path):
    out = tmp_path / "result.pt"
    run_local(1, _body, (str(tmp_path), str(out)))
    r = torch.load(out)
    print(f"tokens of each answer: {r['lengths']}; the old version's up to: {r['splits']}")
    assert r["engine"] == "InflightVLLMEngine"
    assert None not in r["splits"], f"a token matched neither version: {r['splits']} of {r['lengths']}"
    straddling = [b for b, n in zip(r["splits"], r["lengths"]) if 0 < b < n]
    assert sum(r["splits"]) >= 40, "the push came before the old weights had sampled much"
    assert straddling, f"no answer straddles the push: splits {r['splits']} of lengths {r['lengths']}"
    assert r["pushes_mid_generation"] == 1 and r["version_after"] == 1
    assert r["stamps"] == [0] * len(r["stamps"]), "a generation is stamped with the version it started with"
    assert r["after_stamps"] == [1] * 4 and r["after_gap"] <= TOL
