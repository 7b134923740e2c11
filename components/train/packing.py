"""Sequences (and their shared prefixes) laid end to end in a few rows, with a mask that keeps them apart.

A right-padded (S, T) batch runs every linear layer on S x T positions; when one long sequence pads
a dozen short ones that is 2-3 times the real tokens (an RL micro-batch of the calc task forwarded
15,575 positions for 6,166 tokens). ``pack_rows`` instead lays *units* end to end: a unit is a
shared prefix followed by the own tokens of each sequence that reads it (``SharedPrefix``), or a
single sequence. Units are placed into rows of ``capacity`` tokens (first fit, longest first; a
longer unit gets a row of its own), so the model runs on about the real tokens. The mask lets a
token attend to the earlier tokens of its own sequence and of the prefix it reads, and nothing else;
``positions`` restart at 0 for each unit, so every token sees exactly the context and rotary
positions it has in a separate forward. Log-probs and gradients are those of separate forwards up to
float rounding (the summation order of the matmuls changes).

What it does not do: forward the model (``components.train.policy`` does, passing the mask as a 4-D
``attention_mask``, which transformers hands to the attention kernel as is). Attention inside a row
is computed densely and masked, so ``capacity`` bounds the wasted attention work per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# Tokens per packed row (a unit longer than this gets a row of its own). Dense masked attention over
# a row costs about 4 x layers x width x capacity FLOPs per token, against 2N for the linear layers:
# about 25% of them at 768 for the 25M-parameter model (hidden 512, 8 layers); the calc update's
# micro-batches (about 600 tokens each) then fit one row each, with no padding.
PACK_CAPACITY = 768


@dataclass
class PackedRows:
    ids: Tensor  # (R, C) the units' tokens end to end, right-padded
    positions: Tensor  # (R, C) each token's position in its own sequence
    mask: Tensor  # (R, 1, C, C) bool: query token a may attend to key token b
    where: (
        Tensor  # (S, T) flat index (row * C + column) of token t of sequence s (its last token past its end)
    )


def _first_fit(sizes: Sequence[int], capacity: int) -> list[list[int]]:
    """Unit indices per row: first fit, longest first; a row holds at most max(capacity, largest) tokens."""
    cap = max(capacity, max(sizes))
    rows: list[list[int]] = []
    free: list[int] = []
    for u in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        for r, room in enumerate(free):
            if sizes[u] <= room:
                rows[r].append(u)
                free[r] -= sizes[u]
                break
        else:
            rows.append([u])
            free.append(cap - sizes[u])
    return rows


def pack_rows(
    units: Sequence[tuple[Sequence[int], Sequence[tuple[int, Sequence[int]]]]],
    n_seqs: int,
    seq_len: int,
    pad_id: int,
    capacity: int = PACK_CAPACITY,
    device: torch.device | str = "cpu",
) -> PackedRows:
    """Rows of ``units``: each ``(prefix ids, [(sequence index, its own ids after the prefix), ...])``
    (an empty prefix for a sequence on its own). ``n_seqs`` x ``seq_len`` is the shape of ``where``
    (every sequence index in ``0..n_seqs-1`` must appear once, with at most ``seq_len`` tokens)."""
    sizes = [len(p) + sum(len(own) for _, own in members) for p, members in units]
    if not units or min(sizes) == 0:
        raise ValueError("pack_rows needs at least one unit, and no empty unit")
    layout = _first_fit(sizes, capacity)
    C = max(sum(sizes[u] for u in row) for row in layout)
    R = len(layout)
    ids = torch.full((R, C), pad_id, dtype=torch.long)
    positions = torch.zeros((R, C), dtype=torch.long)
    unit_of = torch.full((R, C), -1, dtype=torch.long)  # -1: padding
    seq_of = torch.full((R, C), -1, dtype=torch.long)  # -1: a prefix token (or padding)
    where = torch.full((n_seqs, seq_len), -1, dtype=torch.long)
    seen = [False] * n_seqs
    for r, row in enumerate(layout):
        col = 0
        for u in row:
            prefix, members = units[u]
            p = len(prefix)
            if p:
                ids[r, col : col + p] = torch.as_tensor(list(prefix), dtype=torch.long)
                positions[r, col : col + p] = torch.arange(p)
                unit_of[r, col : col + p] = u
            prefix_at = r * C + col + torch.arange(p)
            col += p
            for s, own in members:
                n = len(own)
                if seen[s] or p + n > seq_len or n == 0:
                    raise ValueError(f"sequence {s}: appears twice, is empty, or is longer than {seq_len}")
                seen[s] = True
                ids[r, col : col + n] = torch.as_tensor(list(own), dtype=torch.long)
                positions[r, col : col + n] = p + torch.arange(n)
                unit_of[r, col : col + n] = u
                seq_of[r, col : col + n] = s
                where[s, :p] = prefix_at
                where[s, p : p + n] = r * C + col + torch.arange(n)
                where[s, p + n :] = r * C + col + n - 1  # past its end: its last token (masked by callers)
                col += n
    if not all(seen):
        raise ValueError(f"sequences {[s for s in range(n_seqs) if not seen[s]]} are in no unit")
    real = unit_of >= 0
    # (R, C, C): same unit, not later, and the key is a prefix token or of the query's own sequence.
    same_unit = (unit_of.unsqueeze(2) == unit_of.unsqueeze(1)) & real.unsqueeze(2)
    causal = torch.ones(C, C, dtype=torch.bool).tril()
    own = (seq_of.unsqueeze(1) == -1) | (seq_of.unsqueeze(2) == seq_of.unsqueeze(1))
    mask = same_unit & causal & own
    mask |= torch.eye(C, dtype=torch.bool) & ~real.unsqueeze(2)  # padding attends to itself (no NaN rows)
    return PackedRows(ids.to(device), positions.to(device), mask.unsqueeze(1).to(device), where.to(device))
