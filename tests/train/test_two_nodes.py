"""The multi-machine code path on one machine: two launchers as two nodes give the weights of one rank.

Two processes, each in a working directory of its own (nothing shared through the filesystem but
the script), are node 0 and node 1 of a 2-rank world (tests/train/two_node_world.py): node 0's
TCPStore on 127.0.0.1 (a free port), one rank per node. Their SFT step gives the weights of the same
step on one rank (test_data_parallel's tolerance: train_helpers.assert_weights_match), and no rank
listens beyond loopback. Nodes whose summaries differ both stop, naming the keys that differ.
A killed rank stops both nodes, naming it (how long that takes: benchmarks/rank_faults.py --what
nodes; a wall-clock bound here failed on a busy machine). Each node runs in a process group of its
own, killed when the test ends, so that a test that fails or times out leaves no rank behind.
The whole sft stage on two nodes is tests/flows/test_two_node_stage.py (slow).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from train_helpers import RL_ENGINE_KW, assert_weights_match

from components.train.distributed import free_port
from components.train.launch import run_local
from components.train.nodes import NodeError, Nodes, agree, differences, host_store, join_store

SCRIPT = Path(__file__).with_name("two_node_world.py")
REPO = Path(__file__).resolve().parents[2]


def _node(
    what: str, rank: int, port: int, workdir: Path, out: Path, summary: dict | None = None
) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    if what == "rl":  # the model the session starts from: each machine has its own copy
        from train_helpers import tiny_model, tiny_tokenizer

        tiny_model().save_pretrained(workdir / "init")
        tiny_tokenizer().save_pretrained(workdir / "init")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME"):
        env.pop(var, None)
    args = [sys.executable, str(SCRIPT), what, str(rank), str(port), str(out)]
    if summary is not None:
        args.append(json.dumps(summary))
    return subprocess.Popen(
        args,
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a process group of its own: the node and its ranks
    )


@contextlib.contextmanager
def _nodes(tmp_path: Path, what: str, prefix: str = "node", summaries=(None, None)):
    """Nodes 0 and 1 running ``what``; on leaving (however: a failed assertion, a timeout), whatever
    is left of their process groups is killed."""
    port = free_port()
    out = tmp_path / f"{prefix}0" / "weights.pt"
    procs = [_node(what, n, port, tmp_path / f"{prefix}{n}", out, summaries[n]) for n in (0, 1)]
    try:
        yield procs
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()


def _two_nodes(tmp_path: Path, what: str = "sft", summaries=(None, None)) -> tuple[list[int], list[str]]:
    with _nodes(tmp_path, what, summaries=summaries) as procs:
        logs = [p.communicate(timeout=600)[0] for p in procs]
        return [p.returncode for p in procs], logs


@pytest.mark.parametrize("what, metric", [("sft", "loss"), ("rl", "actor/entropy")])
def test_two_nodes_give_the_weights_of_one_rank(tmp_path, what, metric) -> None:
    from test_data_parallel import _session_run, _step

    codes, logs = _two_nodes(tmp_path, what)
    assert codes == [0, 0], "\n\n".join(log[-3000:] for log in logs)
    if what == "sft":
        run_local(1, _step, ("sft", str(tmp_path / "one.pt"), -1))
        one = torch.load(tmp_path / "one.pt")
    else:
        one = _session_run(tmp_path / "ref", 1)
    two = torch.load(tmp_path / "node0" / "weights.pt")
    assert_weights_match(two["weights"], one["weights"], lr=RL_ENGINE_KW["lr"], steps=1)
    assert two["metrics"][metric] == pytest.approx(one["metrics"][metric], rel=1e-6)
    assert not (tmp_path / "node1" / "weights.pt").exists()  # node 1 wrote nothing of rank 0's
    for n, rank in ((0, 0), (1, 1)):
        ips = json.loads((tmp_path / f"node{n}" / f"listening-{rank}.json").read_text())
        assert ips and all(ip in ("127.0.0.1", "::1") for ip in ips), (n, ips)


def test_nodes_with_other_settings_both_stop_naming_the_keys(tmp_path) -> None:
    mine, theirs = {"params": {"lr": 0.01, "steps": 4}}, {"params": {"lr": 0.02, "steps": 4}}
    codes, logs = _two_nodes(tmp_path, summaries=(mine, theirs))  # refused before any rank starts
    assert codes[0] != 0 and codes[1] != 0, logs
    for log in logs:
        assert "node 1 runs with other settings or inputs than node 0: params.lr differ" in log, log[-3000:]


def _ready(proc: subprocess.Popen) -> int:
    for line in proc.stdout:
        if line.startswith("READY "):
            return int(line.split()[1])
    raise AssertionError(f"exited before READY ({proc.wait()})")


def test_a_rank_killed_on_node_1_stops_node_0_and_rank_0_killed_stops_node_1(tmp_path) -> None:
    import psutil

    # node 1's rank killed: node 1 reports it through the store, rank 0 stops with the rank named
    with _nodes(tmp_path, "wait", "a") as procs:
        _, rank1 = _ready(procs[0]), _ready(procs[1])
        os.kill(rank1, signal.SIGKILL)
        logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [1, 1], logs
    line = f"error: rank 1 of 2 (node 1, pid {rank1}) was killed by SIGKILL"
    assert line in logs[0] and line in logs[1], logs
    raised = f"rank_watch.RankFailed: rank 1 of 2 (node 1, pid {rank1}) was killed by SIGKILL\n"
    assert raised in logs[0], logs[0][-3000:]  # the exception node 0's stage ended with

    # rank 0 (node 0's launcher) killed: node 1's store calls fail, it stops its rank
    with _nodes(tmp_path, "wait", "b") as procs:
        _, rank1 = _ready(procs[0]), _ready(procs[1])
        procs[0].kill()
        log1 = procs[1].communicate(timeout=300)[0]
        assert procs[1].returncode == 1 and "rank 0 is gone; stopping this node's ranks" in log1, log1[-3000:]
        assert not psutil.pid_exists(rank1) or psutil.Process(rank1).status() == psutil.STATUS_ZOMBIE


def test_agree_in_one_process_and_the_store_listens_on_its_address_only() -> None:
    import psutil

    nodes = Nodes(count=2, rank=0, master_addr="127.0.0.1", master_port=free_port(), timeout_s=20)
    store = host_store(nodes)
    listening = [
        c.laddr
        for c in psutil.Process().net_connections("inet")
        if c.status == "LISTEN" and c.laddr.port == nodes.master_port
    ]
    assert [a.ip for a in listening] == ["127.0.0.1"]
    other = Nodes(count=2, rank=1, master_addr="127.0.0.1", master_port=nodes.master_port, timeout_s=20)
    seen: dict = {}

    def node1() -> None:
        try:
            agree(join_store(other), other, {"a": 1, "b": {"c": 2}})
            seen["ok"] = True
        except NodeError as err:
            seen["err"] = str(err)

    t = threading.Thread(target=node1)
    t.start()
    agree(store, nodes, {"a": 1, "b": {"c": 2}})
    t.join()
    assert seen == {"ok": True}
    store.set("x", "1")
    assert join_store(other).get("x") == b"1"
    del store


def test_a_node_that_never_comes_is_named() -> None:
    nodes = Nodes(count=2, rank=0, master_addr="127.0.0.1", master_port=free_port(), timeout_s=1)
    with pytest.raises(
        NodeError, match="node 1 did not join within 1 s: start the same stage on it with STEPRL_NODE_RANK=1"
    ):
        agree(host_store(nodes), nodes, {})
    with pytest.raises(
        NodeError, match="node 1 could not reach node 0 at STEPRL_MASTER_ADDR:STEPRL_MASTER_PORT"
    ):
        join_store(Nodes(2, 1, "127.0.0.1", free_port(), timeout_s=1))


def test_differences_flatten_nested_keys() -> None:
    assert differences({"p": {"a": 1, "b": 2}, "c": 1}, {"p": {"a": 1, "b": 3}, "d": 1}) == ["c", "d", "p.b"]
    assert differences({"x": [1, 2]}, {"x": [1, 2]}) == []


@pytest.mark.parametrize(
    "env, error",
    [
        ({"STEPRL_NODES": "two"}, "STEPRL_NODES='two' is not an integer"),
        ({"STEPRL_NODES": "0"}, "STEPRL_NODES=0: the number of machines must be >= 1"),
        (
            {"STEPRL_NODE_RANK": "1"},
            r"STEPRL_NODE_RANK=1 but STEPRL_NODES is 1 \(unset\): set STEPRL_NODES too",
        ),
        (
            {"STEPRL_NODES": "2"},
            "STEPRL_NODES=2 needs STEPRL_NODE_RANK, STEPRL_MASTER_ADDR, STEPRL_MASTER_PORT",
        ),
        (
            {
                "STEPRL_NODES": "2",
                "STEPRL_NODE_RANK": "2",
                "STEPRL_MASTER_ADDR": "10.0.0.1",
                "STEPRL_MASTER_PORT": "29500",
            },
            r"STEPRL_NODE_RANK=2: must be 0 \.\. 1",
        ),
        (
            {
                "STEPRL_NODES": "2",
                "STEPRL_NODE_RANK": "1",
                "STEPRL_MASTER_ADDR": "10.0.0.1",
                "STEPRL_MASTER_PORT": "70000",
            },
            "STEPRL_MASTER_PORT=70000: not a TCP port",
        ),
    ],
)
def test_node_settings_are_checked(env, error) -> None:
    with pytest.raises(NodeError, match=error):
        Nodes.from_env(env)


def test_node_settings_and_the_world_split() -> None:
    env = {
        "STEPRL_NODES": "2",
        "STEPRL_NODE_RANK": "1",
        "STEPRL_MASTER_ADDR": "10.0.0.1",
        "STEPRL_MASTER_PORT": "29500",
    }
    nodes = Nodes.from_env(env)
    assert nodes == Nodes(count=2, rank=1, master_addr="10.0.0.1", master_port=29500, timeout_s=600.0)
    assert nodes.local_ranks(4) == range(2, 4) and nodes.address == "10.0.0.1:29500"
    with pytest.raises(
        NodeError, match="deepspeed.world_size=3 does not split evenly over STEPRL_NODES=2 machines"
    ):
        nodes.local_ranks(3)
    assert Nodes.from_env({}) == Nodes() and Nodes().local_ranks(2) == range(0, 2)


def test_node_0_refuses_an_address_that_is_not_its_own() -> None:
    nodes = Nodes(
        count=2, rank=0, master_addr="192.0.2.1", master_port=free_port(), timeout_s=1
    )  # TEST-NET-1
    with pytest.raises(
        NodeError, match="node 0 cannot listen on STEPRL_MASTER_ADDR:STEPRL_MASTER_PORT = 192.0.2.1"
    ):
        host_store(nodes)
