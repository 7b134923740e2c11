"""benchmarks/step_gae_check.py's hand computation on a hand-made batch: it agrees with the step_gae
estimator the train stage runs (components.train.advantage), with a hand-worked value, and it sees a
stored advantage that is off."""

from __future__ import annotations

import pytest

from benchmarks.step_gae_check import max_differences, step_gae_by_hand
from components.train.advantage import compute_advantages


def batch() -> list[dict]:
    """Two trajectories (3 and 2 steps, rows out of order), one value per step, 2-4 tokens per step."""
    spec = [("a", 1, -0.1, 0.5, 3), ("a", 0, -0.1, 0.2, 2), ("b", 0, 1.0, 0.4, 4), ("a", 2, 10.9, 0.9, 2),
            ("b", 1, -1.0, -0.3, 3)]  # fmt: skip
    return [
        {"traj_id": t, "group_id": t, "step": s, "reward": r, "values": [v], "response_ids": list(range(n)),
         "obs_key": ""}
        for t, s, r, v, n in spec
    ]  # fmt: skip


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.8)])
def test_the_hand_computation_matches_the_estimator(gamma, lam):
    rows = compute_advantages(batch(), estimator="step_gae", gamma=gamma, lam=lam)
    d = max_differences(rows, gamma, lam)
    assert d["rows"] == 5 and d["advantages"] < 1e-5 and d["returns"] < 1e-5


def test_a_hand_worked_return_and_an_off_advantage():
    # trajectory b at gamma = lam = 1: A_1 = -1 - (-0.3) = -0.7, A_0 = 1 + (-0.3) - 0.4 + (-0.7) = -0.4
    rows = batch()
    hand = step_gae_by_hand(rows, 1.0, 1.0)
    assert hand[2][1] == pytest.approx(-0.4 + 0.4) and hand[4][1] == pytest.approx(-0.7 - 0.3)
    stored = compute_advantages(rows, estimator="step_gae", gamma=1.0, lam=1.0)
    stored[1]["advantages"] = [stored[1]["advantages"][0] + 0.5] * 2
    assert max_differences(stored, 1.0, 1.0)["advantages"] == pytest.approx(0.5, abs=1e-5)
    with pytest.raises(ValueError, match="token_rewards"):
        step_gae_by_hand([{**rows[0], "token_rewards": [0.0]}], 1.0, 1.0)
