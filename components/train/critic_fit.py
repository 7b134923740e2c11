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

:func:`fit_critic` first sets the bare critic's value head to the least-squares fit of the targets
on the SFT backbone's features (:func:`probe_head`, a linear probe: a zero head needs tens of Adam
steps just to reach the scale of the returns) and only then builds the engine (whose bf16 / ZeRO
master weights copy the probe), then takes random step rows per optimizer step (faster than whole
trajectories on sokoban: benchmarks/critic_fit.py) on every weight, measures the explained variance of
both kinds of values on the selection trajectories every ``eval_every`` steps, stops after
``patience`` measurements without a new best of their mean, leaves the best weights in the engine,
and measures them once on report trajectories that chose nothing (the unbiased figure). The Adam
moments at the best step come back with the result, for the runs to start from
(components/train/optimizer_state.py).
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
from components.stats import RETURNS_VARY_RTOL
from components.train.advantage import compute_advantages
from components.train.engine import train_step
from components.train.optimizer_state import adam_moments
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
    """1 - Var(returns - values) / Var(returns), in float64; 0 when the returns do not vary.

    Equal returns summed in floating point leave a variance at rounding level rather than exactly 0
    (0.97 seven times in float32: about 2e-14), over which any residual is a huge negative figure; so
    returns vary only where Var(R) > RETURNS_VARY_RTOL (1e-12) * mean(R^2), the rule of
    ``components.stats.explained_variance_interval``, which reports the same figure for a batch."""
    r = returns.detach().double().flatten()
    e = r - values.detach().double().flatten()
    if r.numel() < 2:
        return 0.0
    var_r = r.var()
    if not float(var_r) > RETURNS_VARY_RTOL * float((r * r).mean()):
        return 0.0
    return float(1.0 - e.var() / var_r)


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


def value_head(critic: torch.nn.Module) -> torch.nn.Linear:
    """The critic's value head as ``build_critic`` makes it: ``score`` (decoder LMs) or ``classifier``
    (encoder heads), a ``torch.nn.Linear`` to one output, with or without a bias; anything else is
    refused with a message naming what was found."""
    if hasattr(critic, "module") and hasattr(critic, "optimizer"):
        raise TypeError(
            "probe_head needs the bare critic, before build_engine: an engine's optimizer holds master "
            "weights (bf16, ZeRO) that its first step would copy back over the probe"
        )
    head = getattr(critic, "score", None) or getattr(critic, "classifier", None)
    if not isinstance(head, torch.nn.Linear) or head.out_features != 1:
        found = type(head).__name__ if head is not None else "no `score` or `classifier`"
        raise ValueError(
            f"probe_head needs a value head `score` or `classifier` that is a torch.nn.Linear with one "
            f"output; {type(critic).__name__} has {found}"
            + (f" with {head.out_features} outputs" if isinstance(head, torch.nn.Linear) else "")
        )
    return head


@torch.no_grad()
def probe_head(
    critic: torch.nn.Module, rows: Sequence[dict[str, Any]], *, pad_id: int, ridge: float = 1e-3
) -> None:
    """Set the value head (weight, and bias where it has one) of the BARE critic (before
    ``build_engine``: an engine's bf16 / ZeRO master weights would overwrite it at the first step) to
    the least-squares fit of the rows' targets on the backbone's features as they are (a linear
    probe), weighting the per-token and the per-step targets as the fit's loss does, with a ridge
    penalty ``ridge`` on the weights. A zero head moves by about the learning rate per Adam step and
    needs tens of steps to reach returns of several units; the probe starts the gradient fit where a
    linear read-out of the SFT model's features already explains what it can.

    Memory: only the sufficient statistics X^T X and X^T y (float64, (H+1)^2) are kept, summed over
    chunks of 64 trajectories, per token and per step; no token's features outlive its chunk."""
    head = value_head(critic)
    if not rows:
        raise ValueError("probe_head needs at least one row")
    critic.eval()
    bias = head.bias is not None
    d = head.in_features + bias
    stats = {
        k: [torch.zeros(d, d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64), 0]
        for k in ("tok", "step")
    }

    def add(kind: str, x: Tensor, y: Tensor) -> None:
        x = x.double()
        if bias:
            x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)
        xtx, xty, n = stats[kind]
        stats[kind] = [xtx + x.T @ x, xty + x.T @ y.double(), n + len(x)]

    for idx in trajectory_chunks(rows, 64):
        t = _tensors([rows[i] for i in idx], pad_id)
        h_step, h_tok = critic_features(critic, t.batch)
        mask = t.batch.response_mask.bool()
        add("tok", h_tok.cpu()[mask], t.token_returns[mask])
        add("step", h_step.cpu(), t.step_returns)
    penalty = ridge * torch.eye(d, dtype=torch.float64)
    if bias:
        penalty[-1, -1] = 0.0  # the bias is not penalised
    xtx = sum(0.5 * a / max(n, 1) for a, _, n in stats.values()) + penalty
    xty = sum(0.5 * b / max(n, 1) for _, b, n in stats.values())
    coef = torch.linalg.solve(xtx, xty)
    head.weight.copy_(coef[: head.in_features].to(head.weight.dtype).view_as(head.weight))
    if bias:
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
    best: dict[str, float]  # selection-split explained variance at best_step: the best of N, biased up
    report: dict[str, float] = field(default_factory=dict)  # report split at best_step: token, step, mean
    history: list[dict[str, float]] = field(default_factory=list)  # step, loss, token, step_ev, mean
    optimizer_state: dict[str, dict[str, Tensor]] | None = None  # Adam moments at best_step (adam_moments)


def fit_critic(
    critic: torch.nn.Module,
    make_engine: Callable[[torch.nn.Module], Any],
    train_rows: Sequence[dict[str, Any]],
    select_rows: Sequence[dict[str, Any]],
    report_rows: Sequence[dict[str, Any]],
    settings: FitSettings,
    *,
    pad_id: int,
    progress: Callable[[dict[str, float]], None] | None = None,
) -> tuple[Any, FitResult]:
    """Probe the bare ``critic``'s head on ``train_rows`` (:func:`probe_head`), wrap it with
    ``make_engine`` (a DeepSpeed engine: built after the probe, so its master weights start from it),
    and fit it to the :func:`value_targets` of ``train_rows`` until the explained variance on
    ``select_rows`` stops rising; the engine's module ends with the best weights. ``report_rows``
    (trajectories in neither other split) are measured once, at the chosen step: the unbiased figure
    (``best`` is the best of up to max_steps / eval_every measurements on the rows that chose it).
    ``progress`` is called with each measurement. Returns (engine, result)."""
    for name, part in (("train", train_rows), ("selection", select_rows), ("report", report_rows)):
        if not part:
            raise ValueError(f"fit_critic: the {name} split has no rows")
    s, rng = settings, random.Random(settings.seed)
    probe_head(critic, train_rows, pad_id=pad_id)  # (a zero head explains nothing: no need to measure it)
    engine = make_engine(critic)
    critic = engine.module

    def measure(step: int, loss: float) -> dict[str, float]:
        ev = held_out_explained_variance(critic, select_rows, pad_id=pad_id)
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

    first = measure(0, float("nan"))
    result = FitResult(0, first, history=[first], optimizer_state=adam_moments(engine))
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
            result.optimizer_state = adam_moments(engine)
            since_best = 0
        else:
            since_best += 1
            if since_best >= s.patience:
                break
    critic.load_state_dict(best_state)
    result.report = held_out_explained_variance(critic, report_rows, pad_id=pad_id)
    return engine, result
