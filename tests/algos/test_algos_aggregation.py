"""Loss aggregation modes by hand, micro-batch x accumulation invariance, presets."""

from __future__ import annotations

import pytest
import torch

from components.algos.advantages import ADVANTAGE_ESTIMATORS
from components.algos.aggregation import AGG_MODES, aggregate_loss, loss_normalisers
from components.algos.losses import POLICY_LOSSES, value_loss
from components.algos.presets import PRESETS, get_preset

F64 = torch.float64

# row 0: losses (1, 2, [3]) with the third token masked; row 1: (4, 5, 6); row 2: no valid token.
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, float("nan"), 9.0]], dtype=F64)
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])


@pytest.mark.parametrize(
    "mode, want",
    [
        ("token-mean", (1 + 2 + 4 + 5 + 6) / 5),  # 18 / 5 valid tokens = 3.6
        ("seq-mean-token-mean", (1.5 + 5.0) / 2),  # row means 1.5 and 5 over 2 non-empty rows = 3.25
        ("seq-mean-token-sum", (3.0 + 15.0) / 2),  # row sums 3 and 15 over 2 rows = 9
        ("seq-mean-token-sum-norm", 18.0 / 4),  # all valid tokens / norm_const 4 = 4.5
        ("traj-mean-token-mean", (1.5 + 5.0) / 2),  # without trajectory ids a row is a trajectory
    ],
)
def test_modes_by_hand(mode, want):
    got = aggregate_loss(loss=LOSS, response_mask=MASK, mode=mode, norm_const=4)
    assert got.item() == pytest.approx(want)
    # the normalisers of the whole batch give the same number
    norms = loss_normalisers(response_masks=MASK, norm_const=4)
    assert norms["global_tokens"] == 5 and norms["global_rows"] == 2
    assert aggregate_loss(loss=LOSS, response_mask=MASK, mode=mode, **norms).item() == pytest.approx(want)


def test_traj_mean_token_mean_by_hand():
    # rows 0 and 1 one trajectory (tokens 1, 2, 4, 5, 6: mean 3.6), row 2 (empty) another, which
    # has no valid token and does not count: one trajectory, loss 3.6
    got = aggregate_loss(loss=LOSS, response_mask=MASK, mode="traj-mean-token-mean", traj_ids=["a", "a", "b"])
    assert got.item() == pytest.approx(3.6)
    # a long failed episode and a short solved one weigh the same: a 3-turn trajectory of loss 1 per
    # token and a 1-turn trajectory of loss -1 give 0, where token-mean gives (3 - 1) / 4 = 0.5
    loss = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [-1.0, -1.0]], dtype=F64)
    mask = torch.ones(4, 2)
    ids = ["fail", "fail", "fail", "solved"]
    assert (
        aggregate_loss(loss=loss, response_mask=mask, mode="traj-mean-token-mean", traj_ids=ids).item() == 0.0
    )
    assert aggregate_loss(loss=loss, response_mask=mask, mode="token-mean").item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="traj_ids: 2 ids for 4 rows"):
        aggregate_loss(loss=loss, response_mask=mask, mode="traj-mean-token-mean", traj_ids=ids[:2])
    norms = loss_normalisers(response_masks=mask, traj_ids=ids)
    assert norms["traj_tokens"] == {"fail": 6.0, "solved": 2.0}
    with pytest.raises(ValueError, match=r"traj_ids \['other'\] are not in traj_tokens"):
        aggregate_loss(
            loss=loss[:1], response_mask=mask[:1], mode="traj-mean-token-mean", traj_ids=["other"], **norms
        )


def test_aggregation_errors_and_empty():
    with pytest.raises(
        KeyError, match=r"unknown loss aggregation mode 'mean'; valid: \['seq-mean-token-mean', "
    ):
        aggregate_loss(loss=LOSS, response_mask=MASK, mode="mean")
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm needs norm_const > 0"):
        aggregate_loss(loss=LOSS, response_mask=MASK, mode="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match=r"must both be \(B, L\)"):
        aggregate_loss(loss=LOSS[:, :2], response_mask=MASK, mode="token-mean")
    empty = torch.zeros(2, 3)
    for mode in AGG_MODES:
        assert aggregate_loss(loss=LOSS[:2], response_mask=empty, mode=mode, norm_const=3).item() == 0.0


# trajectories of the 8 rows of _microbatch_loss: "b" and "c" span micro-batches of 4 and 2 rows
TRAJS = ["a", "a", "a", "b", "b", "c", "c", "d"]


def _microbatch_loss(loss_name: str, mode: str, n_micro: int, *, global_counts: bool = True, trajs=None):
    """Sum of micro-batch losses (each backward-ed) and the gradient on the shared logits; ``trajs``
    names each row's trajectory (None: no trajectory ids)."""
    g = torch.Generator().manual_seed(7)
    B, L, V = 8, 6, 5
    logits = torch.randn(B, L, V, generator=g, dtype=F64).requires_grad_()
    tokens = torch.randint(V, (B, L), generator=g)
    mask = torch.arange(L)[None] < torch.tensor([1, 6, 3, 0, 5, 2, 6, 4])[:, None]  # row 3 empty
    old = torch.randn(B, L, generator=g, dtype=F64) * 0.1 - 1.7
    adv = torch.randn(B, L, generator=g, dtype=F64) * mask
    chunks = torch.arange(B).chunk(n_micro)
    ids = [None if trajs is None else [trajs[i] for i in idx.tolist()] for idx in chunks]
    norms = (
        loss_normalisers(
            response_masks=[mask[i] for i in chunks], norm_const=L, traj_ids=None if trajs is None else ids
        )
        if global_counts
        else {"norm_const": L}
    )
    total = torch.zeros((), dtype=F64)
    for j, idx in enumerate(chunks):
        logp = torch.log_softmax(logits[idx], -1).gather(-1, tokens[idx, :, None]).squeeze(-1)  # (b, L)
        loss, _ = POLICY_LOSSES[loss_name](logp=logp, old_logp=old[idx], advantages=adv[idx], response_mask=mask[idx],
                                           clip_low=0.2, clip_high=0.3, clip_ratio_c=3.0)  # fmt: skip
        part = aggregate_loss(loss=loss, response_mask=mask[idx], mode=mode, traj_ids=ids[j], **norms)
        part.backward()
        total += part.detach()
    return total, logits.grad


@pytest.mark.parametrize("trajs", [None, TRAJS], ids=["rows", "trajectories"])
@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("loss_name", sorted(POLICY_LOSSES))
def test_microbatch_accumulation_invariance(loss_name, mode, trajs):
    # n_micro = 1 with global_counts=False is the plain full-batch loss (this batch's own counts)
    full, grad_full = _microbatch_loss(loss_name, mode, 1, global_counts=False, trajs=trajs)
    assert grad_full.abs().sum() > 0
    for n in (1, 2, 4):
        acc, grad = _microbatch_loss(loss_name, mode, n, trajs=trajs)
        torch.testing.assert_close(acc, full, atol=1e-6, rtol=0)
        torch.testing.assert_close(grad, grad_full, atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode, trajs", [("token-mean", None), ("traj-mean-token-mean", TRAJS)])
def test_local_counts_would_break_invariance(mode, trajs):
    # the control: dividing each micro-batch by its own counts is NOT the full-batch loss
    full, _ = _microbatch_loss("ppo", mode, 1, global_counts=False, trajs=trajs)
    local, _ = _microbatch_loss("ppo", mode, 4, global_counts=False, trajs=trajs)
    assert abs(local.item() - full.item()) > 1e-3


def test_value_loss_accumulation_invariance():
    g = torch.Generator().manual_seed(8)
    v_old, R = torch.randn(6, 4, generator=g, dtype=F64), torch.randn(6, 4, generator=g, dtype=F64)
    v = (v_old + 0.3 * torch.randn(6, 4, generator=g, dtype=F64)).requires_grad_()
    mask = torch.rand(6, 4, generator=g) < 0.6
    full_loss, _ = value_loss(values=v, old_values=v_old, returns=R, value_mask=mask, clip_value=0.2)
    full = aggregate_loss(loss=full_loss, response_mask=mask, mode="token-mean")
    (grad_full,) = torch.autograd.grad(full, v)
    chunks = torch.arange(6).chunk(3)
    norms = loss_normalisers(response_masks=[mask[i] for i in chunks])
    acc = sum(aggregate_loss(loss=value_loss(values=v[i], old_values=v_old[i], returns=R[i], value_mask=mask[i],
                                             clip_value=0.2)[0], response_mask=mask[i], mode="token-mean", **norms)
              for i in chunks)  # fmt: skip
    (grad_acc,) = torch.autograd.grad(acc, v)
    torch.testing.assert_close(acc, full, atol=1e-6, rtol=0)
    torch.testing.assert_close(grad_acc, grad_full, atol=1e-6, rtol=0)


def test_presets_are_consistent():
    assert set(PRESETS) == {"grpo", "ppo", "steppo"}
    assert PRESETS["grpo"] == {
        "estimator": "grpo",
        "policy_loss": "ppo",
        "loss_agg": "token-mean",
        "critic": None,
    }
    assert PRESETS["ppo"] == {
        "estimator": "gae",
        "policy_loss": "ppo",
        "loss_agg": "token-mean",
        "critic": "token",
    }
    assert PRESETS["steppo"] == {"estimator": "step_gae", "policy_loss": "gspo", "loss_agg": "seq-mean-token-mean",
                                 "critic": "step"}  # fmt: skip
    for p in PRESETS.values():
        assert ADVANTAGE_ESTIMATORS[p["estimator"]].critic == p["critic"]
        assert p["policy_loss"] in POLICY_LOSSES and p["loss_agg"] in AGG_MODES
    got = get_preset("grpo")
    got["critic"] = "token"  # a copy: the registry is not changed
    assert PRESETS["grpo"]["critic"] is None
    with pytest.raises(KeyError, match=r"valid: \['grpo', 'ppo', 'steppo'\]"):
        get_preset("dapo")
