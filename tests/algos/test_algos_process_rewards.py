"""Process rewards normalised apart from the outcome (docs/algorithms.md, "Process rewards"): the
normalisation and both ways it joins an advantage against numbers derived by hand, weight 0 equal to
outcome-only bit for bit for every estimator, and compute_advantages reading the step column."""

from __future__ import annotations

import math

import pytest
import torch

from components.algos.advantages import ADVANTAGE_ESTIMATORS, get_advantage_estimator
from components.algos.process_rewards import normalize_process_rewards
from components.train.advantage import compute_advantages

S3 = math.sqrt(3.0)
TOL = dict(atol=1e-5, rtol=0)  # the 1e-6 of the std eps

# row: traj, step, group, outcome reward r, process reward p (None = the step is not scored)
ROWS = [
    (0, 0, 0, 0.0, 1.0),  # τ0 searches and finds what it needs
    (0, 1, 0, 0.0, 0.0),  # τ0 a useless call
    (0, 2, 0, 1.0, None),  # τ0 answers, right
    (1, 0, 0, 0.0, 1.0),  # τ1 searches and finds
    (1, 1, 0, 0.0, None),  # τ1 answers, wrong
    (2, 0, 1, 0.0, 0.0),  # τ2 (another prompt) a useless call; cut there
]


def inputs(rows, L: int = 2) -> dict:
    return dict(
        rewards=torch.tensor([r[3] for r in rows], dtype=torch.float64),
        response_mask=torch.ones(len(rows), L, dtype=torch.float64),
        traj_index=torch.tensor([r[0] for r in rows]),
        step_index=torch.tensor([r[1] for r in rows]),
        group_index=torch.tensor([r[2] for r in rows]),
        process_rewards=torch.tensor([0.0 if r[4] is None else r[4] for r in rows], dtype=torch.float64),
        process_mask=torch.tensor([r[4] is not None for r in rows]),
    )


def test_normalisation_by_hand():
    """Group 0's scored steps are p = 1, 0, 1: mean 2/3, unbiased std sqrt(((1/3)^2 + (2/3)^2 +
    (1/3)^2) / 2) = 1/sqrt(3), so p̂ = (1/3) sqrt(3) = 1/sqrt(3) and (-2/3) sqrt(3) = -2/sqrt(3);
    group 1's one scored step keeps p̂ = p = 0 (singleton rule); unscored steps 0. Over the whole
    batch the scored steps are 1, 0, 1, 0: mean 1/2, std sqrt(4 (1/4) / 3) = 1/sqrt(3), p̂ = ±sqrt(3)/2."""
    x = inputs(ROWS)
    by_group = normalize_process_rewards(
        rewards=x["process_rewards"], scored=x["process_mask"], group=x["group_index"]
    )
    torch.testing.assert_close(
        by_group, torch.tensor([1 / S3, -2 / S3, 0, 1 / S3, 0, 0], dtype=torch.float64), **TOL
    )
    whole = normalize_process_rewards(
        rewards=x["process_rewards"], scored=x["process_mask"], group=torch.zeros(6, dtype=torch.long)
    )
    h = S3 / 2
    torch.testing.assert_close(whole, torch.tensor([h, -h, 0, h, 0, -h], dtype=torch.float64), **TOL)
    equal = normalize_process_rewards(
        rewards=torch.tensor([1.0, 1.0, 1.0]),
        scored=torch.tensor([True, True, False]),
        group=torch.zeros(3, dtype=torch.long),
    )
    assert equal.tolist() == [0.0, 0.0, 0.0]  # no spread, no signal


def test_group_estimator_adds_the_process_return_by_hand():
    """grpo, w = 0.5, gamma 1. Outcome: group 0 scores S = 1, 0 -> A = ±1/sqrt(2); τ2 alone: A = S = 0.
    Process return-to-go of p̂ (group-normalised): τ0: 1/sqrt(3) - 2/sqrt(3) = -1/sqrt(3), then
    -2/sqrt(3), then 0; τ1: 1/sqrt(3), 0; τ2: 0."""
    out = get_advantage_estimator("grpo")(**inputs(ROWS), process_weight=0.5)
    a = 1 / math.sqrt(2)
    want = [a - 0.5 / S3, a - 1 / S3, a, -a + 0.5 / S3, -a, 0.0]
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor(want, dtype=torch.float64), **TOL)
    torch.testing.assert_close(out.advantages[:, 1], out.advantages[:, 0])  # every token of the step
    assert out.returns[:, 0].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]  # S_tau, outcome only


def test_critic_estimator_takes_it_in_the_step_reward_by_hand():
    """step_gae, V = 0, gamma = lam = 1, no whitening, w = 0.5: r' = r + 0.5 p̂ with p̂ normalised over
    the batch (±sqrt(3)/2, so 0.5 p̂ = ±sqrt(3)/4 = ±q): r' = q, -q, 1 | q, 0 | -q, and A_t is the
    return-to-go of r': τ0: 1, 1 - q, 1; τ1: q, 0; τ2: -q."""
    x = inputs(ROWS)
    out = get_advantage_estimator("step_gae")(
        **x, values=torch.zeros(6, dtype=torch.float64), norm_adv=False, process_weight=0.5
    )
    q = S3 / 4
    torch.testing.assert_close(
        out.advantages[:, 0], torch.tensor([1, 1 - q, 1, q, 0, -q], dtype=torch.float64), **TOL
    )
    torch.testing.assert_close(out.step_returns, out.advantages[:, 0])  # R = A + V, V = 0


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS.names()))
def test_weight_zero_is_outcome_only_bit_for_bit(name):
    est = get_advantage_estimator(name)
    x = inputs(ROWS, L=3)
    x["process_rewards"] = torch.rand(6, dtype=torch.float64) * 5
    extra = dict(obs_index=torch.tensor([0, 1, 2, 0, 1, 0]))
    if est.critic == "token":
        extra["values"] = torch.rand(6, 3, dtype=torch.float64)
    elif est.critic == "step":
        extra["values"] = torch.rand(6, dtype=torch.float64)
    base = {k: v for k, v in x.items() if not k.startswith("process")}
    plain = est(**base, **extra)
    zero = est(**x, **extra, process_weight=0.0)
    assert torch.equal(plain.advantages, zero.advantages) and torch.equal(plain.returns, zero.returns)
    with_p = est(**x, **extra, process_weight=1.0)
    assert not torch.equal(plain.advantages, with_p.advantages)


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS.names()))
def test_each_family_matches_its_definition(name):
    """Group estimators: A = A_outcome + w * return-to-go(p̂ per prompt group). The others: the
    estimator run on rewards r + w p̂ (p̂ over the batch), on the step's last token."""
    est = get_advantage_estimator(name)
    x, w = inputs(ROWS, L=3), 0.7
    x["response_mask"][1, 2] = 0  # a shorter step: the reward sits on its last token
    extra = dict(obs_index=torch.tensor([0, 1, 2, 0, 1, 0]), gamma=0.9)
    if est.critic == "token":
        extra["values"] = torch.rand(6, 3, dtype=torch.float64) * x["response_mask"]
    elif est.critic == "step":
        extra["values"] = torch.rand(6, dtype=torch.float64)
    base = {k: v for k, v in x.items() if not k.startswith("process")}
    got = est(**x, **extra, process_weight=w).advantages
    group = x["group_index"] if est.needs_groups else torch.zeros(6, dtype=torch.long)
    p_hat = normalize_process_rewards(rewards=x["process_rewards"], scored=x["process_mask"], group=group)
    if est.needs_groups:
        rtg = torch.zeros(6, dtype=torch.float64)
        for i, (traj, step, *_) in enumerate(ROWS):
            rtg[i] = sum(
                0.9 ** (s - step) * p_hat[j] for j, (t, s, *_) in enumerate(ROWS) if t == traj and s >= step
            )
        want = est(**base, **extra).advantages + w * rtg[:, None] * x["response_mask"]
    else:
        want = est(**{**base, "rewards": x["rewards"] + w * p_hat}, **extra).advantages
    torch.testing.assert_close(got, want)


def test_bad_process_inputs_are_refused():
    est = get_advantage_estimator("grpo")
    x = inputs(ROWS)
    with pytest.raises(ValueError, match="process_rewards must have shape"):
        est(**{**x, "process_rewards": torch.zeros(5)}, process_weight=1.0)
    x["process_rewards"][0] = float("nan")
    with pytest.raises(ValueError, match="process_rewards must be finite"):
        est(**x, process_weight=1.0)
    x["process_mask"][0] = False  # a NaN where the step is not scored is ignored
    est(**x, process_weight=1.0)


def test_compute_advantages_reads_the_process_reward_column():
    rows = [
        dict(traj_id=f"t{t}", group_id=f"g{g}", step=s, reward=r, response_ids=[1, 2], process_reward=p)
        for t, s, g, r, p in ROWS
    ]
    out = compute_advantages(rows, estimator="grpo", gamma=1.0, lam=1.0, process_weight=0.5)
    a = 1 / math.sqrt(2)
    want = [a - 0.5 / S3, a - 1 / S3, a, -a + 0.5 / S3, -a, 0.0]
    assert [r["advantages"][0] for r in out] == pytest.approx(want, abs=1e-5)
    plain = [{k: v for k, v in r.items() if k != "process_reward"} for r in rows]
    zero = compute_advantages(plain, estimator="grpo", gamma=1.0, lam=1.0)  # weight 0: column not read
    assert [r["advantages"] for r in zero] == [
        r["advantages"]
        for r in compute_advantages(rows, estimator="grpo", gamma=1.0, lam=1.0, process_weight=0.0)
    ]


@pytest.mark.parametrize("base", [1.0, 10.0, 100.0])
def test_equal_process_rewards_normalise_to_exactly_zero(base):
    """Normalisation groups of equal float32 scores (sizes 2-8, 200 values near ``base``) give p̂ = 0
    exactly (no ulp / 1e-6 noise)."""
    p, group = [], []
    for n in range(2, 9):
        for k in range(200):
            p += [base * (0.9 + 0.001 * k)] * n
            group += [len(group)] * n
    out = normalize_process_rewards(
        rewards=torch.tensor(p, dtype=torch.float32),
        scored=torch.ones(len(p), dtype=torch.bool),
        group=torch.tensor(group),
    )
    assert torch.equal(out, torch.zeros_like(out)), out.abs().max().item()
