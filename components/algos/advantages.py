"""Advantage estimators of docs/algorithms.md, one signature, looked up by name.

Every estimator is called the same way (keyword-only, see ``AdvantageEstimator.__call__``) on a batch
of step rows in any order, and returns ``AdvantageOutput``: ``advantages`` and ``returns`` (B, L),
zero outside ``response_mask``, and ``step_returns`` (B,) where a per-step return exists.
``AdvantageEstimator.critic`` says which critic the estimator needs ("token", "step" or None), so the
trainer never branches on names. Estimators run without gradient.

``rewards`` is (B,) (the step's reward, which sits on its last response token) or (B, L) token
rewards (e.g. from ``kl.kl_reward``); step-level estimators use a row's token-reward sum.
``returns`` is the (unwhitened, un-baselined) return each estimator builds its advantage from: S_tau
for the trajectory-level ones, G_t for reinforce/gigpo, the token return for reinforce_pp, A + V for
gae and step_gae (the critic targets). ``norm_adv`` only acts where docs/algorithms.md says "whitened".

Does not: compute critic values, add KL penalties (see ``kl``), or mask tool/env tokens (they are
never in ``response_mask``: each row holds one LLM response).

Departures from the papers / docs/algorithms.md:
1. The singleton-group rule of grpo (mean 0, std 1) is used by every group baseline: dr_grpo, rloo,
   reinforce_pp_baseline and gigpo's episode term give A = S for a trajectory alone in its group, and
   gigpo's step term gives A_step = G_t for a step alone in its (group, observation) step group.
2. Episode ends use V = 0 whether the trajectory finished or was truncated (as docs/algorithms.md says).
3. Every row must have at least one response token (the reward of a step sits on its last token).
4. gigpo's step groups are GiGPO's anchor-state groups when the environment gives state keys
   (``AgentEnv.state_key``, the ``obs_key`` of a step row: see ``components.train.advantage``
   ``step_group_keys``). Without them the rows of a prompt group at the same step index form a step
   group, which is one anchor state only where equal turns mean equal states (e.g. the first turn).
   G_t is the paper's discounted step return sum_k gamma^k r_{t+k} (gamma = ``train.gamma``; the paper
   uses 0.95), normalised by the step group's std as in its main variant.
5. A group whose values are equal up to rounding (spread <= 1e-5 of their largest magnitude, see
   ``tensor_ops.group_center``) has a centred value of exactly 0 in every group baseline, so a group
   of equal returns gives A = 0 at any magnitude instead of an ulp divided by std + 1e-6.
6. Process rewards (``process_weight`` > 0; ``components.algos.process_rewards``) are normalised
   per step over the scored steps, not per token with PRIME's leave-one-out baseline; estimators
   without a prompt-group baseline normalise them over the batch and add them to the step reward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor

from components.algos.process_rewards import normalize_process_rewards, process_return
from components.algos.step_layout import StepLayout, build_layout, pack_tokens
from components.algos.tensor_ops import (
    GROUP_STD_EPS,
    dense_ids,
    discounted_reverse_cumsum,
    group_center,
    per_token,
    place_on_last_token,
    shift_left,
    whiten,
)
from components.registry import Registry

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageEstimator",
    "AdvantageOutput",
    "StepBatch",
    "get_advantage_estimator",
]

CriticKind = Literal["token", "step"] | None


@dataclass(frozen=True)
class AdvantageOutput:
    advantages: Tensor  # (B, L), 0 outside response_mask
    returns: Tensor  # (B, L), 0 outside response_mask
    step_returns: Tensor | None  # (B,) per step row, None for token-level returns


@dataclass(frozen=True)
class StepBatch:
    """Validated estimator input (built once by ``AdvantageEstimator.__call__``)."""

    layout: StepLayout
    mask: Tensor  # (B, L) bool response mask
    step_rewards: Tensor  # (B,) r_t
    token_rewards: Tensor  # (B, L) rewards on tokens (r_t on the last response token)
    values: Tensor | None  # (B, L) token critic or (B,) step critic, as the estimator's `critic` says
    obs_index: Tensor | None  # (B,) observation id (gigpo)
    gamma: float
    lam: float
    norm_adv: bool
    step_weight: float
    step_norm: str  # gigpo: "std" ((G - mean) / std in the step group) or "mean" (G - mean)


@dataclass(frozen=True)
class AdvantageEstimator:
    name: str
    fn: Callable[[StepBatch], AdvantageOutput]  # the math, on a validated batch
    critic: CriticKind  # which critic values the estimator reads (None: no critic)
    needs_groups: bool  # baseline from other trajectories of the same prompt (wants n >= 2 per prompt)
    needs_obs_index: bool  # step groups by observation (gigpo)

    def __call__(
        self,
        *,
        rewards: Tensor,  # (B,) step rewards or (B, L) token rewards
        response_mask: Tensor,  # (B, L) 1 on response tokens
        traj_index: Tensor,  # (B,) long
        step_index: Tensor,  # (B,) long, 0-based
        group_index: Tensor,  # (B,) long, prompt group
        values: Tensor | None = None,  # (B, L) if critic == "token", (B,) if critic == "step"
        obs_index: Tensor | None = None,  # (B,) long, gigpo only
        gamma: float = 1.0,
        lam: float = 1.0,
        norm_adv: bool = True,
        step_weight: float = 1.0,  # gigpo's w
        step_norm: str = "std",  # gigpo's step-group normalisation: "std" or "mean"
        process_rewards: Tensor | None = None,  # (B,) p_t, the task's score of each step's tool calls
        process_mask: Tensor | None = None,  # (B,) bool, steps with a process reward (None: all)
        process_weight: float = 0.0,  # w_p; 0 = outcome only (process_rewards are then ignored)
    ) -> AdvantageOutput:
        if step_norm not in ("std", "mean"):
            raise ValueError(f"step_norm={step_norm!r}: expected 'std' or 'mean'")
        batch = self._prepare(
            rewards=rewards, response_mask=response_mask, traj_index=traj_index, step_index=step_index,
            group_index=group_index, values=values, obs_index=obs_index, gamma=gamma, lam=lam,
            norm_adv=norm_adv, step_weight=step_weight, step_norm=step_norm,
        )  # fmt: skip
        with torch.no_grad():
            if process_weight == 0 or process_rewards is None:
                return self.fn(batch)
            return self._with_process(batch, process_rewards, process_mask, float(process_weight))

    def _with_process(
        self, b: StepBatch, process_rewards: Tensor, process_mask: Tensor | None, weight: float
    ) -> AdvantageOutput:
        """docs/algorithms.md, "Process rewards": p normalised over the scored steps of each prompt
        group (group estimators) or of the batch (the others); then the group estimators add
        w * sum_{t'>=t} gamma^(t'-t) p̂_t' to their outcome advantage, and the others take w * p̂_t as
        part of the step reward r_t (so a critic learns it too)."""
        n = b.mask.shape[0]
        if not torch.isfinite(torch.tensor(weight)):
            raise ValueError(f"process_weight must be finite, got {weight}")
        if tuple(process_rewards.shape) != (n,):
            raise ValueError(f"process_rewards must have shape ({n},), got {tuple(process_rewards.shape)}")
        dtype = b.step_rewards.dtype
        scored = (
            torch.ones(n, dtype=torch.bool, device=b.mask.device)
            if process_mask is None
            else process_mask.to(torch.bool)
        )
        if tuple(scored.shape) != (n,):
            raise ValueError(f"process_mask must have shape ({n},), got {tuple(scored.shape)}")
        raw = process_rewards.detach().to(dtype)
        p = torch.where(scored, raw, raw.new_zeros(()))  # (B,)
        _check_finite("process_rewards", p)
        group = b.layout.traj_group[b.layout.traj] if self.needs_groups else torch.zeros_like(b.layout.traj)
        p_hat = normalize_process_rewards(rewards=p, scored=scored, group=group)  # (B,)
        if self.needs_groups:
            out = self.fn(b)
            proc = process_return(normalized=p_hat, layout=b.layout, gamma=b.gamma)  # (B,)
            return AdvantageOutput(
                out.advantages + weight * per_token(proc, b.mask), out.returns, out.step_returns
            )
        shaped = replace(
            b,
            step_rewards=b.step_rewards + weight * p_hat,
            token_rewards=b.token_rewards + place_on_last_token(weight * p_hat, b.mask),
        )
        return self.fn(shaped)

    def _prepare(
        self, *, rewards: Tensor, response_mask: Tensor, traj_index: Tensor, step_index: Tensor,
        group_index: Tensor, values: Tensor | None, obs_index: Tensor | None, gamma: float, lam: float,
        norm_adv: bool, step_weight: float, step_norm: str = "std",
    ) -> StepBatch:  # fmt: skip
        layout = build_layout(traj_index=traj_index, step_index=step_index, group_index=group_index)
        n = traj_index.shape[0]
        mask = _check_mask(response_mask, n)
        dtype = torch.promote_types(rewards.dtype, torch.float32)
        rewards = rewards.detach().to(dtype)
        if rewards.shape == (n,):
            step_r, token_r = rewards, place_on_last_token(rewards, mask)
        elif rewards.shape == mask.shape:
            token_r = torch.where(mask, rewards, torch.zeros((), dtype=dtype, device=rewards.device))
            step_r = token_r.sum(1)
        else:
            raise ValueError(
                f"rewards must have shape ({n},) or {tuple(mask.shape)}, got {tuple(rewards.shape)}"
            )
        _check_finite("rewards", token_r if rewards.dim() == 2 else rewards)  # (padding ignored)

        if self.critic is not None:
            want = tuple(mask.shape) if self.critic == "token" else (n,)
            what = "per-token critic values" if self.critic == "token" else "per-step critic values"
            if values is None:
                raise ValueError(f"{self.name} needs values: {what} of shape {want}")
            if tuple(values.shape) != want:
                raise ValueError(
                    f"{self.name} needs values of shape {want} ({what}), got {tuple(values.shape)}"
                )
            values = values.detach().to(dtype)
            _check_finite("values", torch.where(mask, values, 0) if self.critic == "token" else values)
            if self.critic == "token":
                values = torch.where(mask, values, torch.zeros((), dtype=dtype, device=values.device))
        else:
            values = None
        if self.needs_obs_index:
            if obs_index is None:
                raise ValueError(f"{self.name} needs obs_index (B,): the id of each step's observation")
            if tuple(obs_index.shape) != (n,) or obs_index.dtype.is_floating_point:
                raise ValueError(
                    f"obs_index must be an integer tensor of shape ({n},), "
                    f"got {obs_index.dtype} {tuple(obs_index.shape)}"
                )
        for name, x in (("gamma", gamma), ("lam", lam)):
            if not 0.0 <= float(x) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {x}")
        if not torch.isfinite(torch.tensor(float(step_weight))):
            raise ValueError(f"step_weight must be finite, got {step_weight}")
        return StepBatch(
            layout=layout, mask=mask, step_rewards=step_r, token_rewards=token_r, values=values,
            obs_index=obs_index if self.needs_obs_index else None, gamma=float(gamma), lam=float(lam),
            norm_adv=bool(norm_adv), step_weight=float(step_weight), step_norm=step_norm,
        )  # fmt: skip


def _check_mask(response_mask: Tensor, n: int) -> Tensor:
    if not isinstance(response_mask, Tensor):
        raise TypeError(f"response_mask must be a torch.Tensor, got {type(response_mask).__name__}")
    if response_mask.dim() != 2 or response_mask.shape[0] != n:
        raise ValueError(f"response_mask must have shape ({n}, L), got {tuple(response_mask.shape)}")
    bad = ((response_mask != 0) & (response_mask != 1)).nonzero()
    if bad.numel():
        r, c = int(bad[0, 0]), int(bad[0, 1])
        raise ValueError(f"response_mask must be 0/1; row {r} column {c} is {response_mask[r, c].item()}")
    mask = response_mask.bool()
    empty = (~mask.any(1)).nonzero()
    if empty.numel():
        row = int(empty[0, 0])
        raise ValueError(f"response_mask row {row} has no response tokens (every step needs one)")
    return mask


def _check_finite(name: str, x: Tensor) -> None:
    bad = (~torch.isfinite(x)).nonzero()
    if bad.numel():
        idx = bad[0].tolist()
        where = f"row {idx[0]}" + (f" column {idx[1]}" if len(idx) > 1 else "")
        raise ValueError(f"{name} must be finite; {where} is {x[tuple(idx)].item()}")


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")


def _estimator(
    name: str, *, critic: CriticKind = None, needs_groups: bool = False, needs_obs_index: bool = False
) -> Callable[[Callable[[StepBatch], AdvantageOutput]], AdvantageEstimator]:
    def register(fn: Callable[[StepBatch], AdvantageOutput]) -> AdvantageEstimator:
        est = AdvantageEstimator(name, fn, critic, needs_groups, needs_obs_index)
        return ADVANTAGE_ESTIMATORS.register(name, est)

    return register


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as ``name``; unknown names raise UnknownNameError listing the known ones."""
    return ADVANTAGE_ESTIMATORS.get(name)


# ---- trajectory-level helpers -------------------------------------------------------------------


def _episode_scores(b: StepBatch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """S_tau (N,), S_tau - mean_g S (exactly 0 in a group of equal scores), std_g S and group size
    (N,) each (singleton: mean 0, std 1)."""
    S = b.step_rewards.new_zeros(b.layout.num_traj).index_add_(0, b.layout.traj, b.step_rewards)  # (N,)
    centred, std, n = group_center(S, b.layout.traj_group)
    return S, centred, std, n


def _trajectory_output(b: StepBatch, adv_traj: Tensor, S: Tensor) -> AdvantageOutput:
    """Broadcast per-trajectory advantages (N,) and returns S (N,) to every token of every step."""
    adv_row, ret_row = adv_traj[b.layout.traj], S[b.layout.traj]  # (B,)
    return AdvantageOutput(per_token(adv_row, b.mask), per_token(ret_row, b.mask), ret_row)


def _discounted_step_returns(b: StepBatch) -> Tensor:
    """G_t = r_t + gamma * G_{t+1} within each trajectory, (B,)."""
    G = discounted_reverse_cumsum(b.layout.to_grid(b.step_rewards), b.gamma)  # (N, T)
    return b.layout.from_grid(G)


# ---- estimators ---------------------------------------------------------------------------------


@_estimator("grpo", needs_groups=True)
def grpo(b: StepBatch) -> AdvantageOutput:
    """A_tau = (S_tau - mean_g S) / (std_g S + 1e-6), on every token of every step."""
    S, centred, std, _ = _episode_scores(b)
    return _trajectory_output(b, centred / (std + GROUP_STD_EPS), S)


@_estimator("dr_grpo", needs_groups=True)
def dr_grpo(b: StepBatch) -> AdvantageOutput:
    """A_tau = S_tau - mean_g S (no std division)."""
    S, centred, _, _ = _episode_scores(b)
    return _trajectory_output(b, centred, S)


@_estimator("rloo", needs_groups=True)
def rloo(b: StepBatch) -> AdvantageOutput:
    """A_tau = n/(n-1) (S_tau - mean_g S) = S_tau - mean of the other n-1 trajectories."""
    S, centred, _, n = _episode_scores(b)
    return _trajectory_output(b, n / (n - 1).clamp(min=1) * centred, S)


@_estimator("reinforce")
def reinforce(b: StepBatch) -> AdvantageOutput:
    """G_t = r_t + gamma G_{t+1}; A_t = G_t whitened over all step rows."""
    G = _discounted_step_returns(b)  # (B,)
    A = whiten(G, torch.ones_like(b.mask[:, 0])) if b.norm_adv else G
    return AdvantageOutput(per_token(A, b.mask), per_token(G, b.mask), G)


@_estimator("reinforce_pp")
def reinforce_pp(b: StepBatch) -> AdvantageOutput:
    """REINFORCE++: discounted token return inside each step row, whitened over all response tokens."""
    n = b.mask.shape[0]
    rows = torch.arange(n, device=b.mask.device)
    packed = pack_tokens(b.mask, row_segment=rows, row_order=rows, num_seg=n)
    G = packed.from_grid(discounted_reverse_cumsum(packed.to_grid(b.token_rewards), b.gamma), b.mask.shape)
    A = whiten(G, b.mask) if b.norm_adv else G  # (B, L)
    return AdvantageOutput(A, G, None)


@_estimator("reinforce_pp_baseline", needs_groups=True)
def reinforce_pp_baseline(b: StepBatch) -> AdvantageOutput:
    """A = whiten over response tokens of (S_tau - mean_g S)."""
    S, centred, _, _ = _episode_scores(b)
    out = _trajectory_output(b, centred, S)
    A = whiten(out.advantages, b.mask) if b.norm_adv else out.advantages
    return AdvantageOutput(A, out.returns, out.step_returns)


@_estimator("gae", critic="token")
def gae(b: StepBatch) -> AdvantageOutput:
    """PPO's GAE over the response tokens of a trajectory, chained across its steps.

    Tokens of all steps are laid end to end, so the next value of a step's last token is the value of
    the next step's first response token, and 0 after the final step:
    delta_j = r_j + gamma V_{j+1} - V_j;  A_j = delta_j + gamma lam A_{j+1};  R_j = A_j + V_j."""
    L = b.layout
    packed = pack_tokens(b.mask, row_segment=L.traj, row_order=L.order, num_seg=L.num_traj)
    r, v = packed.to_grid(b.token_rewards), packed.to_grid(b.values)  # (N, P), zero-padded
    delta = r + b.gamma * shift_left(v) - v  # (N, P)
    A = packed.from_grid(discounted_reverse_cumsum(delta, b.gamma * b.lam), b.mask.shape)  # (B, L)
    R = A + b.values  # (B, L), 0 outside the mask (values were masked)
    return AdvantageOutput(whiten(A, b.mask) if b.norm_adv else A, R, None)


@_estimator("step_gae", critic="step")
def step_gae(b: StepBatch) -> AdvantageOutput:
    """StepPO: GAE over agent steps, V_t = critic value at the last prompt token of step t, V_T = 0:
    delta_t = r_t + gamma V_{t+1} - V_t;  A_t = delta_t + gamma lam A_{t+1};  R_t = A_t + V_t."""
    L = b.layout
    r, v = L.to_grid(b.step_rewards), L.to_grid(b.values)  # (N, T), 0 past the last step
    delta = r + b.gamma * shift_left(v) - v  # (N, T)
    A = L.from_grid(discounted_reverse_cumsum(delta, b.gamma * b.lam))  # (B,)
    R = A + b.values  # (B,)
    if b.norm_adv:
        A = whiten(A, torch.ones_like(A, dtype=torch.bool))
    return AdvantageOutput(per_token(A, b.mask), per_token(R, b.mask), R)


@_estimator("gigpo", needs_groups=True, needs_obs_index=True)
def gigpo(b: StepBatch) -> AdvantageOutput:
    """GiGPO: A = A_episode (grpo formula) + w * A_step, where A_step normalises the discounted step
    return G_t within the step group of rows sharing (prompt group, observation).

    ``obs_index`` ids are paired with the prompt group here, so the same id in two prompt groups never
    joins their steps; rows of one prompt group with equal ids form one step group whatever their
    trajectory or step index (a state revisited within a trajectory included)."""
    _, centred, std, _ = _episode_scores(b)
    a_episode = (centred / (std + GROUP_STD_EPS))[b.layout.traj]  # (B,)
    G = _discounted_step_returns(b)  # (B,)
    step_group, _ = dense_ids(b.layout.traj_group[b.layout.traj], b.obs_index.long())  # (B,)
    g_centred, g_std, _ = group_center(G, step_group)  # 0 in a step group of equal returns
    a_step = g_centred if b.step_norm == "mean" else g_centred / (g_std + GROUP_STD_EPS)  # (B,)
    A = a_episode + b.step_weight * a_step  # (B,)
    return AdvantageOutput(per_token(A, b.mask), per_token(G, b.mask), G)
