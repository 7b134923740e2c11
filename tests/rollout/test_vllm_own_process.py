"""vLLM in a process of its own beside a 2-rank trainer world (the multi-rank train stage's engine).

In a fresh process (vLLM caches its environment once an in-process engine has started), rank 0 of a
2-rank gloo world starts a vLLM engine with ``EngineSettings(own_process=True)``: the trainer's world
is untouched (rank 1 still meets rank 0 in a barrier afterwards), the engine is vLLM's
multiprocessing client, and its log-probs equal the trainer's before an "update", differ after it
(stale weights), and equal them again after the weight sync through a safetensors file
(components.rollout.vllm_worker): tests/tiny_vllm_models.sync_check.

Slow: the default run makes the same check (the same sync_check, the same assertions) in
tests/train/test_rank_faults.py::test_own_process_vllm_syncs_beside_two_ranks_and_ends_with_a_killed_rank_0,
whose world and vLLM engine then serve the kill of rank 0: one vLLM start for both.
"""

from __future__ import annotations

import pytest
import torch

from components.train.launch import run_local

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TOL = 1e-3  # as tests/rollout/test_rollout_sync.py


def _follower(rank: int) -> None:
    from components.train.distributed import init_distributed

    init_distributed()
    torch.distributed.barrier()


def _leader(rank: int, workdir: str, out: str) -> None:
    from components.model.tiny import save_hf
    from components.model.tokenizer import build_tokenizer
    from components.rollout import EngineSettings
    from components.rollout.factory import make_engine
    from components.train.distributed import init_distributed
    from components.train.launch import local_world
    from tests.tiny_vllm_models import noisy_tiny_model, sync_check

    corpus = [f"<|im_start|>user\nadd {a} and {a * 7}<|im_end|>\n" for a in range(300)]
    tok = build_tokenizer(corpus, vocab_size=400)
    model = noisy_tiny_model(tok, max_position_embeddings=256, scale=0.1).eval()
    path = save_hf(model, tok, f"{workdir}/m")
    with local_world(2, _follower):
        init_distributed()
        settings = EngineSettings("vllm", max_model_len=256, seed=0, own_process=True)
        engine = make_engine(settings, str(path), stop_token_ids=[tok.eos_token_id])
        result = sync_check(engine, tok, model)
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
