"""The reward-std filter and dynamic sampling on hand-made groups (components/train/group_filter.py)."""

from __future__ import annotations

import statistics

import pytest

from components.train.group_filter import GroupFilter, fill_batch, group_stats, select_groups


def rows_of(group: str, returns: list[float], steps: int = 2) -> list[dict]:
    """Step rows of one group: trajectory j earns returns[j], split evenly over ``steps`` steps."""
    return [
        {"group_id": group, "traj_id": f"{group}-{j}", "step": t, "reward": ret / steps}
        for j, ret in enumerate(returns)
        for t in range(steps)
    ]


# Hand-made batch: std of each group's returns (unbiased) written out.
BATCH = {
    "a": [1.0, 1.0, 1.0, 1.0],  # std 0 (all equal)
    "b": [0.0, 10.0, 0.0, 10.0],  # std 5.7735
    "c": [0.0, 0.0, 0.0, 10.0],  # std 5.0
    "d": [-1.0, -1.0, -1.0, -1.0],  # std 0 (all equal)
    "e": [0.0, 2.0, 0.0, 2.0],  # std 1.1547
    "f": [0.0, 10.0, 10.0, 10.0],  # std 5.0 (tie with c, sampled later)
}


def test_group_stats_sums_step_rewards_per_trajectory():
    stats = group_stats(rows_of("b", [0.0, 10.0, 0.0, 10.0], steps=3))
    assert [s.group_id for s in stats] == ["b"]
    assert stats[0].returns == pytest.approx((0.0, 10.0, 0.0, 10.0))
    assert stats[0].std == pytest.approx(statistics.stdev([0, 10, 0, 10]))  # 5.7735
    assert stats[0].informative


def test_std_filter_keeps_exactly_the_top_groups():
    stats = group_stats([r for g, ret in BATCH.items() for r in rows_of(g, ret)])
    # top 3 by std: b (5.77), then c and f (5.0 each; both fit). In sampling order.
    assert select_groups(stats, 3, top_std=True, drop_equal=False) == ["b", "c", "f"]
    # top 2: b, then the tie between c and f goes to the one sampled first (c)
    assert select_groups(stats, 2, top_std=True, drop_equal=False) == ["b", "c"]
    # top 5 must take one all-equal group: a (sampled before d)
    assert select_groups(stats, 5, top_std=True, drop_equal=False) == ["a", "b", "c", "e", "f"]
    # without the std rule: the first sampled, all-equal ones dropped when asked
    assert select_groups(stats, 3, top_std=False, drop_equal=False) == ["a", "b", "c"]
    assert select_groups(stats, 3, top_std=False, drop_equal=True) == ["b", "c", "e"]


def stream_player(returns_by_index):
    """A play(start, count) over a prompt stream whose group i has returns_by_index(i); records calls."""
    calls = []

    def play(start, count):
        calls.append((start, count))
        return [r for i in range(start, start + count) for r in rows_of(f"g{i}", returns_by_index(i))]

    return play, calls


def test_std_filter_samples_need_over_keep_and_keeps_need():
    # group i: returns [0, i] -> std grows with i, so the kept groups are the last `need`
    play, calls = stream_player(lambda i: [0.0, float(i)])
    rows, m = fill_batch(play, 4, GroupFilter(keep=0.25))
    assert calls == [(0, 16)]
    assert sorted({r["group_id"] for r in rows}) == ["g12", "g13", "g14", "g15"]
    assert m["filter/groups_sampled"] == 16 and m["filter/groups_kept"] == 4
    assert m["filter/kept_reward_std"] == pytest.approx(
        sum(statistics.stdev([0, i]) for i in range(12, 16)) / 4
    )
    assert m["filter/sampled_reward_std"] == pytest.approx(
        sum(statistics.stdev([0, i]) for i in range(16)) / 16
    )
    assert m["filter/equal_return_groups"] == pytest.approx(1 / 16)  # g0: [0, 0]


def test_no_filter_is_one_round_of_need_groups_all_kept():
    play, calls = stream_player(lambda i: [1.0, 1.0])
    rows, m = fill_batch(play, 5, GroupFilter())
    assert calls == [(0, 5)]
    assert len({r["group_id"] for r in rows}) == 5
    assert m["filter/batch_fill"] == 1.0 and m["filter/rounds"] == 1.0


def test_dynamic_sampling_refills_the_batch_with_informative_groups():
    # every third group is informative
    play, calls = stream_player(lambda i: [0.0, 1.0] if i % 3 == 0 else [1.0, 1.0])
    rows, m = fill_batch(play, 4, GroupFilter(dynamic=True, max_rounds=10))
    kept = sorted({r["group_id"] for r in rows}, key=lambda g: int(g[1:]))
    assert kept == ["g0", "g3", "g6", "g9"]  # the first four informative groups, nothing else
    assert m["filter/batch_fill"] == 1.0
    # round 1: 4 groups (2 informative, rate 1/2) -> round 2: ceil(2 / 0.5) = 4 more
    assert calls[0] == (0, 4) and calls[1] == (4, 4)
    assert m["filter/extra_trajectories"] == 2 * sum(c for _, c in calls[1:])
    assert all(s.informative for s in group_stats(rows))


@pytest.mark.parametrize("max_rounds", [1, 2, 3, 5])
def test_dynamic_sampling_never_exceeds_its_bound(max_rounds):
    # nothing is ever informative: it samples until the bound, then trains on what it found (nothing)
    rule = GroupFilter(keep=0.5, dynamic=True, max_rounds=max_rounds)
    play, calls = stream_player(lambda i: [2.0, 2.0, 2.0])
    rows, m = fill_batch(play, 8, rule)
    sampled = sum(c for _, c in calls)
    assert len(calls) == max_rounds
    assert sampled <= rule.bound(8) == max_rounds * 16
    assert [s for s, _ in calls] == [
        sum(c for _, c in calls[:i]) for i in range(len(calls))
    ]  # no prompt twice
    assert rows == [] and m["filter/batch_fill"] == 0.0


def test_dynamic_sampling_with_the_std_filter_keeps_the_top_informative():
    play, calls = stream_player(lambda i: [0.0, float(i % 5)])  # g0, g5, ... all-equal
    rows, metrics = fill_batch(play, 3, GroupFilter(keep=0.5, dynamic=True, max_rounds=2))
    assert calls == [(0, 6)]  # 6 sampled, 4 informative >= 3 needed: no second round
    assert metrics["filter/rounds"] == 1.0 and metrics["filter/extra_trajectories"] == 0.0
    assert sorted({r["group_id"] for r in rows}) == [
        "g2",
        "g3",
        "g4",
    ]  # std of [0, 4] > [0, 3] > [0, 2] > [0, 1]


@pytest.mark.parametrize("bad", [dict(keep=0.0), dict(keep=1.5), dict(max_rounds=0)])
def test_group_filter_rejects_bad_settings(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        GroupFilter(**bad)
