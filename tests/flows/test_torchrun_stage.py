"""The sft stage started by ``torchrun --standalone --nproc-per-node 2 -m flows.sft``: the weights of
world size 1, and torchrun's world checked against deepspeed.world_size.

A workspace (the tiny config, deepspeed.world_size 2) runs prepare and base_model, then sft under
torchrun: rank 0 runs the stage (Prefect flow, MLflow run, outputs), rank 1 its share of each step
(components.train.torchrun; steprl spawns no rank of its own). The checkpoint matches the one a copy
of the workspace gets with world size 1 (test_data_parallel's tolerance). In that copy, torchrun
with 2 ranks is refused before any work, naming both numbers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from tests.flows.workspace import BIN, make_workspace, run
from tests.train.train_helpers import assert_weights_match

pytestmark = pytest.mark.slow

TORCHRUN = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "flows.sft"]


def _torchrun(ws: Path) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "DVC_", "STEPRL_"))
    }
    env.update(PATH=f"{BIN}{os.pathsep}{env['PATH']}", PYTHONPATH=str(ws))
    return subprocess.run(TORCHRUN, cwd=ws, env=env, capture_output=True, text=True, timeout=1800)


def test_sft_under_torchrun_gives_the_weights_of_one_rank(tmp_path) -> None:
    ws = make_workspace(tmp_path / "two", {"deepspeed": {"world_size": 2}})
    for stage in ("prepare", "base_model"):
        run(["python", "-m", f"flows.{stage}"], ws)
    one = tmp_path / "one"
    shutil.copytree(ws, one)
    params = yaml.safe_load((one / "params.yaml").read_text())
    params["deepspeed"]["world_size"] = 1
    (one / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    two = _torchrun(ws)
    log = two.stdout + two.stderr
    assert two.returncode == 0, log[-6000:]
    assert log.count("sft: final loss") == 1, log[-6000:]  # rank 0 alone runs the flow
    run(["python", "-m", "flows.sft"], one)
    two_w, one_w = (load_file(w / "models" / "sft" / "model.safetensors") for w in (ws, one))
    s = params["sft"]
    diff = max(float((two_w[k] - one_w[k]).abs().max()) for k in one_w)
    print(
        f"\ntorchrun 2 ranks vs world size 1 after {s['steps']} SFT steps: max abs weight difference {diff:.3g}"
    )
    assert_weights_match(two_w, one_w, lr=s["lr"], steps=s["steps"])

    refused = _torchrun(one)  # deepspeed.world_size 1, torchrun's WORLD_SIZE 2
    log = refused.stdout + refused.stderr
    assert refused.returncode != 0, log[-4000:]
    assert "torchrun started WORLD_SIZE=2 ranks but deepspeed.world_size=1" in log, log[-4000:]
