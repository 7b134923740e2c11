"""One rank of a world torchrun started, for tests/train/test_torchrun.py.

``torchrun ... torchrun_world.py WHAT OUT [SUMMARY_JSON]``: rank 0 enters
components.train.launch.local_world (under torchrun it spawns nothing: components.train.torchrun
.as_rank_0), every other rank runs components.train.torchrun.run_rank, as the sft and train stages
do. WHAT is ``sft``, one SFT step of the tiny model (tests/train/rank_worlds.py's ``step``:
every rank the same batch, each its share of the micro-batches; rank 0 saves the weights to OUT),
or ``wait``: every rank prints ``READY <rank> <pid>`` and rank 1 waits in a broadcast while rank 0
runs Python code, until something is killed. SUMMARY_JSON is what this process posts for the
settings check (several agents only); ``-`` posts nothing.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # train_helpers, rank_worlds


def _rank(rank: int, what: str, out: str) -> None:
    import torch.distributed as dist

    if what == "sft":
        from rank_worlds import step

        step(rank, "sft", out, drop_rank=-1)
        return
    from components.train.distributed import init_distributed

    init_distributed()
    dist.barrier()
    print(f"READY {rank} {os.getpid()}", flush=True)
    if rank > 0:
        dist.broadcast_object_list([None], src=0)
    while True:
        sum(i * i for i in range(10_000))


def main(what: str, out: str, summary: str = "-") -> None:
    from components.train.launch import local_world
    from components.train.torchrun import Torchrun, run_rank

    run = Torchrun.from_env()
    assert run is not None, "start this script with torchrun"
    agreed = {} if summary == "-" else json.loads(summary)
    if run.rank == 0:
        with local_world(run.world_size, _rank, (what, out), summary=agreed):
            _rank(0, what, out)
    else:
        run_rank(run, run.world_size, _rank, (what, out), summary=agreed)
    print(f"rank {run.rank}: done in {os.getcwd()}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
