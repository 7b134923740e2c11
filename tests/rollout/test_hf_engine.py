"""The ``hf`` rollout engine: one log-prob per sampled token, recorded step by step by a forward hook,
equals the log-softmax of the raw logits of a plain forward over prompt + response (no full-vocabulary
scores are stacked)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from train_helpers import tiny_model

from components.rollout.base import SamplingConfig
from components.rollout.hf_engine import HFEngine


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    tiny_model(3).save_pretrained(d)
    return HFEngine(str(d), stop_token_ids=[2])


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_logprobs_equal_a_plain_forward(engine, temperature, top_p):
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    sampling = SamplingConfig(max_tokens=12, temperature=temperature, top_p=top_p, n=2)
    out = engine.generate(prompts, sampling, seeds=[4])
    assert [len(g) for g in out] == [2, 2, 2]
    for prompt, gens in zip(prompts, out):
        for g in gens:
            assert 1 <= len(g.token_ids) == len(g.logprobs) <= 12
            ids = torch.tensor([prompt + g.token_ids])
            with torch.no_grad():
                logits = engine.model(input_ids=ids).logits[0].float()
            # the sampled distribution's log-probs: tempered (raw when greedy), top-p not applied
            logp = torch.log_softmax(logits / (temperature or 1.0), -1)[len(prompt) - 1 : -1]
            want = logp.gather(-1, torch.tensor(g.token_ids).unsqueeze(-1)).squeeze(-1)
            torch.testing.assert_close(torch.tensor(g.logprobs), want, atol=1e-5, rtol=1e-5)
            assert (g.finish_reason == "stop") == (g.token_ids[-1] == 2)


def test_the_hook_is_removed_after_generate(engine):
    engine.generate([[5, 6, 7]], SamplingConfig(max_tokens=3), seeds=[0])
    assert not engine.model._forward_hooks
