"""flows._nodes: torchrun's WORLD_SIZE against deepspeed.world_size, the variables of the removed
several-machine launcher refused, the settings summary made only when torchrun's ranks span
machines, rank 0 runs the stage."""

from __future__ import annotations

import pytest

from components.config import load_params
from flows import REPO
from flows._nodes import GONE_VARS, check_world, machines, summary, torchrun_follower
from flows._stage import StageError

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "x",
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_WORLD_SIZE": "1",
}


def _params(world_size: int):
    return load_params(REPO / "params.yaml", {"deepspeed.world_size": world_size})


@pytest.fixture
def no_launcher(monkeypatch):
    for k in (*GONE_VARS, *TORCHRUN):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


@pytest.fixture
def torchrun_env(no_launcher):
    for k, v in TORCHRUN.items():
        no_launcher.setenv(k, v)
    return no_launcher


def test_torchrun_s_world_size_must_be_deepspeed_world_size(torchrun_env) -> None:
    assert check_world(_params(2)).world_size == 2 and machines() == 1
    with pytest.raises(StageError, match="torchrun started WORLD_SIZE=2 ranks but deepspeed.world_size=1"):
        check_world(_params(1))


def test_without_a_launcher_the_world_is_this_machine(no_launcher) -> None:
    assert check_world(_params(2)) is None and machines() == 1 and torchrun_follower() is None


@pytest.mark.parametrize("under_torchrun", [False, True])
def test_the_removed_launcher_s_variables_are_refused_naming_them(no_launcher, under_torchrun) -> None:
    if under_torchrun:
        for k, v in TORCHRUN.items():
            no_launcher.setenv(k, v)
    no_launcher.setenv("STEPRL_NODES", "2")
    no_launcher.setenv("STEPRL_MASTER_PORT", "29500")
    with pytest.raises(
        StageError,
        match="STEPRL_NODES, STEPRL_MASTER_PORT set: .* start the stage on every machine with torchrun",
    ):
        check_world(_params(2))
    no_launcher.setenv("STEPRL_NODES", " ")  # blank is unset
    no_launcher.delenv("STEPRL_MASTER_PORT")
    check_world(_params(2))


def test_rank_0_runs_the_stage_and_the_summary_is_made_across_machines(torchrun_env, tmp_path) -> None:
    p = _params(2)
    assert torchrun_follower().rank == 1
    torchrun_env.setenv("RANK", "0")
    assert torchrun_follower() is None
    base = tmp_path / "base"
    base.write_text("weights")
    assert summary("sft", p, {"models/base": base}) == {}  # one machine: nothing to compare
    torchrun_env.setenv("LOCAL_WORLD_SIZE", "1")  # two agents, one rank each
    torchrun_env.setenv("GROUP_WORLD_SIZE", "2")
    assert machines() == 2
    made = summary("sft", p, {"models/base": base})
    assert (
        made["stage"] == "sft" and set(made["inputs"]) == {"models/base"} and made["params"]["seed"] == p.seed
    )
    torchrun_env.delenv("TORCHELASTIC_RUN_ID")
    assert torchrun_follower() is None


def test_machines_with_other_process_counts_all_make_the_summary(torchrun_env, tmp_path) -> None:
    # Three ranks on two machines: rank 0 alone on node 0, ranks 1 and 2 on node 1. Every rank must
    # make the summary (and so gather it), whatever its own machine's LOCAL_WORLD_SIZE.
    base = tmp_path / "base"
    base.write_text("weights")
    torchrun_env.setenv("WORLD_SIZE", "3")
    torchrun_env.setenv("GROUP_WORLD_SIZE", "2")
    made = []
    for rank, local_world in ((0, 1), (1, 2), (2, 2)):
        torchrun_env.setenv("RANK", str(rank))
        torchrun_env.setenv("LOCAL_WORLD_SIZE", str(local_world))
        made.append((machines(), summary("sft", _params(3), {"models/base": base})))
    assert [m for m, _ in made] == [2, 2, 2]
    assert all(s == made[0][1] and s["stage"] == "sft" for _, s in made)
