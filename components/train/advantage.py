"""From an iteration's scored step rows to the tensors an estimator reads, and back to per-row lists.

The estimator itself comes from the ``components.algos`` registry by name. This module only maps
string ids (trajectory, group) to integer indices, pads per-token lists into (B, L) tensors, and
unpads the results, so that ``batch.parquet`` holds exactly what the advantages were computed from.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from components.algos import get_advantage_estimator
from components.algos.kl import KLTerm, kl_reward
from components.train.policy import pad_rows


def _index(values: Sequence[Hashable]) -> torch.Tensor:
    ids: dict[Hashable, int] = {}
    return torch.tensor([ids.setdefault(v, len(ids)) for v in values], dtype=torch.long)


def step_group_keys(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """The step group of each row for estimators that group steps by state (``needs_obs_index``).

    GiGPO's anchor-state groups: the steps of one prompt group (``group_id``: every trajectory sampled
    from the same prompt) whose environment state key (``obs_key``) is equal form one group, whatever
    the trajectory or the step index (a state revisited within one trajectory joins the group again).
    A row with an empty or missing ``obs_key`` (an environment without state keys) falls back to its
    step index: the steps of a prompt group at the same turn form a group. Keys of different prompt
    groups never meet."""
    return [
        (str(r["group_id"]), "key", str(r["obs_key"]))
        if r.get("obs_key")
        else (str(r["group_id"]), "step", str(int(r["step"])))
        for r in rows
    ]


def process_score(row: dict[str, Any]) -> float | None:
    """A row's process reward, None when it has none (missing, null or NaN)."""
    value = row.get("process_reward")
    if value is None or math.isnan(float(value)):
        return None
    return float(value)


def anchor_group_stats(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """How much of a batch the step groups of :func:`step_group_keys` cover: ``anchor_groups`` (step
    groups with >= 2 steps), ``anchor_group_size`` (their mean size; 0 without any) and
    ``anchored_step_frac`` (the fraction of step rows in such a group)."""
    sizes: dict[tuple[str, str, str], int] = {}
    for k in step_group_keys(rows):
        sizes[k] = sizes.get(k, 0) + 1
    anchored = [n for n in sizes.values() if n >= 2]
    return {
        "anchor_groups": float(len(anchored)),
        "anchor_group_size": sum(anchored) / len(anchored) if anchored else 0.0,
        "anchored_step_frac": sum(anchored) / len(rows) if rows else 0.0,
    }


def compute_advantages(
    rows: Sequence[dict[str, Any]],
    *,
    estimator: str,
    gamma: float,
    lam: float,
    kl: KLTerm = KLTerm(),
    step_weight: float = 1.0,
    step_norm: str = "std",
    process_weight: float = 0.0,
) -> list[dict[str, Any]]:
    """Add ``advantages`` and ``returns`` (per-token lists; for step critics ``returns`` has one value)
    and ``token_rewards`` when the KL penalty is in the reward. Rows need ``traj_id``, ``group_id``,
    ``step``, ``reward``, ``response_ids``, ``obs_key`` (optional; estimators that group steps by
    state, see :func:`step_group_keys`), and ``values`` (critic estimators), ``old_logprobs`` and
    ``ref_logprobs`` (``kl.reward_coef`` > 0: the KL penalty in the reward). ``step_weight`` and ``step_norm``: gigpo's step-level weight w
    and its normalisation within a step group ("std" or "mean"). ``process_weight``: the weight of the
    rows' ``process_reward`` (null or missing = a step without one; docs/algorithms.md, "Process
    rewards"); 0 = outcome only, the column is then not read."""
    est = get_advantage_estimator(estimator)
    L = max(max(len(r["response_ids"]) for r in rows), 1)
    mask = pad_rows([[1.0] * len(r["response_ids"]) for r in rows], L)  # (B, L)
    rewards: torch.Tensor = torch.tensor([float(r["reward"]) for r in rows])  # (B,)
    if kl.reward_coef > 0:
        rewards = kl_reward(
            rewards=rewards,
            response_mask=mask,
            logp=pad_rows([r["old_logprobs"] for r in rows], L),
            ref_logp=pad_rows([r["ref_logprobs"] for r in rows], L),
            kind=kl.kind,
            coef=kl.reward_coef,
        )  # (B, L) token rewards
    values = None
    if est.critic == "token":
        values = pad_rows([r["values"] for r in rows], L)
    elif est.critic == "step":
        values = torch.tensor([float(r["values"][0]) for r in rows])
    obs_index = _index(step_group_keys(rows)) if est.needs_obs_index else None
    process: dict[str, Any] = {}
    if process_weight != 0:
        scores = [process_score(r) for r in rows]
        process = dict(
            process_rewards=torch.tensor([0.0 if p is None else p for p in scores]),  # (B,)
            process_mask=torch.tensor([p is not None for p in scores]),  # (B,)
            process_weight=process_weight,
        )
    out = est(
        rewards=rewards, response_mask=mask, traj_index=_index([r["traj_id"] for r in rows]),
        step_index=torch.tensor([int(r["step"]) for r in rows]), group_index=_index([r["group_id"] for r in rows]),
        values=values, obs_index=obs_index, gamma=gamma, lam=lam, step_weight=step_weight, step_norm=step_norm,
        **process,
    )  # fmt: skip
    result = []
    for i, r in enumerate(rows):
        n = len(r["response_ids"])
        new = dict(r)
        new["advantages"] = out.advantages[i, :n].tolist()
        if est.critic == "step" and out.step_returns is not None:
            new["returns"] = [float(out.step_returns[i])]
        else:
            new["returns"] = out.returns[i, :n].tolist()
        if rewards.dim() == 2:
            new["token_rewards"] = rewards[i, :n].tolist()
        result.append(new)
    return result
