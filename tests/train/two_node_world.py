"""One "machine" of a two-machine world, for tests/train/test_two_nodes.py.

``python two_node_world.py WHAT NODE_RANK PORT OUT [SUMMARY_JSON]`` runs in its own working
directory: node 0 is rank 0 of the world (components.train.launch.local_world with two nodes), node
1 runs rank 1 (node_world); they meet on node 0's TCPStore at 127.0.0.1:PORT. WHAT is the work of
tests/train/test_data_parallel.py: ``sft``, one SFT step of the tiny model (``_step``: every rank
the same batch, each its share of the micro-batches), or ``rl``, the train stage's session on two
ranks (``_session_update``: rank 0 leads a GRPO update and a save, rank 1 follows; the model it
starts from is ``init`` in the working directory), or ``wait``: rank 1 waits in a broadcast (as a
train-stage follower between calls) while rank 0 runs Python code, until something is killed
(each prints ``READY <pid>`` first). Node 0 saves the weights to OUT; every rank writes the addresses
its process listens on to ``listening-<rank>.json`` in its working directory.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # train_helpers, test_data_parallel


def _rank(rank: int, what: str, out: str) -> None:
    import psutil
    import torch.distributed as dist
    from test_data_parallel import _session_update, _step

    if what == "wait":
        from components.train.distributed import init_distributed

        init_distributed()
        dist.barrier()
        print(f"READY {os.getpid()}", flush=True)
        if rank > 0:
            dist.broadcast_object_list([None], src=0)
        while True:
            sum(i * i for i in range(10_000))
    elif what == "sft":
        _step(rank, "sft", out, drop_rank=-1)
    else:
        _session_update(rank, "init", out, drop_rank=-1)
    dist.barrier()
    ips = sorted({c.laddr.ip for c in psutil.Process().net_connections("inet") if c.status == "LISTEN"})
    Path(f"listening-{rank}.json").write_text(json.dumps(ips))


def main(what: str, node_rank: str, port: str, out: str, summary: str = '{"params": {"lr": 0.01}}') -> None:
    from components.train.launch import local_world, node_world
    from components.train.nodes import Nodes

    nodes = Nodes(count=2, rank=int(node_rank), master_addr="127.0.0.1", master_port=int(port), timeout_s=120)
    agreed = json.loads(summary)
    if nodes.rank == 0:
        with local_world(2, _rank, (what, out), nodes=nodes, summary=agreed):
            _rank(0, what, out)
    else:
        node_world(2, _rank, (what, out), nodes=nodes, summary=agreed)
    print(f"node {nodes.rank}: done in {os.getcwd()}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
