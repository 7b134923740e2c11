"""Process rewards normalised apart from the outcome (PRIME's idea), and how they join an advantage.

A task may score each tool-call step (``AgentEnv.process_rewards``: p_t, e.g. 1 for a search that
found a passage the question needs). PRIME (Cui et al. 2025, arXiv 2502.01456) keeps such dense
rewards apart from the outcome reward: each is baselined on its own, and only then are they combined,
so neither scale swamps the other. docs/algorithms.md, "Process rewards", writes out the math:

- :func:`normalize_process_rewards`: p̂_t = (p_t - mean_P p) / (std_P p + 1e-6) over the set P of
  scored steps of a normalisation group (the prompt group for the group estimators, the whole batch
  for the others); unscored steps get p̂ = 0.
- :func:`process_return`: Σ_{t' >= t} γ^{t'-t} p̂_{t'} within each trajectory (the return-to-go that
  the group estimators add, times the weight w, to their outcome advantage).

Departure from PRIME: PRIME's process rewards are per token and baselined leave-one-out (RLOO) over
the other samples' mean; here they are per step (a tool call), normalised by mean and std over the
scored steps (GRPO style), with the singleton rule of the other group baselines (a lone scored step
keeps p̂ = p).
"""

from __future__ import annotations

import torch
from torch import Tensor

from components.algos.step_layout import StepLayout
from components.algos.tensor_ops import GROUP_STD_EPS, dense_ids, discounted_reverse_cumsum, group_center

__all__ = ["normalize_process_rewards", "process_return"]


def normalize_process_rewards(
    *,
    rewards: Tensor,  # (B,) p_t, any value where not scored
    scored: Tensor,  # (B,) bool, the steps that have a process reward
    group: Tensor,  # (B,) long, the normalisation group of each step
) -> Tensor:  # (B,) p̂_t, 0 where not scored
    """(p - mean) / (std + 1e-6) over the scored steps of each group (unbiased std; a group with one
    scored step: mean 0, std 1; a group of equal scores: 0); 0 on unscored steps."""
    out = torch.zeros_like(rewards)
    if not bool(scored.any()):
        return out
    ids, _ = dense_ids(group[scored].long())  # (K,)
    p = rewards[scored]  # (K,)
    centred, std, _ = group_center(p, ids)  # exactly 0 in a group of equal scores
    out[scored] = centred / (std + GROUP_STD_EPS)
    return out


def process_return(
    *,
    normalized: Tensor,  # (B,) p̂_t
    layout: StepLayout,
    gamma: float,
) -> Tensor:  # (B,) Σ_{t'>=t} γ^{t'-t} p̂_{t'} within the trajectory
    grid = layout.to_grid(normalized)  # (N, T), 0 past the last step
    return layout.from_grid(discounted_reverse_cumsum(grid, gamma))
