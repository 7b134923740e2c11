"""components.train.partial by hand: the batch is the first complete groups in the order they were
started, a group is never split, everything else is carried whole."""

from __future__ import annotations

import pytest

from components.train.partial import complete_groups, ended_episodes, problem_id, take_batch


def _steps(group: str, traj: str, turns: int, done: bool) -> list[dict]:
    return [
        {"group_id": group, "traj_id": traj, "step": t, "done": done and t == turns - 1} for t in range(turns)
    ]


def test_the_batch_is_the_first_complete_groups_and_the_rest_is_carried_whole():
    rows = (
        _steps("0-a", "0-a-0", 3, True)  # carried group a: complete now
        + _steps("0-a", "0-a-1", 1, True)
        + _steps("0-b", "0-b-0", 2, False)  # group b: one episode still running
        + _steps("0-b", "0-b-1", 2, True)
        + _steps("1-c", "1-c-0", 1, True)  # this iteration's c and d: complete
        + _steps("1-c", "1-c-1", 1, True)
        + _steps("1-d", "1-d-0", 1, True)
        + _steps("1-d", "1-d-1", 2, True)
    )
    batch, carried = take_batch(rows, need=2)

    assert [r["traj_id"] for r in batch] == ["0-a-0"] * 3 + ["0-a-1", "1-c-0", "1-c-1"]
    assert {r["group_id"] for r in carried} == {"0-b", "1-d"}
    assert len(batch) + len(carried) == len(rows)  # nothing lost, nothing twice
    assert [r["traj_id"] for r in carried] == ["0-b-0"] * 2 + ["0-b-1"] * 2 + ["1-d-0"] + ["1-d-1"] * 2


def test_fewer_complete_groups_than_needed_gives_a_smaller_batch():
    rows = _steps("0-a", "0-a-0", 1, True) + _steps("0-b", "0-b-0", 1, False)
    batch, carried = take_batch(rows, need=3)
    assert [r["group_id"] for r in batch] == ["0-a"]
    assert [r["group_id"] for r in carried] == ["0-b"]


def test_complete_groups_in_first_seen_order():
    rows = (
        _steps("1-z", "1-z-0", 1, True) + _steps("1-y", "1-y-0", 2, False) + _steps("0-x", "0-x-0", 1, True)
    )
    ended = ended_episodes(rows)
    assert ended == {"1-z-0": True, "1-y-0": False, "0-x-0": True}
    assert complete_groups(ended, {r["traj_id"]: r["group_id"] for r in rows}) == ["1-z", "0-x"]


def test_problem_id_of_a_group():
    assert problem_id("12-calc-0042") == "calc-0042"
    with pytest.raises(ValueError, match="'<iteration>-<problem id>'"):
        problem_id("calc")
    with pytest.raises(ValueError, match="need=0"):
        take_batch([], need=0)
