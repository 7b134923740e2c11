"""The sft stage on two "machines" of one: the weights of world size 1, nothing listening beyond loopback.

Node 0 is a workspace that ran prepare and base_model (the tiny config, deepspeed.world_size 2); node 1
is a second directory holding only what a second machine would get: the code and params (a clone)
and the stage's inputs (data/processed, models/base: a `dvc pull`), no MLflow, no Prefect database,
no outputs. Both run `python -m flows.sft` with STEPRL_NODES=2, their node rank and node 0's store on
127.0.0.1 (a free port): one rank each. The checkpoint node 0 writes matches the one a third
directory gets with world size 1 (test_data_parallel's tolerance); node 1 writes no checkpoint;
every process of both listens on loopback only (polled while they run).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from components.train.distributed import free_port
from tests.flows.workspace import BIN, make_workspace, run, watch_listeners
from tests.train.train_helpers import assert_weights_match

pytestmark = pytest.mark.slow

SECOND_MACHINE = ("mlflow", ".prefect", ".git", "metrics", "plots", "models/sft")


def _node(ws: Path, rank: int, port: int) -> subprocess.Popen:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "DVC_", "STEPRL_"))
    }
    env.update(
        PATH=f"{BIN}{os.pathsep}{env['PATH']}",
        PYTHONPATH=str(ws),
        STEPRL_NODES="2",
        STEPRL_NODE_RANK=str(rank),
        STEPRL_MASTER_ADDR="127.0.0.1",
        STEPRL_MASTER_PORT=str(port),
    )
    return subprocess.Popen(
        ["python", "-m", "flows.sft"],
        cwd=ws,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _copy(src: Path, dst: Path, skip: tuple[str, ...]) -> Path:
    shutil.copytree(
        src,
        dst,
        ignore=lambda d, names: [n for n in names if (Path(d) / n).relative_to(src).as_posix() in skip],
    )
    return dst


def test_sft_on_two_nodes_gives_the_weights_of_one(tmp_path):
    ws0 = make_workspace(tmp_path / "node0", {"deepspeed": {"world_size": 2}})
    for stage in ("prepare", "base_model"):
        run(["python", "-m", f"flows.{stage}"], ws0)
    ws1 = _copy(ws0, tmp_path / "node1", SECOND_MACHINE)
    one = _copy(ws0, tmp_path / "one", ("mlflow", ".prefect", "metrics", "plots"))
    params = yaml.safe_load((one / "params.yaml").read_text())
    params["deepspeed"]["world_size"] = 1
    (one / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    port = free_port()
    with watch_listeners() as seen:
        procs = [_node(ws0, 0, port), _node(ws1, 1, port)]
        logs = [p.communicate(timeout=1800)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n\n".join(log[-4000:] for log in logs)
    assert "sft: 2 data-parallel ranks on 2 machine(s)" in logs[0]
    assert "node 1 of 2: joining node 0 at 127.0.0.1" in logs[1]
    assert not (ws1 / "models" / "sft").exists() and not (ws1 / "mlflow").exists()
    beyond = {(name, ip, port) for name, ip, port in seen["listening"] if ip not in ("127.0.0.1", "::1")}
    assert beyond == set(), beyond
    assert any(p == port for _, _, p in seen["listening"]), "node 0's store was not seen listening"

    run(["python", "-m", "flows.sft"], one)
    two_w, one_w = (load_file(w / "models" / "sft" / "model.safetensors") for w in (ws0, one))
    s = params["sft"]
    diff = max(float((two_w[k] - one_w[k]).abs().max()) for k in one_w)
    print(f"\ntwo nodes vs world size 1 after {s['steps']} SFT steps: max abs weight difference {diff:.3g}")
    assert_weights_match(two_w, one_w, lr=s["lr"], steps=s["steps"])
