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
    value_head,
    value_targets,
)
from components.train.engine import build_engine, train_step
from components.train.optimizer_state import ADAM_MOMENTS, adam_moments, carry_adam_moments
from components.train.policy import critic_features, critic_step_and_token_values, make_token_batch, pad_rows


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


@pytest.mark.parametrize("level", [0.1, 1 / 3, 0.97, 10.0, 100.0])
@pytest.mark.parametrize("n", [3, 7, 100, 1001])
def test_explained_variance_of_equal_returns_is_zero_at_every_magnitude(level: float, n: int):
    # float32 sums of equal returns do not give a variance of exactly 0 (0.97 seven times: ~2e-14);
    # divided into the residuals' variance that was a figure of -1e12 and below
    returns = torch.full((n,), level)
    assert explained_variance(returns, torch.linspace(0.0, 1.0, n)) == 0.0
    assert explained_variance(returns, returns) == 0.0


def test_explained_variance_agrees_with_the_batch_statistic():
    # the warm-up's figure and the runs' (components.stats, per trajectory with an interval) are one
    from components.stats import explained_variance_interval

    g = torch.Generator().manual_seed(0)
    returns = torch.randint(0, 2, (60,), generator=g).float() * 0.9
    values = returns * 0.5 + 0.3 * torch.rand(60, generator=g)
    groups = [slice(i, i + 6) for i in range(0, 60, 6)]
    batch = explained_variance_interval(
        [returns[s].tolist() for s in groups], [values[s].tolist() for s in groups], n_resamples=100
    )
    assert explained_variance(returns, values) == pytest.approx(batch.value, abs=1e-6)


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


def engine_maker(lr: float, **kw):
    """build_engine for fit_critic's make_engine: micro-batches of 8, fp32 ZeRO-0 unless ``kw`` says."""
    return lambda critic: build_engine(
        critic, micro_batch_size=8, **{**RL_ENGINE_KW, "dtype": "fp32", "lr": lr, **kw}
    )


def bare_critic(tmp_path):
    if not (tmp_path / "init").exists():
        tiny_model().save_pretrained(tmp_path / "init")
    return build_critic(tmp_path / "init")


def test_fit_learns_a_state_dependent_value(tmp_path):
    held, report = episodes(20, seed=1), episodes(20, seed=2)
    settings = FitSettings(batch_size=16, micro_batch_size=8, max_steps=60, eval_every=10, patience=3, seed=0)
    seen = []
    engine, result = fit_critic(
        bare_critic(tmp_path), engine_maker(1e-2), episodes(40, seed=0), held, report, settings,
        pad_id=0, progress=seen.append,
    )  # fmt: skip
    assert result.best["ev_token"] > 0.8 and result.best["ev_step"] > 0.8
    assert result.report["token"] > 0.8 and result.report["step"] > 0.8  # measured on rows that chose nothing
    assert [p["step"] for p in seen] == [h["step"] for h in result.history]  # every measurement reported
    # the engine ends with the best weights: measuring again gives the best measurement
    again = held_out_explained_variance(engine.module, held, pad_id=0)
    assert again["mean"] == pytest.approx(result.best["ev"], abs=1e-6)
    assert held_out_explained_variance(engine.module, report, pad_id=0) == pytest.approx(result.report)


@pytest.mark.parametrize(
    ("dtype", "zero_stage"), [("fp32", 0), ("bf16", 0), ("bf16", 1), ("bf16", 2), ("fp32", 2)]
)
def test_probe_survives_the_engines_first_step(tmp_path, dtype, zero_stage):
    """The linear probe is written into the bare critic before DeepSpeed builds its optimizer, so under
    bf16 (fp32 master weights) and ZeRO-1/2 (partitioned fp32 copies) the first optimizer step, at an lr
    of ~0, leaves the probe in the value head instead of copying the zero master head back over it."""
    made = {}

    def make(critic):
        made["probe"] = value_head(critic).weight.detach().float().clone()
        made["engine"] = engine_maker(1e-12, dtype=dtype, zero_stage=zero_stage)(critic)
        return made["engine"]

    def after_first_step(point):
        if point["step"] == 1:
            made["head"] = value_head(made["engine"].module).weight.detach().float().clone()

    settings = FitSettings(batch_size=8, micro_batch_size=8, max_steps=1, eval_every=1, patience=1, seed=0)
    rows = episodes(8, seed=0)
    fit_critic(
        bare_critic(tmp_path), make, rows[:8], rows[8:12], rows[12:], settings, pad_id=0,
        progress=after_first_step,
    )  # fmt: skip
    assert made["probe"].abs().max() > 1e-3  # the probe did write a head
    assert torch.allclose(made["head"], made["probe"], rtol=2e-2, atol=1e-3)


def test_probe_refuses_an_engine_and_a_head_it_cannot_fit(tmp_path):
    critic = bare_critic(tmp_path)
    with pytest.raises(TypeError, match="bare critic, before build_engine"):
        probe_head(engine_maker(1e-3)(critic), episodes(4, seed=0), pad_id=0)
    odd = bare_critic(tmp_path)
    odd.score = torch.nn.Linear(odd.score.in_features, 2)
    with pytest.raises(ValueError, match="one output; .* with 2 outputs"):
        probe_head(odd, episodes(4, seed=0), pad_id=0)
    odd.score = torch.nn.Sequential(torch.nn.Linear(odd.score.in_features, 1))
    with pytest.raises(ValueError, match="has Sequential"):
        probe_head(odd, episodes(4, seed=0), pad_id=0)


def test_probe_fits_a_head_without_a_bias(tmp_path):
    """A ``score`` head without a bias (as some architectures build it) gets the least-squares weights
    alone: the loss's gradient at the probe is -2 ridge w."""
    critic = bare_critic(tmp_path).double()
    critic.score = torch.nn.Linear(critic.score.in_features, 1, bias=False).double()
    rows, ridge = episodes(40, seed=0), 1e-3
    probe_head(critic, rows, pad_id=0, ridge=ridge)
    batch = make_token_batch([r["prompt_ids"] for r in rows], [r["response_ids"] for r in rows], 0)
    with torch.no_grad():
        h_step, h_tok = critic_features(critic, batch)
    mask = batch.response_mask.bool()
    r_tok = pad_rows([r["token_returns"] for r in rows], mask.size(1))[mask].double()
    r_step = torch.tensor([r["step_return"] for r in rows], dtype=torch.float64)
    v_tok, v_step = critic.score(h_tok.double()[mask]).squeeze(-1), critic.score(h_step.double()).squeeze(-1)
    (0.5 * (((v_tok - r_tok) ** 2).mean() + ((v_step - r_step) ** 2).mean())).backward()
    assert torch.allclose(critic.score.weight.grad, -2 * ridge * critic.score.weight.detach(), atol=1e-8)


def test_fit_refuses_an_empty_split(tmp_path):
    settings = FitSettings(batch_size=8, micro_batch_size=8, max_steps=1, eval_every=1, patience=1, seed=0)
    with pytest.raises(ValueError, match="the report split has no rows"):
        fit_critic(
            bare_critic(tmp_path), engine_maker(1e-3), episodes(4, 0), episodes(2, 1), [], settings, pad_id=0
        )


def test_run_critic_starts_with_the_warm_ups_adam_moments(tmp_path):
    """Adam moments saved beside a critic's weights are loaded into a new critic engine (fp32 ZeRO-0:
    a plain torch AdamW), by parameter name; under bf16 DeepSpeed's own optimizer holds them and the
    load says so instead; a warm-up that kept its probe (step 0) has no moments to carry."""
    warm = engine_maker(1e-2)(bare_critic(tmp_path))
    batch = make_token_batch([[1, 5, 9]], [[11, 12]], 0)
    train_step(
        warm,
        [batch],
        lambda eng, b: ((critic_step_and_token_values(eng.module, b)[0] - 1).square().sum(), {}),
    )
    saved = adam_moments(warm)
    assert saved is not None and saved["params"]
    assert any(m["exp_avg_sq"].abs().max() > 0 for m in saved["params"].values())
    torch.save(saved, tmp_path / ADAM_MOMENTS)
    run = engine_maker(1e-2)(bare_critic(tmp_path))
    assert adam_moments(run)["params"] == {}  # a fresh optimizer has no state
    assert carry_adam_moments(run, tmp_path / ADAM_MOMENTS).startswith("critic Adam moments carried")
    loaded = adam_moments(run)["params"]
    assert set(loaded) == set(saved["params"])
    for name, m in saved["params"].items():
        assert torch.equal(loaded[name]["exp_avg_sq"], m["exp_avg_sq"])
        assert torch.equal(loaded[name]["step"], m["step"])
    bf16 = engine_maker(1e-2, dtype="bf16", zero_stage=1)(bare_critic(tmp_path))
    line = carry_adam_moments(bf16, tmp_path / ADAM_MOMENTS)
    assert "NOT carried" in line and "BF16" in line.upper() and "starts fresh" in line
    assert "none saved" in carry_adam_moments(run, tmp_path / "missing.pt")
    torch.save({**saved, "params": {}}, tmp_path / "probe_only.pt")
    assert "before any Adam step" in carry_adam_moments(run, tmp_path / "probe_only.pt")


def test_fit_stops_after_patience_measurements_without_a_new_best(tmp_path):
    settings = FitSettings(batch_size=16, micro_batch_size=8, max_steps=500, eval_every=5, patience=2, seed=0)
    # returns independent of the state: nothing to explain on held-out data
    _, result = fit_critic(
        bare_critic(tmp_path), engine_maker(1e-2), episodes(40, seed=0, signal=False),
        episodes(20, 1, signal=False), episodes(10, 2, signal=False), settings, pad_id=0,
    )  # fmt: skip
    steps = [int(h["step"]) for h in result.history]
    assert steps[-1] < 500  # stopped early
    after_best = [s for s in steps if s > result.best_step]
    assert len(after_best) == settings.patience
    assert steps == list(range(0, steps[-1] + 1, 5))
