"""The off-policy correction and the rollout/trainer mismatch metrics through the actor update
(components.train.rl_update.actor_update) on the tiny model, and through an RLSession on the hf rollout
engine: rollout -> annotate (old log-probs recomputed) -> advantages -> update with tis."""

from __future__ import annotations

import math

import pytest
import torch
from train_helpers import (
    ACTOR_KW,
    RL_ENGINE_KW,
    GradCapture,
    run_actor_update,
    session_config,
    tiny_model,
    tiny_tokenizer,
    trajectories,
    with_old_logprobs,
)

from components.rollout.base import SamplingConfig
from components.train.advantage import compute_advantages
from components.train.engine import build_engine
from components.train.rl_update import ActorSettings


@pytest.fixture(scope="module")
def engine():
    """One actor engine for the module's gradient comparisons: each step starts from the same weights
    (:func:`_grads` loads them), and a gradient does not depend on the optimizer's state."""
    e = build_engine(tiny_model(), dtype="fp32", micro_batch_size=4, **RL_ENGINE_KW)
    e.initial = {k: v.detach().clone() for k, v in e.module.state_dict().items()}
    return e


def _grads(
    engine, rows: list[dict], micro: int = 64, **kw
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """(gradient, metrics) of one actor_update over ``rows`` (one optimizer step) from the initial weights."""
    engine.module.load_state_dict(engine.initial)
    capture = GradCapture(engine)
    kw = {**ACTOR_KW, "mini_batch_size": len(rows), "micro_batch_size": micro, **kw}
    metrics = run_actor_update(engine, rows, **kw)
    capture.close()
    return capture.grads, metrics


def _rows(seed: int, shift: float = 0.0) -> list[dict]:
    """Step rows with the tiny model's exact log-probs as old log-probs, advantages +-1 by trajectory,
    and the rollout's log-probs ``response_logprobs`` = old - ``shift`` (pi_old / pi_behav = e^shift)."""
    rows = with_old_logprobs(trajectories(8, seed=seed), lambda r: 1.0 if int(r["traj_id"][1:]) % 2 else -1.0)
    return [{**r, "response_logprobs": [x - shift for x in r["old_logprobs"]]} for r in rows]


def _scaled(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], factor: float) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], factor * b[name], atol=1e-7, rtol=1e-4, msg=name)


def test_the_mismatch_metrics_change_nothing_in_the_update(engine):
    """Rows with the rollout's log-probs (so mismatch/* is computed) and without: the same gradient
    and the same metrics besides mismatch/*, bit for bit, at the default correction (none), detached
    or recomputed, over several micro-batches."""
    with_behav = _rows(seed=1, shift=0.3)
    without = [{k: v for k, v in r.items() if k != "response_logprobs"} for r in with_behav]
    for detach in (False, True):
        g_a, m_a = _grads(engine, with_behav, micro=4, detach_old=detach)
        g_b, m_b = _grads(engine, without, micro=4, detach_old=detach)
        assert g_a.keys() == g_b.keys() and g_a and all(torch.equal(g_a[k], g_b[k]) for k in g_a)
        assert "mismatch/kl" in m_a and "mismatch/kl" not in m_b and "mismatch/capped_frac" not in m_a
        assert {k: v for k, v in m_a.items() if not k.startswith(("mismatch/", "step_time"))} == {
            k: v for k, v in m_b.items() if not k.startswith("step_time")
        }


def test_mismatch_by_hand_through_the_update(engine):
    # response_logprobs = old + 0.25: d = log pi_trainer - log pi_rollout = -0.25 on every token:
    # k3 = e^-0.25 - 1 + 0.25 = 0.0288008; max |d| = 0.25. Recomputed: exact; detached: the update's
    # own forward (the same weights, in train mode) agrees with the rows' old log-probs to ~1e-6.
    rows = _rows(seed=2, shift=-0.25)
    want = math.exp(-0.25) - 0.75
    assert want == pytest.approx(0.0288008, abs=1e-7)
    _, m = _grads(engine, rows, micro=4)  # several micro-batches
    assert m["mismatch/kl"] == pytest.approx(want, abs=1e-6)
    assert m["mismatch/max_abs_log_ratio"] == pytest.approx(0.25, abs=1e-6)
    _, m = _grads(engine, rows, detach_old=True)
    assert m["mismatch/kl"] == pytest.approx(want, abs=1e-5)
    assert m["mismatch/max_abs_log_ratio"] == pytest.approx(0.25, abs=1e-5)
    _, m = _grads(engine, rows, old_from_rollout=True)  # no trainer-side old log-prob: nothing to compare
    assert not any(k.startswith("mismatch/") for k in m)


@pytest.mark.parametrize(
    "loss, agg", [("ppo", "token-mean"), ("gspo", "seq-mean-token-mean"), ("reinforce", "token-mean")]
)
@pytest.mark.parametrize("detach", [False, True])
def test_tis_weighs_the_policy_gradient(engine, loss, agg, detach):
    """At ratio 1 (the update's first step) the gradient is linear in the token weights: pi_old /
    pi_behav = 1.5 everywhere gives 1.5 times the uncorrected gradient; a cap of 1.2 gives 1.2 times
    (every token capped); decoupled with the cap 1.2 drops every token (no gradient)."""
    rows = _rows(seed=3, shift=math.log(1.5))
    kw = dict(policy_loss=loss, loss_agg=agg, detach_old=detach, clip_low=0.2, clip_high=0.2)
    g_none, _ = _grads(engine, rows, **kw)
    g_tis, m = _grads(engine, rows, **kw, correction="tis", correction_cap=2.0)
    _scaled(g_tis, g_none, 1.5)
    assert m["mismatch/capped_frac"] == 0.0 and m["pg_is_weight_mean"] == pytest.approx(1.5, rel=1e-5)
    g_cap, m = _grads(engine, rows, **kw, correction="tis", correction_cap=1.2)
    _scaled(g_cap, g_none, 1.2)
    assert m["mismatch/capped_frac"] == pytest.approx(1.0)
    if not detach:  # decoupled needs its own proximal pass (recompute)
        g_drop, m = _grads(engine, rows, **kw, correction="decoupled", correction_cap=1.2)
        assert all(torch.count_nonzero(g) == 0 for g in g_drop.values())
        assert m["mismatch/capped_frac"] == pytest.approx(1.0)


def test_a_correction_without_both_logprobs_refuses(engine):
    rows = _rows(seed=4)
    with pytest.raises(
        ValueError, match=r"correction='tis' needs the trainer's old log-probs.*not the rollout's: False"
    ):
        _grads(engine, rows, correction="tis", old_from_rollout=True)
    bare = [{k: v for k, v in r.items() if k != "response_logprobs"} for r in rows]
    with pytest.raises(ValueError, match="response_logprobs in every row: False"):
        _grads(engine, bare, correction="decoupled")


def test_one_iteration_recompute_and_tis_on_the_hf_engine(tmp_path):
    """rollout (the hf engine samples and reports its log-probs) -> annotate (old log-probs
    recomputed by the trainer) -> grpo advantages -> the update with tis: it trains, and the update's
    metrics (what the train flow writes to the iteration's metrics.json and MLflow) carry mismatch/*."""
    from components.train.rl_session import RLSession

    init = tmp_path / "init"
    tiny_model().save_pretrained(init)
    tiny_tokenizer().save_pretrained(init)
    session = RLSession(init, session_config(old_logprobs="recompute", actor_lr=1e-2), tools=None)
    prompts = [[1, 5 + i, 9, 17 + 3 * i] for i in range(4)]
    gens = session.rollout_engine.generate(
        prompts, SamplingConfig(max_tokens=6, temperature=1.0, n=2), seeds=[0, 1, 2, 3]
    )
    rows = [
        {
            "traj_id": f"p{i}-{j}", "group_id": f"p{i}", "step": 0, "prompt_ids": p, "reward": float(j),
            "response_ids": g.token_ids, "response_logprobs": g.logprobs,
        }
        for i, (p, gs) in enumerate(zip(prompts, gens)) for j, g in enumerate(gs)
    ]  # fmt: skip
    rows = compute_advantages(session.annotate(rows), estimator="grpo", gamma=1.0, lam=1.0)
    before = {k: v.clone() for k, v in session.actor.module.state_dict().items()}
    actor = ActorSettings(
        policy_loss="ppo", loss_agg="token-mean", clip_low=0.2, clip_high=0.2, clip_ratio_c=3.0, kl_coef=0.0,
        kl_kind="low_var_kl", entropy_coef=0.0, norm_const=6.0, temperature=1.0, epochs=1,
        mini_batch_size=len(rows), micro_batch_size=4, correction="tis", correction_cap=2.0,
    )  # fmt: skip
    metrics = session.update(rows, actor=actor, critic=None, seed=0)
    assert metrics["actor/skipped"] == 0.0
    assert any(not torch.equal(before[k], v) for k, v in session.actor.module.state_dict().items())
    # fp32 sampler and trainer: they agree to rounding (the hf engine's cached decode against one forward)
    assert 0.0 <= metrics["actor/mismatch/kl"] < 1e-6
    assert 0.0 <= metrics["actor/mismatch/max_abs_log_ratio"] < 1e-3
    assert metrics["actor/mismatch/capped_frac"] == 0.0
    assert metrics["actor/pg_is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    session.close()
