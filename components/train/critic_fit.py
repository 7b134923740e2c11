"""Fit a critic to the returns of a fixed policy's episodes, before RL starts from it.

A critic that starts with a zero value head needs tens of optimizer steps before its values depend on
the state (docs/tasks/sokoban.md); until then PPO's and StepPO's advantages are whitened returns
and their step-level credit is not exercised. VC-PPO pretrains the value model before PPO, verl and
Agent-R1 give the critic warm-up iterations with the actor frozen. Here the warm-up is paid once: the
SFT policy's episodes are rolled out once, the critic is fitted to their returns, and every
critic-based run starts from the fit.

Targets (:func:`value_targets`) are the discounted returns the runs' own estimators give with
lambda = 1 and a zero critic: per response token as ``gae`` reads them (PPO), at each step's last
prompt token as ``step_gae`` reads them (StepPO). One critic is fitted to both, so PPO and StepPO
runs share it: the loss is the mean of the per-token and the per-step squared errors.

:func:`fit_critic` first sets the value head to the least-squares fit of the targets on the SFT
backbone's features (:func:`probe_head`, a linear probe: a zero head needs tens of Adam steps just to
reach the scale of the returns), then takes random step rows per optimizer step (faster than whole
trajectories on sokoban: benchmarks/critic_fit.py) on every weight, measures the explained variance of
both kinds of values on the held-out trajectories every ``eval_every`` steps, stops after ``patience``
measurements without a new best of their mean, and leaves the best weights in the engine.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from components.device import model_device, to_device
from components.train.advantage import compute_advantages
from components.train.engine import train_step
from components.train.policy import (
    TokenBatch,
    critic_features,
    critic_step_and_token_values,
    make_token_batch,
    pad_rows,
)
from components.train.rl_update import trajectory_chunks


def value_targets(rows: Sequence[dict[str, Any]], gamma: float) -> list[dict[str, Any]]:
    """Rows + ``token_returns`` (per response token, as ``gae`` with lambda 1 gives them) and
    ``step_return`` (as ``step_gae`` with lambda 1 gives it): discounted returns of the rows' rewards.
    Rows need ``traj_id``, ``group_id``, ``step``, ``reward`` and ``response_ids``."""
    zero_tokens = [{**r, "values": [0.0] * len(r["response_ids"])} for r in rows]
    tokens = compute_advantages(zero_tokens, estimator="gae", gamma=gamma, lam=1.0)
    steps = compute_advantages(
        [{**r, "values": [0.0]} for r in rows], estimator="step_gae", gamma=gamma, lam=1.0
    )
    return [
        {**r, "token_returns": t["returns"], "step_return": s["returns"][0]}
        for r, t, s in zip(rows, tokens, steps)
    ]


def explained_variance(returns: Tensor, values: Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) (0 when the returns do not vary)."""
    var = returns.var()
    if returns.numel() < 2 or float(var) <= 0:
        return 0.0
    return float(1.0 - (returns - values).var() / var)


@dataclass
class _Rows:
    batch: TokenBatch
    token_returns: Tensor  # (B, L)
    step_returns: Tensor  # (B,)


def _tensors(rows: Sequence[dict[str, Any]], pad_id: int) -> _Rows:
    """Rows' tensors; prompts that share a prefix (a task's system prompt) forward it once."""
    prompts, responses = [r["prompt_ids"] for r in rows], [r["response_ids"] for r in rows]
    batch = make_token_batch(prompts, responses, pad_id, share_prefix=True)
    L = batch.response_ids.size(1)
    return _Rows(
        batch,
        pad_rows([r["token_returns"] for r in rows], L),
        torch.tensor([float(r["step_return"]) for r in rows]),
    )


@torch.no_grad()
def held_out_explained_variance(
    critic: torch.nn.Module, rows: Sequence[dict[str, Any]], *, pad_id: int, chunk: int = 64
) -> dict[str, float]:
    """``token`` and ``step`` explained variance of the critic on ``rows`` (with :func:`value_targets`)."""
    critic.eval()
    tok_r, tok_v, step_r, step_v = [], [], [], []
    for idx in trajectory_chunks(rows, chunk):
        t = _tensors([rows[i] for i in idx], pad_id)
        v_step, v_tok = critic_step_and_token_values(critic, t.batch)
        mask = t.batch.response_mask.bool()
        tok_r.append(t.token_returns[mask])
        tok_v.append(v_tok.cpu()[mask])
        step_r.append(t.step_returns)
        step_v.append(v_step.cpu())
    token = explained_variance(torch.cat(tok_r), torch.cat(tok_v))
    step = explained_variance(torch.cat(step_r), torch.cat(step_v))
    return {"token": token, "step": step, "mean": (token + step) / 2}


@torch.no_grad()
def probe_head(
    critic: torch.nn.Module, rows: Sequence[dict[str, Any]], *, pad_id: int, ridge: float = 1e-3
) -> None:
    """Set the value head (weight and bias) to the least-squares fit of the rows' targets on the
    backbone's features as they are (a linear probe), weighting the per-token and the per-step targets
    as the fit's loss does, with a ridge penalty ``ridge`` on the weights. A zero head moves by about
    the learning rate per Adam step and needs tens of steps to reach returns of several units; the
    probe starts the gradient fit where a linear read-out of the SFT model's features already explains
    what it can."""
    critic.eval()
    feats_tok, feats_step, y_tok, y_step = [], [], [], []
    for idx in trajectory_chunks(rows, 64):
        t = _tensors([rows[i] for i in idx], pad_id)
        h_step, h_tok = critic_features(critic, t.batch)
        mask = t.batch.response_mask.bool()
        feats_tok.append(h_tok.cpu()[mask])
        y_tok.append(t.token_returns[mask])
        feats_step.append(h_step.cpu())
        y_step.append(t.step_returns)
    x_tok, x_step = torch.cat(feats_tok).double(), torch.cat(feats_step).double()
    y = torch.cat([torch.cat(y_tok), torch.cat(y_step)]).double()
    x = torch.cat([x_tok, x_step])
    x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)  # the bias
    w = torch.cat(
        [torch.full((len(x_tok),), 0.5 / len(x_tok)), torch.full((len(x_step),), 0.5 / len(x_step))]
    )
    xw = x * w.double().unsqueeze(1)
    penalty = ridge * torch.eye(x.size(1), dtype=x.dtype)
    penalty[-1, -1] = 0.0  # the bias is not penalised
    coef = torch.linalg.solve(xw.T @ x + penalty, xw.T @ y)
    head = critic.score
    head.weight.copy_(coef[:-1].to(head.weight.dtype).view_as(head.weight))
    head.bias.copy_(coef[-1:].to(head.bias.dtype))


@dataclass(frozen=True)
class FitSettings:
    batch_size: int  # step rows per optimizer step
    micro_batch_size: int  # step rows per forward pass
    max_steps: int
    eval_every: int
    patience: int  # measurements without a new best before stopping
    seed: int


@dataclass
class FitResult:
    best_step: int
    best: dict[str, float]  # held-out explained variance at best_step
    history: list[dict[str, float]] = field(default_factory=list)  # step, loss, token, step_ev, mean


def fit_critic(
    engine: Any,
    train_rows: Sequence[dict[str, Any]],
    held_rows: Sequence[dict[str, Any]],
    settings: FitSettings,
    *,
    pad_id: int,
    progress: Callable[[dict[str, float]], None] | None = None,
) -> FitResult:
    """Fit ``engine`` (a DeepSpeed engine over a critic) to the :func:`value_targets` of ``train_rows``
    until the held-out explained variance stops rising; the engine's module ends with the best weights.
    ``progress`` is called with each measurement."""
    s, rng = settings, random.Random(settings.seed)
    critic = engine.module

    def measure(step: int, loss: float) -> dict[str, float]:
        ev = held_out_explained_variance(critic, held_rows, pad_id=pad_id)
        point = {
            "step": float(step),
            "loss": loss,
            "ev_token": ev["token"],
            "ev_step": ev["step"],
            "ev": ev["mean"],
        }
        if progress is not None:
            progress(point)
        return point

    def loss_fn(eng: Any, m: _Rows) -> tuple[Tensor, dict[str, Tensor]]:
        m = to_device(m, model_device(eng.module))
        v_step, v_tok = critic_step_and_token_values(eng.module, m.batch)
        mask = m.batch.response_mask
        token_mse = (((v_tok - m.token_returns) ** 2) * mask).sum() / counts["tokens"]
        step_mse = ((v_step - m.step_returns) ** 2).sum() / counts["rows"]
        loss = 0.5 * (token_mse + step_mse)
        return loss, {"token_mse": token_mse.detach(), "step_mse": step_mse.detach()}

    probe_head(critic, train_rows, pad_id=pad_id)  # (a zero head explains nothing: no need to measure it)
    first = measure(0, float("nan"))
    result = FitResult(0, first, [first])
    best_state = copy.deepcopy(critic.state_dict())
    since_best = 0
    losses: list[float] = []
    for step in range(1, s.max_steps + 1):
        idx = rng.sample(range(len(train_rows)), min(s.batch_size, len(train_rows)))
        micro = [
            _tensors([train_rows[i] for i in idx[j : j + s.micro_batch_size]], pad_id)
            for j in range(0, len(idx), s.micro_batch_size)
        ]
        counts = {
            "tokens": max(float(sum(m.batch.response_mask.sum() for m in micro)), 1.0),
            "rows": float(len(idx)),
        }
        losses.append(train_step(engine, micro, loss_fn)["loss"])
        if step % s.eval_every and step != s.max_steps:
            continue
        point = measure(step, sum(losses) / len(losses))
        losses = []
        result.history.append(point)
        if point["ev"] > result.best["ev"]:
            result.best_step, result.best = step, point
            best_state = copy.deepcopy(critic.state_dict())
            since_best = 0
        else:
            since_best += 1
            if since_best >= s.patience:
                break
    critic.load_state_dict(best_state)
    return result
