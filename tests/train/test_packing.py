"""Packed forwards (components.train.packing via policy._hidden_at): the log-probs, entropies and
gradients of one plain transformers forward per sequence, on about the real tokens (no padding)."""

from __future__ import annotations

import pytest
import torch
from train_helpers import tiny_model

from components.train.packing import pack_rows
from components.train.policy import make_token_batch, packed_rows, response_logprobs

SYSTEM = list(range(10, 40))


def _rows(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Three groups of four samples (one long answer pads the others), and a prompt sharing nothing."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for k in range(3):
        prompt = SYSTEM + torch.randint(4, 120, (6 + k,), generator=g).tolist()
        for j in range(4):
            prompts.append(prompt)
            n = 40 if j == 0 else 2 + j
            responses.append(torch.randint(4, 120, (n,), generator=g).tolist())
    prompts.append([5, 6, 7])
    responses.append([8, 9])
    return prompts, responses


def _reference(model, prompts, responses, temperature):
    """log pi and entropy of each response token from a plain forward of its sequence alone."""
    logps, ents = [], []
    for p, r in zip(prompts, responses):
        ids = torch.tensor([list(p) + list(r)])
        logits = model(input_ids=ids).logits[0, len(p) - 1 : len(p) - 1 + len(r)].float() / temperature
        lp = logits.log_softmax(-1)
        logps.append(lp.gather(-1, torch.tensor(r).unsqueeze(-1)).squeeze(-1))
        ents.append(-(lp.exp() * lp).sum(-1))
    return logps, ents


@pytest.mark.parametrize("share_prefix", [True, False])
def test_packed_forward_equals_one_plain_forward_per_sequence(share_prefix):
    model = tiny_model()
    prompts, responses = _rows()
    model.zero_grad(set_to_none=True)
    ref_lp, ref_ent = _reference(model, prompts, responses, 0.7)
    (sum(x.sum() for x in ref_lp) + 0.1 * sum(x.sum() for x in ref_ent)).backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}

    model.zero_grad(set_to_none=True)
    batch = make_token_batch(prompts, responses, 0, share_prefix=share_prefix, packed=True)
    logp, ent = response_logprobs(model, batch, temperature=0.7, with_entropy=True)
    (logp.sum() + 0.1 * ent.sum()).backward()
    for i, r in enumerate(responses):
        torch.testing.assert_close(logp[i, : len(r)], ref_lp[i], atol=1e-5, rtol=0)
        torch.testing.assert_close(ent[i, : len(r)], ref_ent[i], atol=1e-5, rtol=0)
    for name, g in ref_grads.items():
        torch.testing.assert_close(model.get_parameter(name).grad, g, atol=1e-5, rtol=1e-4, msg=name)


def test_the_model_runs_on_the_real_tokens_not_the_padding():
    """One long answer used to pad every sequence of the batch (S x T positions); packed, the decoder
    runs on the tokens the batch forwards (prefixes once, then each sequence's own tokens)."""
    model = tiny_model()
    prompts, responses = _rows()
    batch = make_token_batch(prompts, responses, 0, share_prefix=True, packed=True)
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(
        lambda m, args, out: seen.append(args[0].numel())
    )
    try:
        response_logprobs(model, batch)
    finally:
        hook.remove()
    padded = batch.prefix.prefix_ids.numel() + batch.prefix.suffix_ids.numel()  # what the old path ran
    assert sum(seen) == batch.forwarded_tokens < padded / 2


def test_mask_keeps_sequences_apart_and_reads_the_shared_prefix():
    # unit 0: prefix [7, 8] read by sequences 0 ([9]) and 1 ([10, 11]); unit 1: sequence 2 alone.
    p = pack_rows([([7, 8], [(0, [9]), (1, [10, 11])]), ([], [(2, [12, 13])])], 3, 4, pad_id=0, capacity=16)
    assert p.ids.tolist() == [[7, 8, 9, 10, 11, 12, 13]]
    assert p.positions.tolist() == [[0, 1, 2, 2, 3, 0, 1]]
    m = p.mask[0, 0].int().tolist()
    assert m == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],  # sequence 0's own token: the prefix and itself
        [1, 1, 0, 1, 0, 0, 0],  # sequence 1 never sees sequence 0
        [1, 1, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 0],  # another unit: nothing of unit 0
        [0, 0, 0, 0, 0, 1, 1],
    ]
    assert p.where.tolist() == [[0, 1, 2, 2], [0, 1, 3, 4], [5, 6, 6, 6]]


def test_rows_are_filled_longest_first_and_padding_attends_to_itself():
    units = [([], [(0, [1] * 5)]), ([], [(1, [2] * 3)]), ([], [(2, [3] * 2)]), ([], [(3, [4] * 4)])]
    p = pack_rows(units, 4, 5, pad_id=0, capacity=8)
    assert p.ids.tolist() == [[1, 1, 1, 1, 1, 2, 2, 2], [4, 4, 4, 4, 3, 3, 0, 0]]
    assert p.mask[1, 0, 7].tolist() == [False] * 7 + [True]  # a padding query: itself only (no NaN)


def test_bad_units_are_refused():
    with pytest.raises(ValueError, match="appears twice"):
        pack_rows([([], [(0, [1])]), ([], [(0, [2])])], 1, 4, pad_id=0)
    with pytest.raises(ValueError, match=r"\[1\] are in no unit"):
        pack_rows([([], [(0, [1])])], 2, 4, pad_id=0)
    with pytest.raises(ValueError, match="no empty unit"):
        pack_rows([([], [])], 1, 4, pad_id=0)


def test_packed_rows_of_a_batch_without_shared_prefixes():
    batch = make_token_batch([[4, 5, 6], [7]], [[8], [9, 10, 11, 12]], 0, share_prefix=False)
    p = packed_rows(batch)
    assert sorted(p.ids[0].tolist()) == sorted([4, 5, 6, 8, 7, 9, 10, 11, 12])
    assert p.ids.numel() == 9
