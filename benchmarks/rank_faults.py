"""How long a 2-rank world takes to end after a rank is killed, and what it leaves behind.

    python benchmarks/rank_faults.py [--repeats 5] [--model models/base] [--what follower,rank0]

Each repeat starts a stand-in of the train stage in a process of its own: rank 0 of a 2-rank
``components.train.launch.local_world``, rank 1 waiting for rank 0's next call in a broadcast (as a
train-stage follower does), and for ``rank0`` an own-process vLLM engine on ``--model`` generating
(the train stage's, ``VLLMEngine(own_process=True)``). Then:

- ``follower``: rank 1 is killed with SIGKILL while rank 0 runs Python code outside any collective
  (as in a rollout); measured: seconds until rank 0 has exited (components.train.rank_watch), and
  the processes of the world still running 10 s after that;
- ``rank0``: rank 0 is killed with SIGKILL mid-generation; measured: seconds until every process of
  its tree (recorded before the kill: rank 1, vLLM's EngineCore and worker, the resource tracker) has
  ended, and those still running after 60 s.

Ranks on several machines are torchrun's, which stops them itself (tests/train/test_torchrun.py).

Prints one line per repeat and min / median / max. Shared machines are noisy: give the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import psutil


def _follower(rank: int) -> None:
    import torch.distributed as dist

    from components.train.distributed import init_distributed

    init_distributed()
    box = [None]
    dist.broadcast_object_list(box, src=0)


def world(model: str | None) -> None:
    """The stand-in stage (this script with ``--world``)."""
    import torch

    import flows  # noqa: F401  (process defaults for vLLM)
    from components.train.distributed import init_distributed
    from components.train.launch import local_world

    with local_world(2, _follower):
        init_distributed()
        engine = None
        if model:
            from transformers import AutoTokenizer

            from components.rollout import EngineSettings, SamplingConfig
            from components.rollout.factory import make_engine

            tok = AutoTokenizer.from_pretrained(model)
            settings = EngineSettings("vllm", max_model_len=512, seed=0, own_process=True)
            engine = make_engine(settings, model, stop_token_ids=[tok.eos_token_id])
            prompts = [tok.encode(f"what is {a} plus {a * 7}?") for a in range(32)]
        kids = psutil.Process().children()
        print(
            "READY " + json.dumps([p.pid for p in kids if "spawn_main" in " ".join(p.cmdline())]), flush=True
        )
        torch.distributed.barrier()
        while True:
            if engine is not None:
                engine.generate(
                    prompts, SamplingConfig(max_tokens=64, temperature=1.0), seeds=list(range(32))
                )
            else:
                sum(i * i for i in range(10_000))


def _alive(tree: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in tree:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def once(what: str, model: str) -> tuple[float, list[str]]:
    args = [sys.executable, __file__, "--world", "--model", model if what == "rank0" else ""]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("READY "):
                followers = json.loads(line[6:])
                break
        else:
            raise SystemExit(f"the world exited before it was ready ({proc.wait()})")
        time.sleep(2.0)
        tree = psutil.Process(proc.pid).children(recursive=True)
        t0 = time.monotonic()
        if what == "follower":
            os.kill(followers[0], signal.SIGKILL)
            proc.wait(timeout=120)
            took, limit = time.monotonic() - t0, 10.0
        else:
            proc.kill()
            proc.wait()
            while _alive(tree) and time.monotonic() - t0 < 60:
                time.sleep(0.02)
            took, limit = time.monotonic() - t0, 0.0
        time.sleep(limit)
        return took, [f"{p.pid} {p.name()}" for p in _alive(tree)]
    finally:
        for p in _alive([psutil.Process(proc.pid)] if proc.poll() is None else []):
            p.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", default="models/base")
    ap.add_argument("--what", default="follower,rank0")
    ap.add_argument("--world", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.world:
        world(args.model)
        return
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for what in args.what.split(","):
        times = []
        for i in range(args.repeats):
            took, left = once(what, args.model)
            times.append(took)
            print(
                f"{what} killed, repeat {i + 1}: ended after {took:.2f} s, left behind: {left or 'nothing'}",
                flush=True,
            )
        print(
            f"{what}: min {min(times):.2f} s, median {statistics.median(times):.2f} s, max {max(times):.2f} s "
            f"({args.repeats} repeats; load average now {os.getloadavg()[0]:.1f})"
        )


if __name__ == "__main__":
    main()
