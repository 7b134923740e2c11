"""Policy losses (dual-clip PPO, GSPO, REINFORCE), value loss, KL estimators and entropy."""

from __future__ import annotations

import math

import pytest
import torch

from components.algos.aggregation import aggregate_loss
from components.algos.kl import KL_ESTIMATORS, get_kl_estimator, kl_penalty, kl_reward
from components.algos.losses import POLICY_LOSSES, entropy_from_logits, get_policy_loss, value_loss

F64 = torch.float64
NAN = float("nan")


# ---- ppo (dual clip) ----------------------------------------------------------------------------
# eps_low = eps_high = 0.2, c = 3. Ratios r = 0.5, 1, 1.5, 5, exp(30) (clamped to exp(20)).
# A = +1: L = max(-r, -clip(r)) = -min(r, clip(r))  -> -0.5, -1, -1.2, -1.2, -1.2
# A = -1: L = max(r, clip(r))                        ->  0.8,  1,  1.5,  5,  e^20; dual: min(., 3)
#                                                    ->  0.8,  1,  1.5,  3,  3
# d L / d logp = -A r where the unclipped branch is active, 0 where clipped or dual-clipped:
# A = +1: -0.5, -1, 0, 0, 0;   A = -1: 0, 1, 1.5, 0, 0.
LOG_R = [math.log(0.5), 0.0, math.log(1.5), math.log(5.0), 30.0]


def ppo_batch():
    old = torch.zeros(2, 6, dtype=F64)
    logp = torch.tensor([LOG_R + [NAN], LOG_R + [NAN]], dtype=F64, requires_grad=True)  # col 5: padding
    adv = torch.tensor([[1.0] * 5 + [NAN], [-1.0] * 5 + [NAN]], dtype=F64)
    mask = torch.tensor([[1] * 5 + [0]] * 2)
    return logp, old, adv, mask


def test_ppo_dual_clip_values_and_grads():
    logp, old, adv, mask = ppo_batch()
    loss, metrics = get_policy_loss("ppo")(logp=logp, old_logp=old, advantages=adv, response_mask=mask,
                                           clip_low=0.2, clip_high=0.2, clip_ratio_c=3.0)  # fmt: skip
    want = torch.tensor([[-0.5, -1, -1.2, -1.2, -1.2, 0], [0.8, 1, 1.5, 3, 3, 0]], dtype=F64)
    torch.testing.assert_close(loss, want)
    loss.sum().backward()
    want_grad = torch.tensor([[-0.5, -1, 0, 0, 0, 0], [0, 1, 1.5, 0, 0, 0]], dtype=F64)
    torch.testing.assert_close(logp.grad, want_grad)
    # clipped branch strictly larger: A=+1 at r = 1.5, 5, e^20; A=-1 at r = 0.5 -> 4 of 10 tokens
    assert metrics["clipfrac"].item() == pytest.approx(0.4)
    assert metrics["dual_clipfrac"].item() == pytest.approx(0.2)  # A=-1 at r = 5, e^20
    assert math.isfinite(metrics["approx_kl"].item()) and metrics["approx_kl"].item() > 0


def test_ppo_asymmetric_clip_and_other_c():
    # eps_low 0.1, eps_high 0.3, c = 2: A=+1, r=1.5 -> -1.3; A=-1, r=0.5 -> 0.9; A=-1, r=5 -> 2
    logp = torch.tensor([[math.log(1.5), math.log(0.5), math.log(5.0)]], dtype=F64)
    loss, _ = POLICY_LOSSES["ppo"](logp=logp, old_logp=torch.zeros_like(logp), advantages=torch.tensor([[1.0, -1, -1]], dtype=F64),
                                   response_mask=torch.ones(1, 3), clip_low=0.1, clip_high=0.3, clip_ratio_c=2.0)  # fmt: skip
    torch.testing.assert_close(loss, torch.tensor([[-1.3, 0.9, 2.0]], dtype=F64))


# ---- gspo ---------------------------------------------------------------------------------------


def test_gspo_values_by_hand():
    # row 0: log-ratios (0.1, 0.3) -> s = e^0.2 = 1.2214 inside [0.7, 1.3]: L = -A s = -e^0.2 (A = 1)
    # row 1: log-ratios (0.5, 0.5, 0.5) -> s = e^0.5 = 1.6487 > 1.3 with A = 1: clipped, L = -1.3
    # row 2: log-ratio 2 -> s = e^2 with A = -1: L = max(e^2, 1.3) = e^2 (no dual clip in gspo)
    logp = torch.tensor([[0.1, 0.3, NAN], [0.5, 0.5, 0.5], [2.0, NAN, NAN]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    adv = torch.tensor([[1.0, 1.0, 0], [1.0, 1.0, 1.0], [-1.0, 0, 0]], dtype=F64)
    loss, m = POLICY_LOSSES["gspo"](logp=logp, old_logp=torch.zeros_like(logp), advantages=adv, response_mask=mask,
                                    clip_low=0.3, clip_high=0.3, clip_ratio_c=3.0)  # fmt: skip
    e2 = math.exp(0.2)
    want = torch.tensor([[-e2, -e2, 0], [-1.3, -1.3, -1.3], [math.exp(2), 0, 0]], dtype=F64)
    torch.testing.assert_close(loss, want)
    assert m["clipfrac"].item() == pytest.approx(3 / 6)


@pytest.mark.parametrize("eps", [(0.99, 10.0), (3e-4, 4e-4)])
def test_gspo_gradient_is_analytic(eps):
    # With L_ij = -A_ij sg(s_i) exp(logp_ij - sg(logp_ij)) aggregated by seq-mean-token-mean over B rows:
    # dLoss/dlogp_ij = -A_ij s_i / (n_i B) where the unclipped branch is active, else 0
    # (clip active iff A > 0 and s > 1 + eps_high, or A < 0 and s < 1 - eps_low).
    g = torch.Generator().manual_seed(0)
    B, L = 6, 5
    lens = torch.tensor([1, 2, 3, 5, 4, 5])
    mask = torch.arange(L)[None] < lens[:, None]
    logp = (-torch.rand(B, L, generator=g, dtype=F64)).requires_grad_()
    old = logp.detach() + 0.01 * torch.randn(B, L, generator=g, dtype=F64)
    adv = torch.randn(B, L, generator=g, dtype=F64) * mask
    loss, _ = POLICY_LOSSES["gspo"](logp=logp, old_logp=old, advantages=adv, response_mask=mask,
                                    clip_low=eps[0], clip_high=eps[1], clip_ratio_c=3.0)  # fmt: skip
    aggregate_loss(loss=loss, response_mask=mask, mode="seq-mean-token-mean").backward()
    with torch.no_grad():
        s = torch.exp(((logp - old) * mask).sum(1) / lens)[:, None].expand(B, L)  # (B, L)
        clipped = ((adv > 0) & (s > 1 + eps[1])) | ((adv < 0) & (s < 1 - eps[0]))
        want = torch.where(mask & ~clipped, -adv * s / (lens[:, None] * B), 0.0)
    torch.testing.assert_close(logp.grad, want, atol=1e-12, rtol=1e-10)
    if eps[0] > 0.5:  # nothing clipped: the gradient is that of the sequence-level objective
        assert not clipped[mask].any()
    else:
        assert clipped[mask].any() and (~clipped[mask]).any()


def test_gspo_equals_sequence_objective_with_row_advantages():
    # A constant within each row: grad of gspo + seq-mean-token-mean == grad of -mean_i A_i s_i(theta)
    g = torch.Generator().manual_seed(1)
    B, L = 4, 6
    mask = torch.arange(L)[None] < torch.tensor([2, 6, 3, 1])[:, None]
    old = -torch.rand(B, L, generator=g, dtype=F64)
    a_row = torch.randn(B, generator=g, dtype=F64)
    adv = a_row[:, None] * mask
    x1 = (old + 0.02 * torch.randn(B, L, generator=g, dtype=F64)).requires_grad_()
    loss, _ = POLICY_LOSSES["gspo"](logp=x1, old_logp=old, advantages=adv, response_mask=mask,
                                    clip_low=0.5, clip_high=0.5, clip_ratio_c=3.0)  # fmt: skip
    aggregate_loss(loss=loss, response_mask=mask, mode="seq-mean-token-mean").backward()
    x2 = x1.detach().clone().requires_grad_()
    s = torch.exp(((x2 - old) * mask).sum(1) / mask.sum(1))  # (B,)
    (-(a_row * s).mean()).backward()
    torch.testing.assert_close(x1.grad, x2.grad * mask)


def _loss_grad(name: str, agg: str, logp: torch.Tensor, old, adv, mask, clip=(0.2, 0.2)) -> torch.Tensor:
    x = logp.detach().clone().requires_grad_()
    loss, _ = POLICY_LOSSES[name](logp=x, old_logp=old, advantages=adv, response_mask=mask,
                                  clip_low=clip[0], clip_high=clip[1], clip_ratio_c=3.0)  # fmt: skip
    aggregate_loss(loss=loss, response_mask=mask, mode=agg).backward()
    return x.grad


def test_gspo_and_ppo_agree_on_policy_when_replies_are_equally_long():
    # StepPO (gspo + seq-mean-token-mean) and PPO's loss (ppo + token-mean) with one advantage per row
    # and replies of one length (sokoban's: 8 tokens each): at ratio 1, an iteration's first optimizer
    # step, both gradients are -A_i / (B L) d logp_ij; they part only once the ratios move (later steps).
    g = torch.Generator().manual_seed(2)
    B, L = 5, 8
    mask = torch.ones(B, L, dtype=torch.bool)
    old = -torch.rand(B, L, generator=g, dtype=F64)
    adv = torch.randn(B, generator=g, dtype=F64)[:, None].expand(B, L).clone()
    on_gspo = _loss_grad("gspo", "seq-mean-token-mean", old, old, adv, mask)
    on_ppo = _loss_grad("ppo", "token-mean", old, old, adv, mask)
    torch.testing.assert_close(on_gspo, on_ppo)
    torch.testing.assert_close(on_ppo, -adv / (B * L))
    step = (0.1 * torch.randn(B, L, generator=g, dtype=F64)).clamp(-0.15, 0.15)  # |log r| < log 1.2
    moved = old + step  # a later optimizer step: every token ratio moved, all within the clip
    off_gspo = _loss_grad("gspo", "seq-mean-token-mean", moved, old, adv, mask)
    off_ppo = _loss_grad("ppo", "token-mean", moved, old, adv, mask)
    assert not torch.allclose(off_gspo, off_ppo)  # each token's own ratio against the row's mean ratio
    torch.testing.assert_close(off_ppo, -adv * torch.exp(moved - old) / (B * L))


def test_gspo_clip_matched_to_the_reply_clips_where_ppo_clips_its_one_moving_token():
    # An 8-token reply whose 7 fixed tokens keep ratio 1 and whose move token has ratio r: GSPO's
    # sequence ratio is r^(1/8), so its clip (1 - 0.8^(1/8), 1.2^(1/8) - 1) (about 0.028 / 0.023,
    # docs/steppo.md) stops the gradient exactly where PPO's clip 0.2 stops the move token's.
    L = 8
    # the move's ratios, all below PPO's dual clip (3), which GSPO does not have
    r = torch.tensor([0.5, 0.7, 0.79, 0.81, 0.95, 1.05, 1.19, 1.21, 1.5, 2.5], dtype=F64)
    B = 2 * len(r)
    old = torch.full((B, L), -1e-3, dtype=F64)
    old[:, 3] = -0.7  # the move token
    logp = old.clone()
    logp[:, 3] += torch.log(r).repeat(2)
    adv = torch.cat([torch.ones(len(r)), -torch.ones(len(r))]).to(F64)[:, None].expand(B, L).clone()
    mask = torch.ones(B, L, dtype=torch.bool)
    matched = (1 - 0.8 ** (1 / L), 1.2 ** (1 / L) - 1)
    g_gspo = _loss_grad("gspo", "seq-mean-token-mean", logp, old, adv, mask, clip=matched)
    g_ppo = _loss_grad("ppo", "token-mean", logp, old, adv, mask)
    gspo_live = g_gspo.abs().sum(1) > 0
    ppo_live = g_ppo[:, 3].abs() > 0
    torch.testing.assert_close(gspo_live, ppo_live)
    # the clip stops a row only when it moved with its advantage past 0.2: r > 1.2 for A > 0, r < 0.8 for A < 0
    torch.testing.assert_close(ppo_live, torch.cat([r <= 1.2, r >= 0.8]))
    # a clip of 0.2 on the sequence ratio (r in [0.17, 4.3]) stops none of these rows
    assert (_loss_grad("gspo", "seq-mean-token-mean", logp, old, adv, mask).abs().sum(1) > 0).all()


# ---- reinforce, registry, shapes ----------------------------------------------------------------


def test_reinforce_loss_and_grad():
    logp = torch.tensor([[-0.5, -2.0, NAN]], dtype=F64, requires_grad=True)
    adv = torch.tensor([[2.0, -1.0, 7.0]], dtype=F64)
    loss, _ = POLICY_LOSSES["reinforce"](logp=logp, old_logp=torch.zeros(1, 3, dtype=F64), advantages=adv,
                                         response_mask=torch.tensor([[1, 1, 0]]), clip_low=0.2, clip_high=0.2,
                                         clip_ratio_c=3.0)  # fmt: skip
    torch.testing.assert_close(loss, torch.tensor([[1.0, -2.0, 0.0]], dtype=F64))  # -A logp
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-2.0, 1.0, 0.0]], dtype=F64))


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_policy_loss_same_signature(name):
    g = torch.Generator().manual_seed(2)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    logp = torch.where(mask.bool(), -torch.rand(2, 4, generator=g), torch.tensor(NAN)).requires_grad_()
    loss, metrics = POLICY_LOSSES[name](logp=logp, old_logp=torch.full((2, 4), -0.5), advantages=torch.randn(2, 4, generator=g),
                                        response_mask=mask, clip_low=0.2, clip_high=0.3, clip_ratio_c=3.0)  # fmt: skip
    assert loss.shape == (2, 4) and torch.isfinite(loss).all() and (loss[~mask.bool()] == 0).all()
    assert {"clipfrac", "approx_kl"} <= set(metrics) and all(not v.requires_grad for v in metrics.values())
    loss.sum().backward()
    assert torch.isfinite(logp.grad).all() and (logp.grad[~mask.bool()] == 0).all()


def test_policy_loss_errors():
    with pytest.raises(KeyError, match=r"unknown policy loss 'ppo2'; valid: \['gspo', 'ppo', 'reinforce'\]"):
        get_policy_loss("ppo2")
    kw = dict(logp=torch.zeros(2, 3), old_logp=torch.zeros(2, 3), advantages=torch.zeros(2, 3),
              response_mask=torch.ones(2, 3), clip_low=0.2, clip_high=0.2, clip_ratio_c=3.0)  # fmt: skip
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        POLICY_LOSSES["ppo"](**{**kw, "clip_ratio_c": 1.0})
    with pytest.raises(ValueError, match=r"advantages has shape \(2, 2\) but logp has \(2, 3\)"):
        POLICY_LOSSES["gspo"](**{**kw, "advantages": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match=r"clip_low must be in \[0, 1\)"):
        POLICY_LOSSES["ppo"](**{**kw, "clip_low": 1.0})


# ---- value loss ---------------------------------------------------------------------------------


def test_value_loss_clipping_by_hand():
    # c = 0.2. v_clip = v_old + clip(v - v_old, -0.2, 0.2).
    # (v, v_old, R) = (1.5, 1.0, 1.0): (0.5)^2 = 0.25 vs (1.2 - 1)^2 = 0.04 -> 0.5*0.25 = 0.125
    #                 (1.5, 1.0, 2.0): (-0.5)^2 = 0.25 vs (1.2 - 2)^2 = 0.64 -> 0.32 (clipped)
    #                 (0.9, 1.0, 0.0): 0.81 vs (0.9 - 0)^2 = 0.81 (within clip) -> 0.405
    #                 (0.5, 1.0, 0.0): 0.25 vs (0.8 - 0)^2 = 0.64 -> 0.32 (clipped)
    #                 masked position with NaN values -> 0
    v = torch.tensor([1.5, 1.5, 0.9, 0.5, NAN], dtype=F64, requires_grad=True)
    v_old = torch.tensor([1.0, 1.0, 1.0, 1.0, NAN], dtype=F64)
    R = torch.tensor([1.0, 2.0, 0.0, 0.0, NAN], dtype=F64)
    loss, m = value_loss(
        values=v, old_values=v_old, returns=R, value_mask=torch.tensor([1, 1, 1, 1, 0]), clip_value=0.2
    )
    torch.testing.assert_close(loss, torch.tensor([0.125, 0.32, 0.405, 0.32, 0.0], dtype=F64))
    assert m["vf_clipfrac"].item() == pytest.approx(0.5)
    loss.sum().backward()
    # unclipped active: d/dv = v - R (0.5, 0.9); clipped with the clip saturated: 0
    torch.testing.assert_close(v.grad, torch.tensor([0.5, 0.0, 0.9, 0.0, 0.0], dtype=F64))


def test_value_loss_one_position_per_row():
    # step_gae: only the last prompt token of each row is trained
    v = torch.tensor([[0.0, 2.0, 9.0], [0.0, 0.0, 1.0]], dtype=F64)
    mask = torch.tensor([[0, 1, 0], [0, 0, 1]])
    R = torch.tensor([[5.0, 1.0, 5.0], [5.0, 5.0, 3.0]], dtype=F64)
    loss, _ = value_loss(values=v, old_values=v, returns=R, value_mask=mask, clip_value=10.0)
    # 0.5 * (2 - 1)^2 = 0.5 and 0.5 * (1 - 3)^2 = 2; token-mean over the two positions = 1.25
    torch.testing.assert_close(loss, torch.tensor([[0, 0.5, 0], [0, 0, 2.0]], dtype=F64))
    assert aggregate_loss(loss=loss, response_mask=mask, mode="token-mean").item() == pytest.approx(1.25)


# ---- KL and entropy -----------------------------------------------------------------------------


def test_kl_estimators_by_hand():
    # (logp, ref) = (-1, -2): d = ref - logp = -1: k1 = 1, k2 = 0.5, k3 = e^-1 + 1 - 1 = 0.367879
    # (logp, ref) = (-2, -1): d = 1: k1 = -1, k2 = 0.5, k3 = e - 1 - 1 = 0.718282
    # equal: all 0. (logp, ref) = (-30, 0): k3 = e^20 - 21 clamped to 10
    logp = torch.tensor([[-1.0, -2.0, -0.7, -30.0]], dtype=F64)
    ref = torch.tensor([[-2.0, -1.0, -0.7, 0.0]], dtype=F64)
    torch.testing.assert_close(
        KL_ESTIMATORS["kl"](logp, ref), torch.tensor([[1.0, -1.0, 0.0, -30.0]], dtype=F64)
    )
    torch.testing.assert_close(
        KL_ESTIMATORS["mse"](logp, ref), torch.tensor([[0.5, 0.5, 0.0, 450.0]], dtype=F64)
    )
    want_k3 = torch.tensor([[math.exp(-1), math.e - 2, 0.0, 10.0]], dtype=F64)
    torch.testing.assert_close(KL_ESTIMATORS["low_var_kl"](logp, ref), want_k3)


def test_low_var_kl_gradient_is_finite_far_from_ref():
    logp = torch.tensor([-200.0, -1.0, 5.0], requires_grad=True)
    kl_penalty(logp=logp[None], ref_logp=torch.tensor([[0.0, -1.5, -200.0]]), response_mask=torch.ones(1, 3),
               kind="low_var_kl").sum().backward()  # fmt: skip
    assert torch.isfinite(logp.grad).all()
    # middle: d = -0.5: k3 = e^d - d - 1, dk3/dlogp = -(e^d - 1) = 1 - e^-0.5
    assert logp.grad[1].item() == pytest.approx(1 - math.exp(-0.5), rel=1e-5)


def test_kl_penalty_mask_and_reward():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    logp = torch.tensor([[-1.0, -1.0, NAN], [-1.0, NAN, NAN]], dtype=F64)
    ref = torch.tensor([[-1.1, -1.2, 0.0], [-1.3, 0.0, 0.0]], dtype=F64)  # k1 = 0.1, 0.2 | 0.3
    pen = kl_penalty(logp=logp, ref_logp=ref, response_mask=mask, kind="kl")
    torch.testing.assert_close(pen, torch.tensor([[0.1, 0.2, 0], [0.3, 0, 0]], dtype=F64))
    # step rewards (1, 2) on the last response token, minus 0.5 * k1 on every token
    r = kl_reward(rewards=torch.tensor([1.0, 2.0], dtype=F64), response_mask=mask, logp=logp, ref_logp=ref,
                  kind="kl", coef=0.5)  # fmt: skip
    torch.testing.assert_close(r, torch.tensor([[-0.05, 0.9, 0], [1.85, 0, 0]], dtype=F64))
    with pytest.raises(KeyError, match=r"unknown KL estimator 'k3'; valid: \['kl', 'low_var_kl', 'mse'\]"):
        get_kl_estimator("k3")


def test_entropy_from_logits():
    assert entropy_from_logits(torch.zeros(2, 3, 5)).allclose(torch.full((2, 3), math.log(5)))
    peaked = entropy_from_logits(torch.tensor([[1000.0, 0.0, -1000.0]]))
    assert torch.isfinite(peaked).all() and peaked.abs().max() < 1e-6
    logits = torch.randn(4, 7, 11, generator=torch.Generator().manual_seed(3), dtype=F64)
    want = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(entropy_from_logits(logits), want)
