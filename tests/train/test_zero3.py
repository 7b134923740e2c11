"""ZeRO-3 (sharded parameters) in the train stage's session, on 1 and 2 CPU ranks (gloo, spawned).

The ``session-z3`` and ``session-z0`` cases of tests/train/rank_worlds.py (conftest's ``rank_worlds``:
one world per size, shared with test_data_parallel): the train stage's calls on an RLSession with a
critic, as flows.train makes them through components.train.rank_mirror: annotate (the actor's old
log-probs and the critic's values: forwards every rank joins under ZeRO-3), update (critic and GRPO
actor), save, sync into the hf rollout engine on rank 0, final_model. Then every rank gathers the
actor's full weights (tests/train/train_helpers.full_weights) to compare with.

Checked: ZeRO-3 on 2 ranks gives the weights of ZeRO-3 on 1 and of ZeRO-0 on 1 (train_helpers.
assert_weights_match, the rule of tests/train/test_data_parallel.py), the same annotations and
metrics; the weights synced into the rollout engine, the final model and the checkpoint's HF weights
equal the gathered trainer weights exactly. Negative control: rank 1's gradients dropped fails the
weight check.
"""

from __future__ import annotations

import pytest
import torch
from rank_worlds import LR
from train_helpers import assert_weights_match, tiny_model

RUNS = {"z3w1": (1, "session-z3"), "z3w2": (2, "session-z3"), "z0w1": (1, "session-z0")}
SYNCED = RUNS | {"z0w2": (2, "session-z0")}


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() <= b.keys(), sorted(set(a) - set(b))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_zero3_on_two_ranks_gives_the_weights_of_one(rank_worlds):
    one, two, plain = (rank_worlds.get(world)[case] for world, case in RUNS.values())
    start = {k: p.detach().float() for k, p in tiny_model().named_parameters()}
    assert _max_diff(one["weights"], start) > 1e-3  # the update moved the weights: the check is not empty
    print(f"max |w(ZeRO-3, 2 ranks) - w(ZeRO-3, 1 rank)| = {_max_diff(two['weights'], one['weights']):.3g}")
    print(f"max |w(ZeRO-3, 1 rank) - w(ZeRO-0, 1 rank)| = {_max_diff(one['weights'], plain['weights']):.3g}")
    assert_weights_match(two["weights"], one["weights"], lr=LR, steps=1)
    assert_weights_match(one["weights"], plain["weights"], lr=LR, steps=1)
    for key in ("actor/entropy", "critic/vf_loss"):
        assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-6), key
        assert one["metrics"][key] == pytest.approx(plain["metrics"][key], rel=1e-6), key
    for field in ("old_logprobs", "values"):  # forwards that every rank joined
        a, b = (torch.tensor([x for row in r[field] for x in row]) for r in (two, plain))
        assert torch.allclose(a, b, atol=1e-5), (field, float((a - b).abs().max()))
    dropped = rank_worlds.get(2, dropped=True)["session-z3"]
    with pytest.raises(AssertionError, match="weight"):  # rank 1's gradients dropped
        assert_weights_match(dropped["weights"], one["weights"], lr=LR, steps=1)


@pytest.mark.parametrize("name", list(SYNCED))
def test_synced_final_and_saved_weights_are_the_trainers(rank_worlds, name):
    world, case = SYNCED[name]
    run = rank_worlds.get(world)[case]
    weights = run["weights"]
    for what in ("synced", "final", "saved"):
        state = run[what]
        assert weights.keys() <= state.keys(), (what, sorted(set(weights) - set(state)))
        for k, w in weights.items():
            assert torch.equal(state[k].float(), w), (what, k)
    # the tied output head is in the state dict (vLLM would keep a stale one without it)
    assert torch.equal(run["synced"]["lm_head.weight"], run["synced"]["model.embed_tokens.weight"])
