"""Token tensors of agent-step rows, and the per-token quantities the RL update needs from models.

A step row is (prompt_ids, response_ids): the exact ids the model saw and sampled. The model reads
prompt + response; the logit at position p predicts token p + 1, so response token j of a row whose
prompt has P tokens is scored at position P - 1 + j. The critic's value of a step (``step_gae``) is
read at the last prompt token, position P - 1; per-token values (``gae``) at the same positions as
the log-probs (the value of the state in which each response token is chosen).

Packing: the agent loop keeps exact token continuity, so step t's prompt + response is a prefix of
step t + 1's prompt. A causal model gives the same logits on a prefix whether or not more tokens
follow, so a row whose prompt + response is a prefix of another row's sequence needs no forward
pass of its own: it reads the longer sequence at the same positions. ``make_token_batch`` keeps one
sequence per chain (``input_ids`` has S <= B rows, ``row_seq`` maps row -> sequence), which cuts
the tokens a multi-turn batch forwards by about the number of turns.

Shared prompts (``share_prefix=True``): the samples of one prompt (a GRPO group) start with the same
prompt tokens, and every prompt of a task with the same system prompt and tool schema. The distinct
sequences are cut into groups that share a prefix (``shared_prefix_groups``: the split that
forwards the fewest tokens); each group's prefix is forwarded once and only the members' own tokens
after it. The log-prob and value passes lay prefixes and sequences end to end in a few rows with a
mask that keeps them apart (``components.train.packing``: no padding); SFT hands the prefix's
key/value cache to every member (``shared_prefix_hidden``). Gradients of the shared
prefix add up over the members, so log-probs and gradients are those of separate forwards up to
float rounding; a GRPO update of 8 samples of a ~100-token prompt with 64-token answers forwards
about half the tokens.

It does not decide what to train: losses live in ``components.algos``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from components.device import model_device, to_device
from components.train.packing import PACK_CAPACITY, PackedRows, pack_rows


@dataclass
class TokenBatch:
    input_ids: Tensor  # (S, T) the distinct sequences (prompt + response), right-padded
    attention_mask: Tensor  # (S, T)
    row_seq: Tensor  # (B,) the sequence row i reads
    response_ids: Tensor  # (B, L) right-padded with 0
    response_mask: Tensor  # (B, L) float, 1 on real response tokens
    response_pos: Tensor  # (B, L) position of the logit that scores response token j
    value_pos: Tensor  # (B,) last prompt token
    prefix: SharedPrefix | None = None  # set when the sequences are forwarded on shared prefixes
    packed: PackedRows | None = (
        None  # the forward's layout (``packed_rows``), built with the batch on the CPU
    )

    def to(self, device: torch.device | str) -> TokenBatch:
        return to_device(self, device)

    @property
    def forwarded_tokens(self) -> int:
        """Tokens a forward pass of this batch runs through the model (without padding)."""
        if self.prefix is None:
            return int(self.attention_mask.sum())
        return int(self.prefix.prefix_mask.sum() + self.prefix.suffix_mask.sum())


@dataclass
class SharedPrefix:
    """The sequences of a TokenBatch as G shared prefixes + S suffixes: sequence s is
    ``prefix_ids[group[s], :length[s]]`` followed by ``suffix_ids[s]`` (length[s] = 0: no prefix)."""

    prefix_ids: Tensor  # (G, P) right-padded
    prefix_mask: Tensor  # (G, P)
    group: Tensor  # (S,) the prefix of each sequence
    length: Tensor  # (S,) how many of its group's prefix tokens the sequence uses (its group's length)
    suffix_ids: Tensor  # (S, U) the rest of each sequence, right-padded
    suffix_mask: Tensor  # (S, U)

    def to(self, device: torch.device | str) -> SharedPrefix:
        return to_device(self, device)


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def shared_prefix_groups(seqs: Sequence[Sequence[int]], min_prefix: int = 8) -> list[tuple[list[int], int]]:
    """(members, shared prefix length) groups of ``seqs`` that together forward the fewest tokens.

    A group of two or more sequences forwards its common prefix once and each member's remaining
    tokens; a sequence on its own (prefix length 0) forwards all its tokens. Groups are runs of the
    sequences in sorted order (where long common prefixes are neighbours), chosen by dynamic
    programming. A prefix never covers a whole member (each keeps at least its last token), and
    prefixes shorter than ``min_prefix`` are not shared."""
    order = sorted(range(len(seqs)), key=lambda i: list(seqs[i]))
    n = len(order)
    neighbour = [_lcp(seqs[order[j]], seqs[order[j + 1]]) for j in range(n - 1)]
    best = [0.0] + [float("inf")] * n  # best[j]: cost of the first j sorted sequences
    cut: list[tuple[int, int]] = [(0, 0)] * (n + 1)
    for j in range(1, n + 1):
        length, plen = 0, None
        for i in range(j - 1, -1, -1):  # the group is order[i:j]
            length += len(seqs[order[i]])
            if i < j - 1:
                plen = neighbour[i] if plen is None else min(plen, neighbour[i])
            p = 0 if plen is None else min(plen, min(len(seqs[order[m]]) - 1 for m in range(i, j)))
            if p < min_prefix:
                p = 0
            if p == 0 and i < j - 1:
                break  # a group without a shared prefix is never better than singletons
            cost = best[i] + p + (length - p * (j - i))
            if cost < best[j]:
                best[j], cut[j] = cost, (i, p)
    groups, j = [], n
    while j > 0:
        i, p = cut[j]
        groups.append(([order[m] for m in range(i, j)], p))
        j = i
    return groups[::-1]


def _share_prefixes(seqs: list[list[int]], pad_id: int, min_prefix: int) -> SharedPrefix:
    groups = shared_prefix_groups(seqs, min_prefix)
    P = max(max((p for _, p in groups), default=0), 1)
    prefix_ids = torch.full((len(groups), P), pad_id, dtype=torch.long)
    prefix_mask = torch.zeros((len(groups), P), dtype=torch.long)
    group = torch.zeros(len(seqs), dtype=torch.long)
    length = torch.zeros(len(seqs), dtype=torch.long)
    for g, (members, p) in enumerate(groups):
        if p:
            prefix_ids[g, :p] = torch.tensor(seqs[members[0]][:p], dtype=torch.long)
            prefix_mask[g, :p] = 1
        for s in members:
            group[s], length[s] = g, p
    U = max(len(s) - int(length[i]) for i, s in enumerate(seqs))
    suffix_ids = torch.full((len(seqs), U), pad_id, dtype=torch.long)
    suffix_mask = torch.zeros((len(seqs), U), dtype=torch.long)
    for i, s in enumerate(seqs):
        rest = s[int(length[i]) :]
        suffix_ids[i, : len(rest)] = torch.tensor(rest, dtype=torch.long)
        suffix_mask[i, : len(rest)] = 1
    return SharedPrefix(prefix_ids, prefix_mask, group, length, suffix_ids, suffix_mask)


def pad_rows(seqs: Sequence[Sequence[float]], L: int) -> Tensor:
    """Per-row float lists right-padded with 0 into a (B, L) tensor."""
    out = torch.zeros(len(seqs), L)
    for i, s in enumerate(seqs):
        if len(s):
            out[i, : len(s)] = torch.tensor(list(s), dtype=torch.float32)
    return out


def pack_sequences(seqs: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[int]]:
    """(distinct sequences, index of the sequence holding each input): every input that is a prefix
    of a longer input is read from that longer one."""
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    hosts: list[list[int]] = []
    where = [0] * len(seqs)
    for i in order:
        s = list(seqs[i])
        for h, host in enumerate(hosts):
            if host[: len(s)] == s:
                where[i] = h
                break
        else:
            where[i] = len(hosts)
            hosts.append(s)
    return hosts, where


def make_token_batch(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    pad_id: int,
    *,
    pack: bool = True,
    share_prefix: bool = False,
    min_prefix: int = 8,
    packed: bool = False,
) -> TokenBatch:
    """The rows' tensors. ``pack``: a row whose prompt + response is a prefix of another row's is read
    from that one. ``share_prefix``: the distinct sequences are forwarded on shared prefixes (see the
    module docstring) when that forwards fewer tokens. ``packed``: the forward lays the distinct
    sequences end to end in rows (``packed_rows``: no padding) instead of (S, T) padded rows with a
    prefix cache; the same log-probs up to the summation order of the matmuls."""
    if len(prompt_ids) != len(response_ids) or not prompt_ids:
        raise ValueError(f"need as many prompts as responses, got {len(prompt_ids)} and {len(response_ids)}")
    for i, p in enumerate(prompt_ids):
        if not len(p):
            raise ValueError(f"row {i}: empty prompt_ids")
    B = len(prompt_ids)
    full = [list(p) + list(r) for p, r in zip(prompt_ids, response_ids)]
    seqs, where = pack_sequences(full) if pack else (full, list(range(B)))
    T = max(len(s) for s in seqs)
    L = max(max(len(r) for r in response_ids), 1)
    input_ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for h, s in enumerate(seqs):
        input_ids[h, : len(s)] = torch.tensor(s, dtype=torch.long)
        attention_mask[h, : len(s)] = 1
    resp = torch.zeros((B, L), dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.float32)
    pos = torch.zeros((B, L), dtype=torch.long)
    value_pos = torch.zeros(B, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        P, R = len(p), len(r)
        if R:
            resp[i, :R] = torch.tensor(list(r), dtype=torch.long)
            mask[i, :R] = 1.0
        pos[i] = (P - 1 + torch.arange(L)).clamp(max=T - 1)
        value_pos[i] = P - 1
    prefix = None
    if share_prefix and len(seqs) > 1:
        prefix = _share_prefixes(seqs, pad_id, min_prefix)
        if int(prefix.prefix_mask.sum()) == 0:
            prefix = None
    batch = TokenBatch(
        input_ids, attention_mask, torch.tensor(where, dtype=torch.long), resp, mask, pos, value_pos, prefix
    )
    if packed:
        batch.packed = packed_rows(batch)  # from the ids on the CPU: a device tensor would need a sync
    return batch


def shared_prefix_hidden(decoder: torch.nn.Module, sp: SharedPrefix) -> tuple[Tensor, Tensor]:
    """Final hidden states of the shared prefixes (G, P, H) and of the suffixes on top of them (S, U, H)."""
    pre = decoder(input_ids=sp.prefix_ids, attention_mask=sp.prefix_mask, use_cache=True)
    cache = pre.past_key_values
    cache.batch_select_indices(sp.group)  # every sequence gets its group's keys/values (differentiable)
    positions = sp.length.unsqueeze(1) + torch.arange(sp.suffix_ids.size(1), device=sp.length.device)
    out = decoder(
        input_ids=sp.suffix_ids,
        attention_mask=torch.cat([sp.prefix_mask[sp.group], sp.suffix_mask], dim=1),
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
    )
    return pre.last_hidden_state, out.last_hidden_state


def packed_rows(batch: TokenBatch, capacity: int = PACK_CAPACITY) -> PackedRows:
    """The batch's distinct sequences (on their shared prefixes when it has them) packed end to end
    into a few rows (``components.train.packing``), on the batch's device."""
    if batch.prefix is None:
        lengths = batch.attention_mask.sum(1).tolist()
        ids = batch.input_ids.tolist()
        units = [([], [(s, ids[s][:n])]) for s, n in enumerate(lengths)]
    else:
        sp = batch.prefix
        pre_len, suf_len = sp.prefix_mask.sum(1).tolist(), sp.suffix_mask.sum(1).tolist()
        pre_ids, suf_ids, group = sp.prefix_ids.tolist(), sp.suffix_ids.tolist(), sp.group.tolist()
        members: dict[int, list] = {}
        for s, g in enumerate(group):
            members.setdefault(g, []).append((s, suf_ids[s][: suf_len[s]]))
        units = [(pre_ids[g][: pre_len[g]], m) for g, m in members.items()]
    S, T = batch.input_ids.shape
    return pack_rows(units, S, T, pad_id=0, capacity=capacity, device=batch.input_ids.device)


def _attention_mask(decoder: torch.nn.Module, mask: Tensor) -> Tensor:
    """The packed rows' boolean mask (R, 1, C, C) as the decoder's attention takes a 4-D mask: boolean
    for sdpa, additive (0 or the dtype's minimum) for the others (eager adds it to the scores)."""
    if getattr(decoder.config, "_attn_implementation", "sdpa") == "sdpa":
        return mask
    dtype = next(decoder.parameters()).dtype
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def _hidden_at(decoder: torch.nn.Module, batch: TokenBatch, positions: Tensor) -> Tensor:
    """Final hidden states of the backbone ``decoder`` for each row at ``positions`` (B, K) -> (B, K, H),
    without materialising (S, T, V) logits. With ``batch.packed`` the distinct sequences (on shared
    prefixes when the batch has them) are forwarded packed end to end (about the real tokens, no
    padding); else as (S, T) padded rows, on shared prefixes when the batch has them."""
    seq = batch.row_seq.unsqueeze(-1).expand_as(positions)  # (B, K) the sequence of each position
    if batch.packed is None:
        if batch.prefix is None:
            out = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
            return out.last_hidden_state[seq, positions]  # from (S, T, H)
        sp = batch.prefix
        pre, suf = shared_prefix_hidden(decoder, sp)
        start = sp.length[seq]
        h_pre = pre[sp.group[seq], positions.clamp(max=pre.size(1) - 1)]
        h_suf = suf[seq, (positions - start).clamp(min=0, max=suf.size(1) - 1)]
        return torch.where((positions < start).unsqueeze(-1), h_pre, h_suf)
    packed = batch.packed
    out = decoder(
        input_ids=packed.ids,
        attention_mask=_attention_mask(decoder, packed.mask),
        position_ids=packed.positions,
        use_cache=False,
    )
    flat = out.last_hidden_state.flatten(0, 1)  # (R * C, H)
    return flat[packed.where[seq, positions.clamp(max=batch.input_ids.size(1) - 1)]]


def head_logits(head: torch.nn.Module, h: Tensor) -> Tensor:
    """``head(h)`` as fp32 logits, outside any autocast region: under ``amp_bf16`` the backbone runs in
    bf16 but the output (or value) head, and so the softmax, in fp32; in the head's own dtype otherwise
    (bf16 weights under DeepSpeed's bf16 mode)."""
    weight = getattr(head, "weight", None)
    with torch.autocast(h.device.type, enabled=False):
        return head(h.to(weight.dtype if weight is not None else torch.float32)).float()


def response_logprobs(
    model: torch.nn.Module, batch: TokenBatch, *, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """log pi(response token j | context) (B, L), and optionally the entropy of that distribution (B, L),
    on the model's device (``batch`` is moved there)."""
    batch = to_device(batch, model_device(model))
    h = _hidden_at(model.get_decoder(), batch, batch.response_pos)  # (B, L, H)
    logits = head_logits(model.get_output_embeddings(), h) / temperature  # (B, L, V) fp32
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1) * batch.response_mask
    entropy = None
    if with_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1) * batch.response_mask
    return logp, entropy


def _values_at(critic: torch.nn.Module, batch: TokenBatch, positions: Tensor) -> Tensor:
    """The critic's values (B, K) fp32 at ``positions`` (B, K) of a batch already on its device."""
    backbone = getattr(critic, critic.base_model_prefix)
    h = _hidden_at(backbone, batch, positions)
    return head_logits(critic.score, critic.dropout(h)).squeeze(-1)


def critic_values(critic: torch.nn.Module, batch: TokenBatch, *, per_step: bool) -> Tensor:
    """Critic values: at the last prompt token (B,) if ``per_step``, else at the response positions (B, L).

    ``critic`` is a transformers token-classification model (backbone, dropout, ``score`` head); the
    head reads only the positions needed. On the critic's device (``batch`` is moved there)."""
    batch = to_device(batch, model_device(critic))
    if per_step:
        return _values_at(critic, batch, batch.value_pos.unsqueeze(-1))[:, 0]
    return _values_at(critic, batch, batch.response_pos) * batch.response_mask


def critic_features(critic: torch.nn.Module, batch: TokenBatch) -> tuple[Tensor, Tensor]:
    """What the critic's value head reads: the backbone's final hidden states at each row's last prompt
    token (B, H) and at its response positions (B, L, H), from one forward pass, fp32."""
    batch = to_device(batch, model_device(critic))
    backbone = getattr(critic, critic.base_model_prefix)
    h = _hidden_at(backbone, batch, torch.cat([batch.value_pos.unsqueeze(-1), batch.response_pos], dim=1))
    h = critic.dropout(h).float()
    return h[:, 0], h[:, 1:]


def critic_step_and_token_values(critic: torch.nn.Module, batch: TokenBatch) -> tuple[Tensor, Tensor]:
    """Both kinds of :func:`critic_values` from one forward pass: per step (B,) and per token (B, L)."""
    batch = to_device(batch, model_device(critic))
    v = _values_at(critic, batch, torch.cat([batch.value_pos.unsqueeze(-1), batch.response_pos], dim=1))
    return v[:, 0], v[:, 1:] * batch.response_mask
