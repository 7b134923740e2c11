"""flows._nodes under torchrun: its WORLD_SIZE against deepspeed.world_size, STEPRL_NODES refused,
the settings summary made only when torchrun's ranks span machines, rank 0 runs the stage."""

from __future__ import annotations

import pytest

from components.config import load_params
from flows import REPO
from flows._nodes import stage_nodes, summary, torchrun_follower
from flows._stage import StageError

TORCHRUN = {"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}


def _params(world_size: int):
    return load_params(REPO / "params.yaml", {"deepspeed.world_size": world_size})


@pytest.fixture
def torchrun_env(monkeypatch):
    for k in ("STEPRL_NODES", "STEPRL_NODE_RANK", "STEPRL_MASTER_ADDR", "STEPRL_MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in TORCHRUN.items():
        monkeypatch.setenv(k, v)
    return monkeypatch


def test_torchrun_s_world_size_must_be_deepspeed_world_size(torchrun_env) -> None:
    assert stage_nodes(_params(2)).count == 1
    with pytest.raises(StageError, match="torchrun started WORLD_SIZE=2 ranks but deepspeed.world_size=1"):
        stage_nodes(_params(1))


def test_steprl_nodes_under_torchrun_is_refused(torchrun_env) -> None:
    for k, v in {"STEPRL_NODES": "2", "STEPRL_NODE_RANK": "0", "STEPRL_MASTER_ADDR": "127.0.0.1"}.items():
        torchrun_env.setenv(k, v)
    torchrun_env.setenv("STEPRL_MASTER_PORT", "29500")
    with pytest.raises(StageError, match="STEPRL_NODES=2 under torchrun: torchrun places the ranks"):
        stage_nodes(_params(2))


def test_rank_0_runs_the_stage_and_the_summary_is_made_across_machines(torchrun_env, tmp_path) -> None:
    p, nodes = _params(2), stage_nodes(_params(2))
    assert torchrun_follower().rank == 1
    torchrun_env.setenv("RANK", "0")
    assert torchrun_follower() is None
    base = tmp_path / "base"
    base.write_text("weights")
    assert summary(nodes, "sft", p, {"models/base": base}) == {}  # one machine: nothing to compare
    torchrun_env.setenv("LOCAL_WORLD_SIZE", "1")  # two agents, one rank each
    made = summary(nodes, "sft", p, {"models/base": base})
    assert (
        made["stage"] == "sft" and set(made["inputs"]) == {"models/base"} and made["params"]["seed"] == p.seed
    )
    torchrun_env.delenv("TORCHELASTIC_RUN_ID")
    assert torchrun_follower() is None
