"""The train stage on 2 ranks survives a killed rank: it stops within seconds, leaves no process, and
a rerun resumes to the weights of a run that was never interrupted.

One workspace (the tiny config, deepspeed.world_size 2: rank 0, one follower, vLLM in its own
process) runs `train` for grpo-s0, three iterations, through `python -m flows.repro -- ...` (a
Prefect server outside the stage's process tree, as `make repro` runs stages):

1. the follower is killed with SIGKILL in iteration 1's update (its batch written, the follower
   busy, no checkpoint of the iteration yet): rank 0 prints the line naming rank 1 and exits;
2. the rerun resumes after iteration 0; rank 0 is killed with SIGKILL in iteration 2's rollout
   (iteration 1 done, vLLM generating, no rollouts of iteration 2 yet): the follower and vLLM's
   processes end;
3. the rerun resumes after iteration 1 and finishes. Its final weights match those of a copy of the
   workspace that ran `train` without a kill (test_data_parallel's tolerance).

After each kill every process of the stage's tree (recorded before the kill, psutil) must have ended.
The times from kill to exit are printed (pytest -s) for the record.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from safetensors.torch import load_file

from components.train.rank_watch import STOP_GRACE_S
from tests.flows.workspace import BIN, run, sft_workspace
from tests.train.train_helpers import assert_weights_match

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

ALGO, SEED, NAME = "grpo", 0, "grpo-s0"
LR = 1e-3
SETTINGS = {
    "deepspeed": {"world_size": 2},
    "train": {
        "iterations": 3,
        "trajectories_per_iteration": 16,
        "ppo_epochs": 4,  # an update long enough to be caught in
        "old_logprobs": "recompute",  # several steps per iteration: the old policy's own forward
        "mini_batch_size": 48,
        "micro_batch_size": 2,
        "val_samples": 4,
        "val_every": 10,
    },
    "algorithms": {"grpo": {"preset": "grpo", "samples_per_prompt": 2, "lr": LR}},
    "compare": {"algorithms": ["grpo"], "seeds": [0]},
}
TRAIN = [
    "python",
    "-m",
    "flows.repro",
    "--",
    "python",
    "-m",
    "flows.train",
    "--algo",
    ALGO,
    "--rl-seed",
    str(SEED),
]


def _env(ws: Path) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "DVC_", "STEPRL_"))
    }
    env.update(PATH=f"{BIN}{os.pathsep}{env['PATH']}", PYTHONPATH=str(ws))
    return env


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _stage(repro: subprocess.Popen, timeout: float = 900) -> psutil.Process:
    """The `flows.train` process (rank 0) under a running `flows.repro`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in psutil.Process(repro.pid).children():
            try:
                if "flows.train" in p.cmdline():
                    return p
            except psutil.NoSuchProcess:
                pass
        assert repro.poll() is None, "repro ended before the stage started"
        time.sleep(0.2)
    raise AssertionError("the train stage did not start")


def _wait_for(path: Path, repro: subprocess.Popen, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert repro.poll() is None, f"the stage ended before {path} appeared"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def _busy(p: psutil.Process, window: float = 0.3) -> bool:
    before = sum(p.cpu_times()[:2])
    time.sleep(window)
    return sum(p.cpu_times()[:2]) - before > 0.02


def _gone_after(tree: list[psutil.Process], t0: float, within: float) -> tuple[float, list[str]]:
    """Seconds from ``t0`` until every process of ``tree`` ended, and those still running after ``within``."""
    while True:
        alive = [p for p in tree if _running(p)]
        if not alive or time.monotonic() - t0 > within:
            return time.monotonic() - t0, [f"{p.pid} {p.name()}" for p in alive]
        time.sleep(0.05)


def _start(ws: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(TRAIN, cwd=ws, env=_env(ws), stdout=out, stderr=subprocess.STDOUT)


def _weights(ws: Path) -> dict:
    return load_file(ws / "models" / NAME / "final" / "model.safetensors")


def test_killed_ranks_stop_the_stage_leave_nothing_and_resume_to_the_same_weights(tmp_path):
    ws = sft_workspace(tmp_path / "a", SETTINGS)
    ref = tmp_path / "ref"
    shutil.copytree(ws, ref, ignore=shutil.ignore_patterns("mlflow", ".prefect"))
    runs = ws / "runs" / NAME

    # 1. the follower, mid-update of iteration 1
    repro = _start(ws, tmp_path / "run1.log")
    rank0 = _stage(repro)
    _wait_for(runs / "iter_0001" / "batch.parquet", repro)
    (follower,) = [p for p in rank0.children() if "spawn_main" in " ".join(p.cmdline())]
    while not _busy(follower, 0.1):
        assert repro.poll() is None
    tree = rank0.children(recursive=True)
    t0 = time.monotonic()
    follower.kill()
    rank0.wait(timeout=STOP_GRACE_S + 60)
    stopped = time.monotonic() - t0
    _, left = _gone_after(tree, t0, within=stopped + 30)
    repro.wait(timeout=120)
    log = (tmp_path / "run1.log").read_text()
    assert f"error: rank 1 of 2 (pid {follower.pid}) was killed by SIGKILL" in log, log[-4000:]
    # the stage ended with RankFailed naming the rank (flows._stage prints its message as the stage's
    # last line), not with WorldStopped's traceback
    assert f"error: rank 1 of 2 (pid {follower.pid}) was killed by SIGKILL\n" in log, log[-4000:]
    assert not (runs / "iter_0001" / "done.json").exists()
    assert not (runs / "iter_0001" / "checkpoint" / "actor" / "steprl_complete.json").exists(), (
        "killed after the update"
    )
    assert left == [], left
    print(f"\nfollower killed mid-update: rank 0 exited {stopped:.1f} s later")
    assert stopped < STOP_GRACE_S + 10

    # 2. rank 0, mid-rollout of iteration 2
    repro = _start(ws, tmp_path / "run2.log")
    rank0 = _stage(repro)
    _wait_for(runs / "iter_0001" / "done.json", repro)
    engine = None
    while engine is None:
        engine = next((p for p in rank0.children(recursive=True) if "EngineCore" in p.name()), None)
    worker = next(p for p in rank0.children(recursive=True) if "Worker" in p.name())
    while not _busy(worker, 0.1):
        assert repro.poll() is None
    tree = rank0.children(recursive=True)
    assert not (runs / "iter_0002" / "rollouts.parquet").exists()
    t0 = time.monotonic()
    rank0.kill()
    gone, left = _gone_after(tree, t0, within=60)
    repro.wait(timeout=120)
    assert not (runs / "iter_0002" / "rollouts.parquet").exists(), "killed after the rollout"
    assert "resuming after iteration 0" in (tmp_path / "run2.log").read_text()
    assert left == [], left
    print(f"rank 0 killed mid-rollout: its {len(tree)} processes ended within {gone:.1f} s")

    # 3. the rerun finishes where an uninterrupted run does
    out = run(TRAIN, ws, timeout=1800)
    assert "resuming after iteration 1" in out.stdout + out.stderr
    run(TRAIN, ref, timeout=1800)
    resumed, uninterrupted = _weights(ws), _weights(ref)
    diff = max(float((resumed[k] - uninterrupted[k]).abs().max()) for k in uninterrupted)
    print(f"resumed vs uninterrupted final weights: max abs diff {diff:.3g}")
    assert_weights_match(resumed, uninterrupted, lr=LR, steps=SETTINGS["train"]["iterations"] * 4)
