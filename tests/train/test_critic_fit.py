"""The critic warm-up's fit (components/train/critic_fit.py): targets and explained variance by hand, a
fit that learns a state-dependent value, early stopping, and the best weights kept."""

from __future__ import annotations

import random

import pytest
import torch
from train_helpers import RL_ENGINE_KW, tiny_model

from components.train.critic import build_critic
from components.train.critic_fit import (
    FitSettings,
    explained_variance,
    fit_critic,
    held_out_explained_variance,
    probe_head,
    value_targets,
)
from components.train.engine import build_engine
from components.train.policy import critic_features, make_token_batch, pad_rows


def test_value_targets_by_hand():
    # one trajectory, step 0 responds with 2 tokens and earns 1, step 1 with 1 token and earns 2; gamma 0.5
    rows = [
        {
            "traj_id": "t",
            "group_id": "g",
            "step": 0,
            "reward": 1.0,
            "response_ids": [7, 8],
            "prompt_ids": [1],
        },
        {
            "traj_id": "t",
            "group_id": "g",
            "step": 1,
            "reward": 2.0,
            "response_ids": [9],
            "prompt_ids": [1, 7, 8, 4],
        },
    ]
    out = value_targets(rows, gamma=0.5)
    # per step (step_gae, lambda 1, zero values): G_1 = 2, G_0 = 1 + 0.5 * 2 = 2
    assert [r["step_return"] for r in out] == pytest.approx([2.0, 2.0])
    # per token (gae over the response tokens a, b | c, each step's reward on its last token, discounted
    # per token): c = 2, b = 1 + 0.5 * c = 2, a = 0 + 0.5 * b = 1
    assert out[0]["token_returns"] == pytest.approx([1.0, 2.0])
    assert out[1]["token_returns"] == pytest.approx([2.0])


def test_explained_variance_by_hand():
    r = torch.tensor([1.0, 2.0, 3.0])
    assert explained_variance(r, r) == pytest.approx(1.0)
    assert explained_variance(r, torch.zeros(3)) == pytest.approx(0.0)
    # residuals [-1, 0, 1] vary as much as the returns: nothing explained
    assert explained_variance(r, torch.full((3,), 2.0)) == pytest.approx(0.0)
    assert explained_variance(r, torch.tensor([1.5, 2.0, 2.5])) == pytest.approx(1 - 0.25)
    assert explained_variance(torch.ones(3), torch.zeros(3)) == 0.0  # returns that do not vary


def episodes(n: int, seed: int, signal: bool = True) -> list[dict]:
    """Two-step trajectories whose prompt holds token 5 or 6: with ``signal`` the final reward is 4 after
    a 5 and 0 after a 6 (the value depends on the state), else a coin flip independent of it."""
    rng = random.Random(seed)
    rows = []
    for t in range(n):
        cue = rng.choice([5, 6])
        win = (cue == 5) if signal else rng.random() < 0.5
        prompt = [1, cue, 9, 10]
        for step in range(2):
            response = [11, 12]
            rows.append(
                {
                    "traj_id": f"t{seed}-{t}",
                    "group_id": f"t{seed}-{t}",
                    "step": step,
                    "prompt_ids": list(prompt),
                    "response_ids": response,
                    "reward": 4.0 if (step == 1 and win) else 0.0,
                }
            )
            prompt = prompt + response + [13]
    return value_targets(rows, gamma=1.0)


def critic_engine(tmp_path, lr: float):
    tiny_model().save_pretrained(tmp_path / "init")
    kw = {**RL_ENGINE_KW, "lr": lr}
    return build_engine(build_critic(tmp_path / "init"), dtype="fp32", micro_batch_size=8, **kw)


def test_fit_learns_a_state_dependent_value(tmp_path):
    engine = critic_engine(tmp_path, lr=1e-2)
    held = episodes(20, seed=1)
    settings = FitSettings(batch_size=16, micro_batch_size=8, max_steps=60, eval_every=10, patience=3, seed=0)
    seen = []
    result = fit_critic(engine, episodes(40, seed=0), held, settings, pad_id=0, progress=seen.append)
    assert result.best["ev_token"] > 0.8 and result.best["ev_step"] > 0.8
    assert [p["step"] for p in seen] == [h["step"] for h in result.history]  # every measurement reported
    # the engine ends with the best weights: measuring again gives the best measurement
    again = held_out_explained_variance(engine.module, held, pad_id=0)
    assert again["mean"] == pytest.approx(result.best["ev"], abs=1e-6)


def test_probe_head_is_the_least_squares_read_out_of_the_features(tmp_path):
    """After probe_head the head minimises 0.5 (mean token error^2 + mean step error^2) + ridge |w|^2 on
    the rows: the loss's gradient is 0 for the bias and -2 ridge w for the weights. On held-out
    episodes it already explains most of a value that depends on a cue in the prompt."""
    tiny_model().save_pretrained(tmp_path / "init")
    critic = build_critic(tmp_path / "init").double()
    rows, ridge = episodes(40, seed=0), 1e-3
    probe_head(critic, rows, pad_id=0, ridge=ridge)
    batch = make_token_batch([r["prompt_ids"] for r in rows], [r["response_ids"] for r in rows], 0)
    with torch.no_grad():
        h_step, h_tok = critic_features(critic, batch)
    mask = batch.response_mask.bool()
    r_tok = pad_rows([r["token_returns"] for r in rows], mask.size(1))[mask].double()
    r_step = torch.tensor([r["step_return"] for r in rows], dtype=torch.float64)
    head = critic.score
    v_tok, v_step = head(h_tok.double()[mask]).squeeze(-1), head(h_step.double()).squeeze(-1)
    loss = 0.5 * (((v_tok - r_tok) ** 2).mean() + ((v_step - r_step) ** 2).mean())
    loss.backward()
    assert head.bias.grad.abs().max() < 1e-8
    assert torch.allclose(head.weight.grad, -2 * ridge * head.weight.detach(), atol=1e-8)
    ev = held_out_explained_variance(critic.float(), episodes(20, seed=1), pad_id=0)
    assert ev["step"] > 0.5 and ev["token"] > 0.5, ev


def test_fit_stops_after_patience_measurements_without_a_new_best(tmp_path):
    engine = critic_engine(tmp_path, lr=1e-2)
    settings = FitSettings(batch_size=16, micro_batch_size=8, max_steps=500, eval_every=5, patience=2, seed=0)
    # returns independent of the state: nothing to explain on held-out data
    result = fit_critic(
        engine, episodes(40, seed=0, signal=False), episodes(20, 1, signal=False), settings, pad_id=0
    )
    steps = [int(h["step"]) for h in result.history]
    assert steps[-1] < 500  # stopped early
    after_best = [s for s in steps if s > result.best_step]
    assert len(after_best) == settings.patience
    assert steps == list(range(0, steps[-1] + 1, 5))
