"""init_distributed: a one-process gloo world on CPU, idempotent; launcher variables respected."""

from __future__ import annotations

import os

import pytest
import torch

from components.train.distributed import DistInfo, _fill_single_process_env, free_port, init_distributed


def test_single_process_world_and_idempotent() -> None:
    first = init_distributed()
    second = init_distributed()
    assert (
        first
        == second
        == DistInfo(rank=0, world_size=1, local_rank=0, backend="gloo", device=torch.device("cpu"))
    )
    assert first.is_main
    assert torch.distributed.is_initialized() and torch.distributed.get_world_size() == 1
    assert os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "1" and os.environ["LOCAL_RANK"] == "0"
    assert os.environ["MASTER_ADDR"] == "127.0.0.1" and os.environ["MASTER_PORT"].isdigit()
    assert os.environ["DS_ACCELERATOR"] == "cpu"
    # collectives work on the one-process world
    t = torch.tensor([3.0])
    torch.distributed.all_reduce(t)
    assert t.item() == 3.0


_LISTENERS = """
import json, os, psutil, torch
from components.train.distributed import init_distributed
init_distributed()
t = torch.ones(1)
torch.distributed.all_reduce(t)
print(json.dumps([c.laddr.ip for c in psutil.Process().net_connections("inet") if c.status == "LISTEN"]))
"""


def test_world_of_one_listens_on_loopback_only() -> None:
    # A fresh interpreter: this test process may already hold a process group.
    import json
    import subprocess
    import sys

    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    out = subprocess.run(
        [sys.executable, "-c", _LISTENERS], capture_output=True, text=True, env=env, check=True, timeout=300
    )
    ips = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(ip in ("127.0.0.1", "::1") for ip in ips), ips


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_env_fill_keeps_launcher_values(monkeypatch) -> None:
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("MASTER_PORT", "29555")
    _fill_single_process_env()
    assert os.environ["MASTER_PORT"] == "29555" and os.environ["WORLD_SIZE"] == "1"


def test_partial_launcher_env_is_an_error(monkeypatch) -> None:
    for v in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    missing = r"\['RANK', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'\]"
    with pytest.raises(RuntimeError, match=rf"WORLD_SIZE=2 is set but {missing}"):
        _fill_single_process_env()


def _listeners(rank: int, out: str) -> None:
    import json

    import psutil

    from components.train.distributed import init_distributed

    info = init_distributed()
    t = torch.ones(1)
    torch.distributed.all_reduce(t)
    ips = [c.laddr.ip for c in psutil.Process().net_connections("inet") if c.status == "LISTEN"]
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"world": info.world_size, "sum": t.item(), "ips": ips}, f)


def test_local_ranks_listen_on_loopback_only(tmp_path) -> None:
    import json

    from components.train.launch import run_local

    run_local(2, _listeners, (str(tmp_path / "rank"),))
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank.{rank}").read_text())
        assert seen["world"] == 2 and seen["sum"] == 2.0  # a real 2-process all-reduce
        assert seen["ips"] and all(ip in ("127.0.0.1", "::1") for ip in seen["ips"]), seen["ips"]


def test_share_threads_divides_this_process_threads_among_ranks(monkeypatch) -> None:
    from components.train import launch

    # A stand-in thread count: once an in-process vLLM CPU worker has bound this process's threads
    # (an earlier test), torch.set_num_threads no longer takes effect, so the real count can't be set.
    threads = {"n": 4}
    monkeypatch.setattr(launch.torch, "get_num_threads", lambda: threads["n"])
    monkeypatch.setattr(launch.torch, "set_num_threads", lambda n: threads.update(n=n))
    assert launch.share_threads(1) == 4 and threads["n"] == 4  # a world of one keeps them all
    assert launch.share_threads(3) == 1 and threads["n"] == 1  # 4 // 3, this rank's share
    threads["n"] = 2
    assert launch.share_threads(8) == 1  # never below one thread
    with pytest.raises(ValueError, match="world_size=0"):
        launch.share_threads(0)


def _engine_after_a_new_world(rank: int, out: str) -> None:
    from train_helpers import RL_ENGINE_KW, tiny_model

    from components.train.distributed import init_distributed
    from components.train.engine import build_engine

    init_distributed()
    build_engine(
        tiny_model(), dtype="fp32", micro_batch_size=2, **RL_ENGINE_KW
    )  # DeepSpeed clones this world's group
    torch.distributed.destroy_process_group()  # as an in-process vLLM engine's close() does
    init_distributed()  # a new world
    engine = build_engine(tiny_model(), dtype="fp32", micro_batch_size=2, **RL_ENGINE_KW)
    with open(out, "w") as f:
        f.write(str(engine.dp_world_size))


def test_an_engine_builds_in_a_new_world_after_the_old_one_is_destroyed(tmp_path) -> None:
    """DeepSpeed's cached clone of a destroyed world's group is not used in the next world."""
    from components.train.launch import run_local

    out = tmp_path / "dp"
    run_local(1, _engine_after_a_new_world, (str(out),))
    assert out.read_text() == "1"
