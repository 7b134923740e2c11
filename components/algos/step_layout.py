"""Where each step row and each response token sits in its trajectory.

A batch has one row per agent step, in any order, identified by ``traj_index``, ``step_index``
(0-based) and ``group_index`` (B,). ``build_layout`` checks them (unique (trajectory, step) pairs,
steps 0..T-1 without gaps, one group per trajectory) and gives dense ids plus two scatter/gather
views used by the estimators:

* step grid (N trajectories, T steps): ``to_grid`` / ``from_grid``; missing steps are 0.
* packed tokens (segments x positions): the valid response tokens of each trajectory (or row)
  laid end to end in (step, column) order, zero-padded at the end: ``pack_tokens``.

Does not: compute advantages or look at rewards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["StepLayout", "TokenPacking", "build_layout", "pack_tokens"]


@dataclass(frozen=True)
class StepLayout:
    traj: Tensor  # (B,) dense trajectory id in [0, num_traj)
    step: Tensor  # (B,) 0-based step within the trajectory
    traj_group: Tensor  # (N,) dense group id of each trajectory
    order: Tensor  # (B,) row ids sorted by (trajectory, step)
    num_traj: int  # N
    max_steps: int  # T

    def to_grid(self, x: Tensor) -> Tensor:
        """(B,) per-row values -> (N, T) step grid; a trajectory's steps past its end are 0."""
        grid = x.new_zeros(self.num_traj, self.max_steps)
        grid[self.traj, self.step] = x
        return grid

    def from_grid(self, grid: Tensor) -> Tensor:
        """(N, T) step grid -> (B,) per-row values."""
        return grid[self.traj, self.step]


@dataclass(frozen=True)
class TokenPacking:
    rows: Tensor  # (K,) row of each valid token
    cols: Tensor  # (K,) column of each valid token
    seg: Tensor  # (K,) segment (trajectory or row) of each valid token
    pos: Tensor  # (K,) position of the token within its segment, in (step, column) order
    num_seg: int  # S
    width: int  # P = most valid tokens in one segment

    def to_grid(self, x: Tensor) -> Tensor:
        """(B, L) token values -> (S, P), each segment's tokens end to end, zero-padded at the end."""
        grid = x.new_zeros(self.num_seg, self.width)
        grid[self.seg, self.pos] = x[self.rows, self.cols]
        return grid

    def from_grid(self, grid: Tensor, shape: tuple[int, int]) -> Tensor:
        """(S, P) -> (B, L) token values, 0 outside the valid tokens."""
        out = grid.new_zeros(shape)
        out[self.rows, self.cols] = grid[self.seg, self.pos]
        return out


def pack_tokens(mask: Tensor, *, row_segment: Tensor, row_order: Tensor, num_seg: int) -> TokenPacking:
    """Lay the valid tokens of ``mask`` (B, L) end to end per segment.

    ``row_segment`` (B,) gives each row's segment; ``row_order`` (B,) must list the rows of one
    segment contiguously and in step order (``StepLayout.order`` for trajectories, ``arange(B)`` with
    ``row_segment = arange(B)`` for single rows)."""
    i, cols = mask.bool()[row_order].nonzero(as_tuple=True)  # row-major: (segment, step, column) order
    rows = row_order[i]  # (K,)
    seg = row_segment[rows]  # (K,)
    count = torch.bincount(seg, minlength=num_seg)  # (S,)
    start = torch.cumsum(count, 0) - count  # (S,) first packed index of each segment
    pos = torch.arange(seg.numel(), device=seg.device) - start[seg]  # (K,)
    width = int(count.max()) if count.numel() else 0
    return TokenPacking(rows=rows, cols=cols, seg=seg, pos=pos, num_seg=num_seg, width=width)


def _check_index(name: str, x: object, n: int | None) -> int:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 1:
        raise ValueError(f"{name} must have shape (B,), got {tuple(x.shape)}")
    if x.dtype.is_floating_point or x.dtype == torch.bool or x.dtype.is_complex:
        raise TypeError(f"{name} must be an integer tensor, got {x.dtype}")
    if n is not None and x.shape[0] != n:
        raise ValueError(f"{name} has {x.shape[0]} rows but traj_index has {n}")
    return int(x.shape[0])


def build_layout(*, traj_index: Tensor, step_index: Tensor, group_index: Tensor) -> StepLayout:
    """Validate the step indices of a batch and return its layout (rows may come in any order)."""
    n = _check_index("traj_index", traj_index, None)
    _check_index("step_index", step_index, n)
    _check_index("group_index", group_index, n)
    if n == 0:
        raise ValueError("empty batch: traj_index has no rows")
    traj_index, step_index, group_index = traj_index.long(), step_index.long(), group_index.long()
    if (step_index < 0).any():
        row = int((step_index < 0).nonzero()[0, 0])
        raise ValueError(f"step_index must be >= 0; row {row} has step_index={int(step_index[row])}")

    traj_ids, traj = torch.unique(traj_index, return_inverse=True)  # (N,), (B,)
    num_traj, max_steps = int(traj_ids.numel()), int(step_index.max()) + 1
    key = traj * max_steps + step_index  # (B,) unique per (trajectory, step)
    order = torch.argsort(key, stable=True)
    dup = (key[order][1:] == key[order][:-1]).nonzero()
    if dup.numel():
        a, b = int(order[dup[0, 0]]), int(order[dup[0, 0] + 1])
        raise ValueError(
            f"rows {a} and {b} are both step_index={int(step_index[a])} of traj_index={int(traj_index[a])}"
        )

    count = torch.bincount(traj, minlength=num_traj)  # (N,)
    last = torch.zeros(num_traj, dtype=torch.long, device=traj.device)
    last = last.scatter_reduce(0, traj, step_index, reduce="amax", include_self=False)  # (N,)
    gap = (count != last + 1).nonzero()
    if gap.numel():
        t = int(gap[0, 0])
        steps = sorted(step_index[traj == t].tolist())
        missing = sorted(set(range(steps[-1] + 1)) - set(steps))
        raise ValueError(
            f"traj_index={int(traj_ids[t])} has steps {steps}: step_index must run 0..T-1 "
            f"without gaps (missing {missing})"
        )

    _, group = torch.unique(group_index, return_inverse=True)  # (B,) dense group ids
    lo = torch.zeros(num_traj, dtype=torch.long, device=traj.device)
    g_min = lo.scatter_reduce(0, traj, group, reduce="amin", include_self=False)  # (N,)
    g_max = lo.scatter_reduce(0, traj, group, reduce="amax", include_self=False)  # (N,)
    split = (g_min != g_max).nonzero()
    if split.numel():
        t = int(split[0, 0])
        groups = sorted(set(group_index[traj == t].tolist()))
        raise ValueError(f"traj_index={int(traj_ids[t])} has rows in several groups: group_index {groups}")

    return StepLayout(
        traj=traj, step=step_index, traj_group=g_min, order=order, num_traj=num_traj, max_steps=max_steps
    )
