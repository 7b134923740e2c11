"""Collapse diagnostics computed by hand on a small batch (components/train/collapse.py)."""

from __future__ import annotations

import math
import statistics

import pytest

from components.train.collapse import collapse_metrics, read_trend, trend


def step(group, traj, t, reward, response, logprobs, obs=""):
    return {
        "group_id": group,
        "traj_id": traj,
        "step": t,
        "reward": reward,
        "response_ids": response,
        "response_logprobs": logprobs,
        "obs_key": obs,
    }


# Two groups. g1: trajectories a (return 1.0) and b (return 3.0); g2: one trajectory c (return -1.0).
ROWS = [
    step("g1", "a", 0, 0.5, [7, 8], [-0.5, -0.1], obs="s0"),
    step("g1", "a", 1, 0.5, [7, 9], [-1.0, -0.2], obs="s1"),
    step("g1", "b", 0, 3.0, [7, 8], [-0.4, -0.3], obs="s0"),  # same state, same action as a's step 0
    step("g1", "b", 1, 0.0, [6], [-2.0], obs="s0"),  # back in s0, another action
    step("g2", "c", 0, -1.0, [7, 8], [-0.1, -0.1], obs="s0"),  # s0 of another group: another anchor
]


def test_collapse_metrics_by_hand():
    m = collapse_metrics(ROWS)
    # in-group std: only g1 has >= 2 trajectories: stdev([1.0, 3.0]) = 1.41421
    assert m["collapse/group_reward_std"] == pytest.approx(math.sqrt(2))
    # batch std over the three returns 1, 3, -1: stdev = 2
    assert m["collapse/reward_std"] == pytest.approx(statistics.stdev([1.0, 3.0, -1.0]))
    # entropy: minus the mean over the 9 sampled tokens' log-probs: (0.5+0.1+1+0.2+0.4+0.3+2+0.1+0.1)/9
    assert m["collapse/entropy"] == pytest.approx(4.7 / 9)
    # anchors visited >= 2 times: (g1, s0) three times with responses {[7,8], [6]} -> 2 distinct.
    # (g1, s1) and (g2, s0) once each: not counted.
    assert m["collapse/anchor_states"] == 1.0
    assert m["collapse/distinct_actions"] == pytest.approx(2.0)


def test_without_groups_or_state_keys():
    rows = [step(f"g{i}", f"t{i}", 0, float(i), [i], [-1.0]) for i in range(3)]
    m = collapse_metrics(rows)
    assert "collapse/group_reward_std" not in m  # every group has one trajectory
    assert "collapse/distinct_actions" not in m and m["collapse/anchor_states"] == 0.0
    assert m["collapse/reward_std"] == pytest.approx(1.0)


def test_trend_windows():
    t = trend([4.0, 2.0, 9.0, 9.0, 1.0, 1.0, 0.0, 0.0])  # window 2: (4+2)/2 -> (0+0)/2
    assert (t.first, t.last) == (3.0, 0.0) and t.fell
    assert not trend([1.0, 0.6]).fell  # 0.6 > half of 1.0
    assert trend([1.0]) is None


def test_read_trend_tells_collapse_from_convergence():
    falling = {
        "group_reward_std": [4, 4, 1, 1],
        "entropy": [0.2, 0.2, 0.05, 0.05],
        "success": [0.6, 0.6, 0.3, 0.3],
    }
    assert read_trend(falling).startswith(
        "collapsing: group reward std fell 4 -> 1, entropy fell 0.2 -> 0.05"
    )
    converging = {**falling, "success": [0.6, 0.6, 0.9, 0.9]}
    assert read_trend(converging).endswith("converging rather than collapsing")
    assert "while training success rose 0.6 -> 0.9" in read_trend(converging)
    flat = {**falling, "success": [0.6, 0.6, 0.6, 0.6]}
    assert read_trend(flat).endswith(
        "entropy fell 0.2 -> 0.05 while training success held at 0.6: converging rather than collapsing"
    )
    steady = {
        "reward_std": [4, 4, 3.5, 3.5],
        "entropy": [0.2, 0.2, 0.19, 0.19],
        "success": [0.5, 0.5, 0.6, 0.6],
    }
    assert read_trend(steady).startswith("no sign of collapse (reward std 4 -> 3.5, entropy 0.2 -> 0.19")
    one = {"reward_std": [4.0], "entropy": [0.2], "success": [0.5]}
    assert read_trend(one) == "too few iterations to read (at least 2)"
