"""Ranks started by torchrun (components.train.torchrun): the weights of one rank, torchrun's own stop.

- ``torchrun --standalone --nproc-per-node 2`` and two torchrun agents on this machine as two nodes
  (``--nnodes 2 --node-rank n --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:<free port>``, one rank
  each, each in a working directory of its own) run tests/train/torchrun_world.py: rank 0 through
  ``launch.local_world`` (which spawns nothing under torchrun), rank 1 through ``torchrun.run_rank``,
  one SFT step of the tiny model (tests/train/rank_worlds.py's ``step``). The weights equal world size
  1's (its ``sft`` case in conftest's ``rank_worlds``, shared with test_data_parallel;
  train_helpers.assert_weights_match, test_data_parallel's tolerance), the loss to 1e-6. The
  two-agent case is slow (about 6.5 minutes at load average 10 on 2 cores; the standalone one 4.3).
- A rank killed (SIGKILL) stops the other: torchrun exits non-zero with its failure table naming the
  rank (``ChildFailedError``), and no rank is left running.
- The settings check under torchrun: the ranks whose summaries differ from rank 0's are named with the
  keys (their gathering over the process group runs in the two-agent test, where they agree); every
  rank takes the same decision to gather, machines with other process counts too (GROUP_WORLD_SIZE,
  not LOCAL_WORLD_SIZE); torchrun's WORLD_SIZE against deepspeed.world_size.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from train_helpers import RL_ENGINE_KW, assert_weights_match

from components.dist_env import WORLD_VARS
from components.train.distributed import free_port
from components.train.torchrun import NodeError, Torchrun, differences, disagreements

SCRIPT = Path(__file__).with_name("torchrun_world.py")
REPO = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in WORLD_VARS and k != "GLOO_SOCKET_IFNAME"}
    return {**env, "PYTHONPATH": str(REPO)}


def _torchrun(launch: list[str], script_args: list[str], cwd: Path) -> subprocess.Popen:
    """torchrun running tests/train/torchrun_world.py in ``cwd``, its output and its ranks' in one pipe."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [str(TORCHRUN), *launch, str(SCRIPT), *script_args],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@contextlib.contextmanager
def _stopped_after(procs: list[subprocess.Popen]) -> Iterator[None]:
    """Whatever happens in the block, no agent or rank of ``procs`` is left running after it (torchrun
    starts each rank in a session of its own, and a rank outlives a SIGKILL of its agent)."""
    import psutil

    try:
        yield
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    for child in psutil.Process(p.pid).children(recursive=True):
                        child.kill()
                p.kill()
                p.wait()


def _same_as_one_rank(rank_worlds, out: Path) -> None:
    one, two = rank_worlds.get(1)["sft"], torch.load(out)
    assert_weights_match(two["weights"], one["weights"], lr=RL_ENGINE_KW["lr"], steps=1)
    assert two["metrics"]["loss"] == pytest.approx(one["metrics"]["loss"], rel=1e-6)


def test_torchrun_standalone_two_ranks_give_the_weights_of_one_rank(tmp_path, rank_worlds) -> None:
    out = tmp_path / "weights.pt"
    proc = _torchrun(["--standalone", "--nproc-per-node", "2"], ["sft", str(out)], tmp_path / "run")
    with _stopped_after([proc]):
        log = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, log[-4000:]
    assert "rank 0: done" in log and "rank 1: done" in log, log[-4000:]
    _same_as_one_rank(rank_worlds, out)


@pytest.mark.slow  # three torchrun processes and two ranks, each importing DeepSpeed: minutes on 2 busy cores
def test_two_torchrun_agents_as_two_nodes_give_the_weights_of_one_rank(tmp_path, rank_worlds) -> None:
    port, out = free_port(), tmp_path / "node0" / "weights.pt"
    summary = json.dumps({"params": {"lr": 0.01}})
    procs = [
        _torchrun(
            ["--nnodes", "2", "--node-rank", str(n), "--nproc-per-node", "1"]
            + ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"],
            ["sft", str(out), summary],
            tmp_path / f"node{n}",
        )
        for n in (0, 1)
    ]
    with _stopped_after(procs):
        logs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n\n".join(log[-3000:] for log in logs)
    assert not (tmp_path / "node1" / "weights.pt").exists()  # rank 1 wrote nothing of rank 0's
    _same_as_one_rank(rank_worlds, out)


def test_a_killed_rank_stops_the_world_with_torchrun_s_failure_table(tmp_path) -> None:
    import psutil

    proc = _torchrun(["--standalone", "--nproc-per-node", "2"], ["wait", str(tmp_path / "w.pt")], tmp_path)
    with _stopped_after([proc]):
        pids = {}
        for line in proc.stdout:  # ranks' lines may share one: two processes write to one pipe
            pids.update((int(rank), int(pid)) for rank, pid in re.findall(r"READY (\d+) (\d+)", line))
            if len(pids) == 2:
                break
        assert len(pids) == 2, f"torchrun exited ({proc.wait()}) before both ranks were ready"
        os.kill(pids[1], signal.SIGKILL)
        log = proc.communicate(timeout=300)[0]
    assert proc.returncode != 0, log[-4000:]
    assert "ChildFailedError" in log, log[-4000:]
    table = log[log.index("Root Cause") :]
    assert "rank      : 1 (local_rank: 1)" in table and f"(pid: {pids[1]})" in table, table
    assert "Signal 9 (SIGKILL)" in table, table
    for pid in pids.values():  # rank 0 stopped by torchrun, rank 1 killed: neither is left running
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid


def test_ranks_with_other_settings_are_named_with_the_keys() -> None:
    rank0 = {"params": {"lr": 0.01, "steps": 4}, "code": "abc"}
    summaries = [rank0, rank0, {**rank0, "params": {"lr": 0.02, "steps": 4}}, {**rank0, "code": "abd"}]
    assert disagreements(summaries) == [
        "rank 2 runs with other settings or inputs than rank 0: params.lr differ",
        "rank 3 runs with other settings or inputs than rank 0: code differ",
    ]
    assert disagreements([rank0, rank0]) == [] and disagreements([rank0]) == []


def test_differences_flatten_nested_keys() -> None:
    assert differences({"p": {"a": 1, "b": 2}, "c": 1}, {"p": {"a": 1, "b": 3}, "d": 1}) == ["c", "d", "p.b"]
    assert differences({"x": [1, 2]}, {"x": [1, 2]}) == []


def _node_env(rank: int, local_world: int, *, world: int = 3, machines: int = 2) -> dict[str, str]:
    """What torchrun sets for a rank: ``LOCAL_WORLD_SIZE`` is its machine's, the rest the world's."""
    return {
        "TORCHELASTIC_RUN_ID": "x",
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_WORLD_SIZE": str(machines),
    }


def test_machines_with_other_process_counts_take_the_same_agreement_decision() -> None:
    # Node 0 runs rank 0 alone, node 1 ranks 1 and 2: WORLD_SIZE // LOCAL_WORLD_SIZE would be 3 on
    # one machine and 1 on the other, so one rank would skip agree()'s all_gather and the rest hang.
    ranks = [
        Torchrun.from_env(_node_env(0, 1)),
        Torchrun.from_env(_node_env(1, 2)),
        Torchrun.from_env(_node_env(2, 2)),
    ]
    assert [r.machines for r in ranks] == [2, 2, 2]
    one_machine = [Torchrun.from_env(_node_env(r, 2, world=2, machines=1)) for r in (0, 1)]
    assert [r.machines for r in one_machine] == [1, 1]
    with pytest.raises(NodeError, match="GROUP_WORLD_SIZE"):  # torchrun always sets it
        Torchrun.from_env({k: v for k, v in _node_env(0, 1).items() if k != "GROUP_WORLD_SIZE"})


def test_torchrun_s_world_must_be_the_params_world() -> None:
    run = Torchrun.from_env(_node_env(1, 2, world=4))
    assert run == Torchrun(rank=1, world_size=4, local_world_size=2, machines=2) and run.machines == 2
    run.check(4)
    with pytest.raises(NodeError, match="torchrun started WORLD_SIZE=4 ranks but deepspeed.world_size=2"):
        run.check(2)
    assert Torchrun.from_env({"RANK": "0", "WORLD_SIZE": "2"}) is None  # another launcher: not torchrun
    with pytest.raises(NodeError, match="TORCHELASTIC_RUN_ID is set .* RANK/WORLD_SIZE"):
        Torchrun.from_env({"TORCHELASTIC_RUN_ID": "x"})
