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

It does not decide what to train: losses live in ``components.algos``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class TokenBatch:
    input_ids: Tensor  # (S, T) the distinct sequences (prompt + response), right-padded
    attention_mask: Tensor  # (S, T)
    row_seq: Tensor  # (B,) the sequence row i reads
    response_ids: Tensor  # (B, L) right-padded with 0
    response_mask: Tensor  # (B, L) float, 1 on real response tokens
    response_pos: Tensor  # (B, L) position of the logit that scores response token j
    value_pos: Tensor  # (B,) last prompt token

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


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
) -> TokenBatch:
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
    return TokenBatch(
        input_ids, attention_mask, torch.tensor(where, dtype=torch.long), resp, mask, pos, value_pos
    )


def _hidden_at(model: torch.nn.Module, batch: TokenBatch, positions: Tensor) -> Tensor:
    """Final hidden states of each row at ``positions`` (B, K) -> (B, K, H), without materialising
    (S, T, V) logits."""
    out = model.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    hidden = out.last_hidden_state  # (S, T, H)
    return hidden[batch.row_seq.unsqueeze(-1), positions]


def response_logprobs(
    model: torch.nn.Module, batch: TokenBatch, *, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """log pi(response token j | context) (B, L), and optionally the entropy of that distribution (B, L)."""
    h = _hidden_at(model, batch, batch.response_pos)  # (B, L, H)
    logits = model.get_output_embeddings()(h).float() / temperature  # (B, L, V)
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1) * batch.response_mask
    entropy = None
    if with_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1) * batch.response_mask
    return logp, entropy


def critic_values(critic: torch.nn.Module, batch: TokenBatch, *, per_step: bool) -> Tensor:
    """Critic values: at the last prompt token (B,) if ``per_step``, else at the response positions (B, L)."""
    out = critic(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    v = out.logits.squeeze(-1).float()  # (S, T)
    if per_step:
        return v[batch.row_seq, batch.value_pos]
    return v[batch.row_seq.unsqueeze(-1), batch.response_pos] * batch.response_mask
