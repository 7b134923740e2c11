"""Off-policy corrections (components.algos.offpolicy) through the policy losses: values and gradients
computed by hand, the default `none` equal to the losses before the corrections existed bit for bit,
the rollout/trainer mismatch metrics, and the params checks that refuse bad settings at load."""

from __future__ import annotations

import math

import pytest
import torch

from components.algos.losses import POLICY_LOSSES
from components.algos.offpolicy import (
    OFFPOLICY_CORRECTIONS,
    correction_weights,
    get_correction,
    mismatch_metrics,
    mismatch_sums,
)
from components.config import ConfigError, load_params
from flows import REPO

F64 = torch.float64
NAN = float("nan")
LN = math.log
CLIP = dict(clip_low=0.2, clip_high=0.2, clip_ratio_c=3.0)


# ---- ppo (token level) --------------------------------------------------------------------------
# One row, A = +1, three tokens and one padding column. Chosen: behaviour weights w = pi_old / pi_behav
# = 0.5, 1.5, 4 (log pi_behav = log pi_old - ln w) and ratios r = pi / pi_old = 1, 1.1, 0.5.
# PPO, eps 0.2: L = -min(r, clip(r, 0.8, 1.2)) = -1, -1.1, -0.5 (the unclipped branch everywhere:
# for A > 0 and r = 0.5 < 0.8, min(0.5, 0.8) = 0.5 is r itself).
# tis, C = 2: weights min(w, 2) = 0.5, 1.5, 2      -> L = -0.5, -1.65, -1.0; capped: token 3 (1/3)
# decoupled, C = 2: weights w if w <= 2 else 0 = 0.5, 1.5, 0 -> L = -0.5, -1.65, 0; dropped 1/3
# Gradient dL/dlogp = -A w r on the unclipped branch: tis -0.5, -1.65, -1.0; decoupled -0.5, -1.65, 0.
OLD = [-1.0, -2.0, -0.5]
W = [0.5, 1.5, 4.0]
R = [1.0, 1.1, 0.5]


def token_batch():
    old = torch.tensor([OLD + [NAN]], dtype=F64)
    behav = torch.tensor([[o - LN(w) for o, w in zip(OLD, W)] + [NAN]], dtype=F64)
    logp = torch.tensor([[o + LN(r) for o, r in zip(OLD, R)] + [NAN]], dtype=F64, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0, NAN]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0]])
    return logp, old, behav, adv, mask


@pytest.mark.parametrize(
    "correction, want, capped",
    [("tis", [-0.5, -1.65, -1.0, 0.0], 1 / 3), ("decoupled", [-0.5, -1.65, 0.0, 0.0], 1 / 3)],
)
def test_ppo_token_weights_by_hand(correction, want, capped):
    logp, old, behav, adv, mask = token_batch()
    loss, metrics = POLICY_LOSSES["ppo"](logp=logp, old_logp=old, advantages=adv, response_mask=mask, **CLIP,
                                         behav_logp=behav, correction=correction, correction_cap=2.0)  # fmt: skip
    torch.testing.assert_close(loss, torch.tensor([want], dtype=F64))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([want], dtype=F64))  # -w r = L here (A = 1)
    assert metrics["is_capped_frac"].item() == pytest.approx(capped)
    weights = {"tis": [0.5, 1.5, 2.0], "decoupled": [0.5, 1.5, 0.0]}[correction]
    assert metrics["is_weight_mean"].item() == pytest.approx(sum(weights) / 3)
    assert metrics["clipfrac"].item() == 0.0  # the clip is on r alone, which the weight does not change


def test_reinforce_takes_the_token_weight():
    # L = -A w logp: A = 1, logp = OLD + ln R = -1, -2 + ln 1.1, -0.5 + ln 0.5; tis weights 0.5, 1.5, 2
    logp, old, behav, adv, mask = token_batch()
    loss, _ = POLICY_LOSSES["reinforce"](logp=logp, old_logp=old, advantages=adv, response_mask=mask, **CLIP,
                                         behav_logp=behav, correction="tis", correction_cap=2.0)  # fmt: skip
    want = [0.5 * 1.0, -1.5 * (-2.0 + LN(1.1)), -2.0 * (-0.5 + LN(0.5)), 0.0]
    torch.testing.assert_close(loss, torch.tensor([want], dtype=F64))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5, -1.5, -2.0, 0.0]], dtype=F64))


# ---- gspo (sequence level: StepPO) --------------------------------------------------------------
# Row 0: log w = ln 0.5, ln 1.5, ln 4 -> mean = ln(0.5 * 1.5 * 4) / 3 = ln(3) / 3, w_row = 3^(1/3)
#        = 1.4422496 (< C = 2: no cap); log r = ln 1.1 on every token -> s = 1.1, A = +1:
#        L = -s = -1.1 per token -> x w_row = -1.5864746 for tis and decoupled alike.
# Row 1: log w = ln 4, ln 4, 0 -> mean = 2 ln(4) / 3, w_row = 4^(2/3) = 2.5198421 > 2; s = 1, A = -1:
#        L = max(s, clip(s)) = 1 -> tis: x 2 = 2 (3 tokens capped); decoupled: x 0 = 0 (3 dropped).
# capped share 3 / 6 = 0.5 in both. Per token (ppo's level) row 0's weights would be 0.5, 1.5, 2.
def seq_batch():
    old = torch.tensor([[-1.0, -2.0, -0.5, NAN], [-0.3, -0.7, -1.2, NAN]], dtype=F64)
    log_w = torch.tensor([[LN(0.5), LN(1.5), LN(4.0), 0.0], [LN(4.0), LN(4.0), 0.0, 0.0]], dtype=F64)
    log_r = torch.tensor([[LN(1.1)] * 3 + [0.0], [0.0] * 4], dtype=F64)
    logp = (old + log_r).detach().requires_grad_()
    adv = torch.tensor([[1.0] * 3 + [NAN], [-1.0] * 3 + [NAN]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])
    return logp, old, old - log_w, adv, mask


@pytest.mark.parametrize("correction, row1", [("tis", 2.0), ("decoupled", 0.0)])
def test_gspo_row_weight_by_hand(correction, row1):
    logp, old, behav, adv, mask = seq_batch()
    loss, metrics = POLICY_LOSSES["gspo"](logp=logp, old_logp=old, advantages=adv, response_mask=mask, **CLIP,
                                          behav_logp=behav, correction=correction, correction_cap=2.0)  # fmt: skip
    w0 = 3 ** (1 / 3)
    assert w0 == pytest.approx(1.4422496)
    want = torch.tensor([[-1.1 * w0] * 3 + [0.0], [row1] * 3 + [0.0]], dtype=F64)
    torch.testing.assert_close(loss, want)
    assert metrics["is_capped_frac"].item() == pytest.approx(0.5)
    # gradient: d/dlogp_j of sg(s) exp(logp_j - sg(logp_j)) = s; row 0: -A s w0 = -1.1 w0 per token;
    # row 1: -A s x weight = 2 (tis) or 0 (decoupled), the max taking the unclipped branch at s = 1.
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, want)


def test_weights_by_hand_at_both_levels():
    _, old, behav, _, mask = seq_batch()
    tok, capped = correction_weights(old_logp=old, behav_logp=behav, response_mask=mask, correction="tis",
                                     cap=2.0, level="token")  # fmt: skip
    torch.testing.assert_close(tok, torch.tensor([[0.5, 1.5, 2.0, 0.0], [2.0, 2.0, 1.0, 0.0]], dtype=F64))
    assert capped.tolist() == [[False, False, True, False], [True, True, False, False]]
    seq, capped = correction_weights(old_logp=old, behav_logp=behav, response_mask=mask, correction="decoupled",
                                     cap=3.0, level="sequence")  # fmt: skip  # 2.52 <= 3: kept
    want = torch.tensor([[3 ** (1 / 3)] * 3 + [0.0], [4 ** (2 / 3)] * 3 + [0.0]], dtype=F64)
    torch.testing.assert_close(seq, want)
    assert not capped.any()
    assert correction_weights(old_logp=old, behav_logp=behav, response_mask=mask, correction="none", cap=2.0,
                              level="token") is None  # fmt: skip


# ---- none: the losses as they were, bit for bit -------------------------------------------------
# The formulas of components/algos/losses.py before the corrections existed (commit 01cf655), verbatim.
def _old_ppo(logp, old_logp, advantages, mask, clip_low, clip_high, clip_ratio_c):
    zero = torch.zeros((), dtype=logp.dtype)
    A = torch.where(mask, advantages, zero)
    log_ratio = torch.where(mask, logp - old_logp, zero).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    loss = torch.maximum(-A * ratio, -A * ratio.clamp(1.0 - clip_low, 1.0 + clip_high))
    dual = -A * clip_ratio_c
    loss = torch.where((A < 0) & (dual < loss), dual, loss)
    return torch.where(mask, loss, zero)


def _old_gspo(logp, old_logp, advantages, mask, clip_low, clip_high, clip_ratio_c):
    zero = torch.zeros((), dtype=logp.dtype)
    A = torch.where(mask, advantages, zero)
    lp = torch.where(mask, logp, zero)
    log_ratio = torch.where(mask, logp - old_logp, zero)
    log_s = (log_ratio.sum(1) / mask.sum(1).clamp(min=1)).clamp(-20.0, 20.0)
    s = torch.exp(log_s.detach()[:, None] + lp - lp.detach())
    loss = torch.maximum(-A * s, -A * s.clamp(1.0 - clip_low, 1.0 + clip_high))
    return torch.where(mask, loss, zero)


def _old_reinforce(logp, old_logp, advantages, mask, clip_low, clip_high, clip_ratio_c):
    zero = torch.zeros((), dtype=logp.dtype)
    return -torch.where(mask, advantages, zero) * torch.where(mask, logp, zero)


OLD_LOSSES = {"ppo": _old_ppo, "gspo": _old_gspo, "reinforce": _old_reinforce}


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_none_is_the_loss_before_corrections_bit_for_bit(name):
    assert set(OLD_LOSSES) == set(POLICY_LOSSES)
    g = torch.Generator().manual_seed(5)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]).bool()
    base = -torch.rand(3, 5, generator=g, dtype=torch.float32)
    old = base + 0.3 * torch.randn(3, 5, generator=g)
    behav = old + 0.5 * torch.randn(3, 5, generator=g)  # far off: a weight would show
    adv = torch.randn(3, 5, generator=g)
    clip = dict(clip_low=0.2, clip_high=0.25, clip_ratio_c=3.0)
    losses, grads = [], []
    for extra in ({}, {"behav_logp": behav, "correction": "none", "correction_cap": 1.5}, None):
        logp = base.clone().requires_grad_()
        if extra is None:
            loss = OLD_LOSSES[name](logp, old, adv, mask, **clip)
        else:
            loss, _ = POLICY_LOSSES[name](logp=logp, old_logp=old, advantages=adv, response_mask=mask,
                                          **clip, **extra)  # fmt: skip
        loss.sum().backward()
        losses.append(loss.detach())
        grads.append(logp.grad)
    assert all(torch.equal(losses[0], x) for x in losses[1:]), name
    assert all(torch.equal(grads[0], x) for x in grads[1:]), name


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_a_weight_of_one_changes_nothing(name):
    # pi_behav = pi_old: every weight is exactly 1, so tis equals none bit for bit
    g = torch.Generator().manual_seed(6)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]).bool()
    old, adv = -torch.rand(2, 4, generator=g), torch.randn(2, 4, generator=g)
    base = old + 0.1 * torch.randn(2, 4, generator=g)
    out = []
    for extra in ({}, {"behav_logp": old.clone(), "correction": "tis"}):
        logp = base.clone().requires_grad_()
        loss, _ = POLICY_LOSSES[name](logp=logp, old_logp=old, advantages=adv, response_mask=mask, **CLIP,
                                      **extra)  # fmt: skip
        loss.sum().backward()
        out.append((loss.detach(), logp.grad))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


def test_correction_errors():
    logp, old, behav, adv, mask = token_batch()
    kw = dict(logp=logp, old_logp=old, advantages=adv, response_mask=mask, **CLIP)
    with pytest.raises(
        KeyError, match=r"unknown off-policy correction 'is'; valid: \['decoupled', 'none', 'tis'\]"
    ):
        POLICY_LOSSES["ppo"](**kw, behav_logp=behav, correction="is")
    with pytest.raises(ValueError, match="correction='tis' needs behav_logp"):
        POLICY_LOSSES["gspo"](**kw, correction="tis")
    with pytest.raises(ValueError, match="cap must be >= 1, got 0.5"):
        POLICY_LOSSES["ppo"](**kw, behav_logp=behav, correction="tis", correction_cap=0.5)
    with pytest.raises(ValueError, match=r"behav_logp has shape \(1, 3\)"):
        POLICY_LOSSES["ppo"](**kw, behav_logp=behav[:, :3], correction="decoupled")
    assert sorted(OFFPOLICY_CORRECTIONS) == ["decoupled", "none", "tis"]
    assert get_correction("decoupled").old_logprobs == ("recompute",)


# ---- the mismatch metrics -----------------------------------------------------------------------
def test_mismatch_metrics_by_hand():
    # d = log pi_trainer - log pi_rollout = 0, ln 2, -ln 2 (then padding, and a second batch with d = 0)
    # k3 = e^d - 1 - d = 0, 1 - ln 2, ln 2 - 0.5: sum 0.5 over 3 tokens; with the second batch's 2
    # tokens of d = 0: 0.5 / 5 = 0.1. max |d| = ln 2.
    rollout = torch.tensor([[-1.0, -2.0, -0.5, NAN]])
    trainer = rollout + torch.tensor([[0.0, LN(2.0), -LN(2.0), 0.0]])
    a = mismatch_sums(trainer_logp=trainer, rollout_logp=rollout, response_mask=torch.tensor([[1, 1, 1, 0]]))
    assert a["kl_sum"] == pytest.approx(0.5, abs=1e-6) and a["tokens"] == 3
    assert a["max_abs_log_ratio"] == pytest.approx(LN(2.0), abs=1e-6)
    b = mismatch_sums(
        trainer_logp=torch.zeros(1, 2), rollout_logp=torch.zeros(1, 2), response_mask=torch.ones(1, 2)
    )
    m = mismatch_metrics([a, b])
    assert m["kl"] == pytest.approx(0.1, abs=1e-6) and m["max_abs_log_ratio"] == pytest.approx(
        LN(2.0), abs=1e-6
    )
    assert mismatch_metrics([]) == {}


# ---- params: bad settings refuse at load, naming the keys ---------------------------------------
PARAMS = REPO / "params.yaml"


def test_default_params_correct_nothing():
    p = load_params(PARAMS)
    assert {a.correction for a in p.algorithms.values()} == {"none"}


@pytest.mark.parametrize(
    "overrides",
    [
        {"algorithms.grpo.correction": "tis"},  # the default old_logprobs: detached
        {"algorithms.steppo.correction": "tis", "train.old_logprobs": "recompute"},
        # the engines report the tempered log-probs, so a correction holds at T != 1 too
        {
            "algorithms.steppo.correction": "tis",
            "train.old_logprobs": "recompute",
            "train.temperature": 0.4,
        },
        {
            "algorithms.ppo.correction": "decoupled",
            "train.old_logprobs": "recompute",
            "algorithms.ppo.correction_cap": 5.0,
        },
        {"algorithms.gigpo.correction": "decoupled", "train.old_logprobs": "recompute"},
    ],
)
def test_corrections_that_have_their_logprobs_load(overrides):
    p = load_params(PARAMS, overrides=overrides)
    algo = next(k.split(".")[1] for k in overrides if k.startswith("algorithms."))
    assert p.algorithms[algo].correction == overrides[f"algorithms.{algo}.correction"]


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        (
            {"algorithms.grpo.correction": "tis", "train.old_logprobs": "rollout"},
            r"algorithms\.grpo\.correction='tis'.*train\.old_logprobs='rollout' takes the rollout's log-probs.*"
            r"set train\.old_logprobs to detached or recompute",
        ),
        (
            {"algorithms.ppo.correction": "decoupled"},
            r"algorithms\.ppo\.correction='decoupled'.*train\.old_logprobs='detached'.*no proximal policy.*"
            r"set train\.old_logprobs to recompute",
        ),
        (
            {"algorithms.grpo.correction_cap": 0.5},
            r"algorithms\.grpo\.correction_cap: correction_cap=0\.5 < 1",
        ),
        (
            {"algorithms.grpo.correction": "is"},
            r"algorithms\.grpo\.correction: unknown off-policy correction 'is'",
        ),
        ({"algorithms.grpo.corection": "tis"}, r"algorithms\.grpo\.corection: unknown key"),
    ],
)
def test_bad_corrections_refuse_at_load(overrides, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_params(PARAMS, overrides=overrides)
