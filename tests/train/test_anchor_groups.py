"""GiGPO's anchor-state step groups from step rows (components.train.advantage): who is grouped with
whom, the counts the update logs (gigpo/*), and the advantages compute_advantages gives, by hand."""

from __future__ import annotations

import statistics

import pytest

from components.train.advantage import anchor_group_stats, compute_advantages, step_group_keys

# (traj, group, step, obs_key, reward); obs_key None = the row has no obs_key column at all
ROWS = [
    ("a", "g1", 0, "s0", 0.0),  # 0  a: s0 -> s1 -> s0 (a revisit) -> s2
    ("a", "g1", 1, "s1", 0.0),  # 1
    ("a", "g1", 2, "s0", 0.0),  # 2
    ("a", "g1", 3, "s2", 1.0),  # 3
    ("b", "g1", 0, "s0", 0.0),  # 4  b: s0 -> s2 (s2 at step 1 here, at step 3 in a)
    ("b", "g1", 1, "s2", 0.5),  # 5
    ("c", "g2", 0, "s2", 0.0),  # 6  c: another prompt group passing through a state named s2 too
    ("c", "g2", 1, "s9", 1.0),  # 7
    ("d", "g3", 0, "", 0.0),  # 8  d, e: an environment without state keys ("" or no column)
    ("d", "g3", 1, "", 1.0),  # 9
    ("e", "g3", 0, None, 0.25),  # 10
]
# the step groups by hand: row indices
GROUPS = [[0, 2, 4], [1], [3, 5], [6], [7], [8, 10], [9]]


def rows() -> list[dict]:
    out = []
    for traj, group, step, key, reward in ROWS:
        r = {"traj_id": traj, "group_id": group, "step": step, "reward": reward, "response_ids": [7, 8, 9]}
        if key is not None:
            r["obs_key"] = key
        out.append(r)
    return out


def test_step_groups_share_prompt_group_and_state_key_or_fall_back_to_the_step():
    keys = step_group_keys(rows())
    found = {}
    for i, k in enumerate(keys):
        found.setdefault(k, []).append(i)
    assert sorted(found.values()) == sorted(GROUPS)
    assert keys[3] != keys[6]  # s2 of g1 and s2 of g2: different prompt groups, never one group


def test_anchor_group_counts():
    # groups with >= 2 steps: {0, 2, 4}, {3, 5}, {8, 10}
    assert anchor_group_stats(rows()) == {
        "anchor_groups": 3.0,
        "anchor_group_size": 7 / 3,
        "anchored_step_frac": 7 / 11,
    }
    alone = [r for r in rows() if r["traj_id"] == "c"]
    assert anchor_group_stats(alone) == {
        "anchor_groups": 0.0,
        "anchor_group_size": 0.0,
        "anchored_step_frac": 0.0,
    }
    assert anchor_group_stats([])["anchored_step_frac"] == 0.0


@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_gigpo_advantages_by_hand(gamma):
    out = compute_advantages(rows(), estimator="gigpo", gamma=gamma, lam=1.0)
    # discounted step return G_t = r_t + gamma G_{t+1} within each trajectory
    G = [0.0] * len(ROWS)
    for i in reversed(range(len(ROWS))):
        nxt = i + 1 < len(ROWS) and ROWS[i + 1][0] == ROWS[i][0]
        G[i] = ROWS[i][4] + (gamma * G[i + 1] if nxt else 0.0)
    # episode term: grpo over the trajectories of each prompt group (singleton group: mean 0, std 1)
    S = {t: sum(r[4] for r in ROWS if r[0] == t) for t in "abcde"}
    groups = {"g1": ["a", "b"], "g2": ["c"], "g3": ["d", "e"]}

    def norm(x, xs):
        if len(xs) == 1:
            return x  # mean 0, std 1
        return (x - statistics.mean(xs)) / (statistics.stdev(xs) + 1e-6)

    want = [0.0] * len(ROWS)
    for members in GROUPS:
        for i in members:
            traj, group = ROWS[i][0], ROWS[i][1]
            a_episode = norm(S[traj], [S[t] for t in groups[group]])
            want[i] = a_episode + norm(G[i], [G[j] for j in members])
    for i, r in enumerate(out):
        assert r["advantages"] == pytest.approx([want[i]] * 3, abs=1e-5), i
        assert r["returns"] == pytest.approx([G[i]] * 3, abs=1e-6), i
    # negative control: grouping s2 across prompt groups (rows 3, 5 and 6) would change row 6
    wrong = norm(S["c"], [S["c"]]) + norm(G[6], [G[3], G[5], G[6]])
    assert abs(out[6]["advantages"][0] - wrong) > 1e-2
