"""The train stage at ``rollout.partial: true`` on vLLM from a fresh workspace (prepare, base_model,
sft, then three GRPO iterations with ``correction: tis``): each iteration's batch is whole groups
whose episodes have all ended, every step row keeps the policy version that generated it, no episode
is trained twice or lost between iterations, episodes carried mid-episode go on under the next
weights, and a run killed in iteration 1 resumes (the next
rollout goes on from the in-flight table alone) to the same final weights as the uninterrupted run."""

from __future__ import annotations

import json
import shutil

import polars as pl
import pytest
import torch
from safetensors.torch import load_file

from tests.flows.workspace import kill_when_written, one_grpo_run, run, sft_workspace

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

NAME, ITERATIONS, GROUPS, SAMPLES = "grpo-s0", 3, 4, 2
TRAIN = ["python", "-m", "flows.train", "--algo", "grpo", "--rl-seed", "0"]


def _prepared(root):
    return sft_workspace(root, one_grpo_run(ITERATIONS, {"partial": True}, "tis"))


def _table(ws, k, name):
    return pl.read_parquet(ws / "runs" / NAME / f"iter_{k:04d}" / name)


def test_partial_rollouts_train_whole_groups_lose_nothing_and_resume_exactly(tmp_path):
    ws = _prepared(tmp_path / "a")
    killed = tmp_path / "b"
    shutil.copytree(ws, killed, symlinks=True)

    run(TRAIN, ws, timeout=1200)
    trained: list[str] = []
    carried: set[str] = set()
    for k in range(ITERATIONS):
        m = json.loads((ws / "runs" / NAME / f"iter_{k:04d}" / "metrics.json").read_text())
        batch, inflight = _table(ws, k, "rollouts.parquet"), _table(ws, k, "inflight.parquet")
        ends = batch.group_by("traj_id").agg(pl.col("done").last(), pl.col("group_id").first())
        assert ends["done"].all(), k  # only ended episodes are trained
        sizes = ends.group_by("group_id").len()["len"].to_list()
        assert len(sizes) == GROUPS and set(sizes) == {SAMPLES}, k  # whole groups, the batch's size
        versions = batch["policy_version"].to_list()
        assert max(versions) <= k and m["rollout/staleness_max"] == k - min(versions)
        assert m["partial/carried_in_episodes"] == len(carried), k
        new = set(ends["traj_id"].to_list())
        assert not new & set(trained), k  # no episode is trained twice
        # what was in flight is trained now or still in flight: nothing is lost
        assert carried <= new | set(inflight["traj_id"].to_list()), k
        trained += sorted(new)
        carried = set(inflight["traj_id"].to_list())
    metrics = [
        json.loads((ws / "runs" / NAME / f"iter_{k:04d}" / "metrics.json").read_text()) for k in range(3)
    ]
    # the pool (1.5 x 4 groups) leaves the slowest groups in flight, some of them mid-episode, which
    # the next rollout replays from the table and plays on
    assert all(m["partial/carried_out_episodes"] > 0 for m in metrics)
    assert all(m["partial/replay_departures"] == 0 for m in metrics)
    unfinished = [
        _table(ws, k, "inflight.parquet").group_by("traj_id").agg(pl.col("done").last())["done"].not_().sum()
        for k in range(ITERATIONS - 1)
    ]
    assert sum(unfinished) > 0, "no episode was carried mid-episode"
    assert max(m["rollout/staleness_max"] for m in metrics) >= 1  # a carried step trained a version later

    target = killed / "runs" / NAME / "iter_0001" / "batch.parquet"
    assert kill_when_written(TRAIN, killed, target), "train never reached update 1"
    out = run(TRAIN, killed, timeout=1200)
    assert f"{NAME}: resuming after iteration 0" in out.stdout + out.stderr

    a = load_file(ws / "models" / NAME / "final" / "model.safetensors")
    b = load_file(killed / "models" / NAME / "final" / "model.safetensors")
    sft = load_file(ws / "models" / "sft" / "model.safetensors")
    assert any(not torch.equal(a[k], sft[k]) for k in a), "the updates did not move the weights"
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run ends with other weights"
    for k in range(ITERATIONS):
        for name in ("rollouts.parquet", "inflight.parquet"):
            ra, rb = (_table(w, k, name).sort("traj_id", "step") for w in (ws, killed))
            assert ra["response_ids"].to_list() == rb["response_ids"].to_list(), (k, name)
