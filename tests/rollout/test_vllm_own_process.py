"""vLLM in a process of its own beside a 2-rank trainer world (the multi-rank train stage's engine).

In a fresh process (vLLM caches its environment once an in-process engine has started), rank 0 of a
2-rank gloo world starts a vLLM engine with ``EngineSettings(own_process=True)``: the trainer's world is untouched (rank 1
still meets rank 0 in a barrier afterwards), the engine is vLLM's multiprocessing client, and its
log-probs equal the trainer's before an "update", differ after it (stale weights), and equal them again
after the weight sync through a safetensors file (components.rollout.vllm_worker).
"""

from __future__ import annotations

import pytest
import torch

from components.train.launch import run_local

pytestmark = pytest.mark.vllm

TOL = 1e-3  # as tests/rollout/test_rollout_sync.py


def _follower(rank: int) -> None:
    from components.train.distributed import init_distributed

    init_distributed()
    torch.distributed.barrier()


def _max_diff(tok, model, engine, seed: int) -> float:
    from components.rollout import SamplingConfig
    from components.train.policy import make_token_batch, response_logprobs

    prompts = [tok.encode(f"add {a} and") for a in (3, 17, 42, 99)]
    gens = engine.generate(
        prompts, SamplingConfig(max_tokens=24, temperature=1.0), seeds=[seed + i for i in range(4)]
    )
    batch = make_token_batch(prompts, [g[0].token_ids for g in gens], pad_id=tok.pad_token_id)
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch)
    return max(
        float((logp[i, : len(g[0].logprobs)] - torch.tensor(g[0].logprobs)).abs().max())
        for i, g in enumerate(gens)
    )


def _leader(rank: int, workdir: str, out: str) -> None:
    from components.model.tiny import save_hf
    from components.model.tokenizer import build_tokenizer
    from components.rollout import EngineSettings
    from components.rollout.factory import make_engine
    from components.train.distributed import init_distributed
    from components.train.launch import local_world
    from tests.tiny_vllm_models import noisy_tiny_model, perturb

    corpus = [f"<|im_start|>user\nadd {a} and {a * 7}<|im_end|>\n" for a in range(300)]
    tok = build_tokenizer(corpus, vocab_size=400)
    model = noisy_tiny_model(tok, max_position_embeddings=256, scale=0.1).eval()
    path = save_hf(model, tok, f"{workdir}/m")
    result = {}
    with local_world(2, _follower):
        init_distributed()
        settings = EngineSettings("vllm", max_model_len=256, seed=0, own_process=True)
        engine = make_engine(settings, str(path), stop_token_ids=[tok.eos_token_id])
        result["client"] = type(engine.llm.llm_engine.engine_core).__name__
        result["before"] = _max_diff(tok, model, engine, 1)
        perturb(model, 0.05, 1)
        result["stale"] = _max_diff(tok, model, engine, 2)
        engine.sync_weights(model.state_dict())
        result["after"] = _max_diff(tok, model, engine, 2)
        result["world"] = torch.distributed.get_world_size()
        engine.close()
        torch.distributed.barrier()  # rank 1 is still in the trainer's world
    torch.save(result, out)


def test_own_process_engine_syncs_beside_a_two_rank_world(tmp_path):
    out = tmp_path / "result.pt"
    run_local(1, _leader, (str(tmp_path), str(out)))
    r = torch.load(out)
    print(r)
    assert r["client"] != "InprocClient" and r["world"] == 2
    assert r["before"] <= TOL
    assert r["stale"] > 10 * TOL, "the test cannot tell stale weights from synced ones"
    assert r["after"] <= TOL
