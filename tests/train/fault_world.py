"""A stand-in for a multi-rank stage, for tests/train/test_rank_faults.py: ``python fault_world.py SCENARIO``.

Rank 0 is this process (components.train.launch.local_world, 2 ranks); rank 1 waits for rank 0's
next call in a broadcast, as a train-stage follower does (components.train.rank_mirror.follow).
When everything is up it prints ``READY <json>`` (the pids) and then, as the scenario says:

- ``rollout``: rank 0 runs Python code outside any collective (as during a rollout) until stopped;
- ``blocked``: rank 0 sleeps in C (no exception can reach it) with a 3 s stop grace;
- ``raise``: rank 1 raises an exception after READY;
- ``collective``: rank 0 waits in a barrier that rank 1 (asleep) never enters, so that rank 1's
  death fails rank 0's collective (the peer's socket closes) as the watch sees the process end;
- ``vllm``: as ``rollout``, with an own-process vLLM engine generating (the train stage's), built
  from a tiny model in the directory given as the second argument. Before READY, rank 0 checks the
  engine against the trainer's model (tests/tiny_vllm_models.sync_check, the check of
  tests/rollout/test_vllm_own_process.py, in the same world: one vLLM start for both) and prints
  ``SYNC <json>``; then rank 1 meets rank 0 in a second barrier (the trainer's world is
  untouched by the engine).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch


def _follower(rank: int, scenario: str) -> None:
    import torch.distributed as dist

    from components.train.distributed import init_distributed

    init_distributed()
    dist.barrier()
    if scenario == "raise":
        time.sleep(1.0)
        raise ValueError("a follower's own error")
    if scenario == "collective":
        time.sleep(600)
    if scenario == "vllm":
        dist.barrier()  # after rank 0's sync check
    box = [None]
    dist.broadcast_object_list(box, src=0)  # the next mirrored call, which never comes


def _engine(workdir: str):
    from components.model.tiny import save_hf
    from components.model.tokenizer import build_tokenizer
    from components.rollout import EngineSettings
    from components.rollout.factory import make_engine
    from tests.tiny_vllm_models import noisy_tiny_model

    corpus = [f"<|im_start|>user\nadd {a} and {a * 7}<|im_end|>\n" for a in range(300)]
    tok = build_tokenizer(corpus, vocab_size=400)
    model = noisy_tiny_model(tok, max_position_embeddings=256, scale=0.1).eval()
    path = save_hf(model, tok, f"{workdir}/m")
    settings = EngineSettings("vllm", max_model_len=256, seed=0, own_process=True)
    engine = make_engine(settings, str(path), stop_token_ids=[tok.eos_token_id])
    return engine, tok, model


def main(scenario: str, workdir: str | None = None) -> None:
    import psutil

    from components.train import rank_watch
    from components.train.distributed import init_distributed
    from components.train.launch import local_world
    from tests.tiny_vllm_models import sync_check

    if scenario == "blocked":
        rank_watch.STOP_GRACE_S = 3.0
    with local_world(2, _follower, (scenario,)):
        init_distributed()
        torch.distributed.barrier()
        engine = prompts = None
        if scenario == "vllm":
            engine, tok, model = _engine(workdir)
            print("SYNC " + json.dumps(sync_check(engine, tok, model)), flush=True)
            torch.distributed.barrier()  # rank 1 is still in the trainer's world
            prompts = [tok.encode(f"add {a} and") for a in range(32)]
        me = psutil.Process()
        follower = [p.pid for p in me.children() if "spawn_main" in " ".join(p.cmdline())]
        print("READY " + json.dumps({"rank0": os.getpid(), "followers": follower}), flush=True)
        if scenario == "blocked":
            time.sleep(600)
        if scenario == "collective":
            torch.distributed.barrier()
        while True:
            if engine is not None:
                from components.rollout import SamplingConfig

                engine.generate(
                    prompts, SamplingConfig(max_tokens=64, temperature=1.0), seeds=list(range(32))
                )
            else:
                sum(i * i for i in range(10_000))


if __name__ == "__main__":
    main(*sys.argv[1:])
