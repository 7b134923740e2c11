"""flows/critic_warmup.py's split of the warm-up episodes: train / selection / report, whole
trajectories, none empty."""

from __future__ import annotations

import pytest

from flows.critic_warmup import split_trajectories


def rows(n: int) -> list[dict]:
    return [{"traj_id": f"t{t}", "step": s} for t in range(n) for s in range(2)]


def test_three_disjoint_splits_of_whole_trajectories():
    train, select, report = split_trajectories(rows(10), held_out=0.2, seed=0)
    ids = [{r["traj_id"] for r in part} for part in (train, select, report)]
    assert [len(i) for i in ids] == [8, 1, 1]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    assert len(train) + len(select) + len(report) == 20  # every step row, trajectories kept whole


@pytest.mark.parametrize(("n", "held_out"), [(1, 0.2), (3, 0.2), (4, 0.99)])
def test_an_empty_split_names_the_keys(n, held_out):
    with pytest.raises(ValueError, match=r"critic_warmup\.episodes.*critic_warmup\.held_out"):
        split_trajectories(rows(n), held_out=held_out, seed=0)
