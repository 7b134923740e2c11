"""Data parallel on 2 CPU processes: the same global batch gives the same weights with 1 or 2 ranks.

The cases of tests/train/rank_worlds.py, one world of each size for all of them (conftest's
``rank_worlds``, shared with test_zero3 and test_torchrun: starting a world costs more than a step):
one SFT step (run_sft), one GRPO actor update (actor_update) and one critic update, each on its own
engine, and the train stage's session calls through components.train.rank_mirror (annotate, update,
save, sync, final_model at ZeRO-0), from the same tiny model and the same batch, at world size 1 and
2. Every rank passes the whole batch and trains its share of the micro-batches
(components.train.engine.train_step). Tolerance: train_helpers.assert_weights_match, the project's
rule for Adam steps from gradients equal up to float reassociation (here the two ranks' sums are added
in another order): every weight within 2% of lr, at most 0.1% of them off by more than 1e-6
(measured: max 1.1e-5 at lr 1e-2 after the SFT step, where a gradient is ~0 and Adam divides by it);
the metrics summed over ranks (loss, entropy, value loss) to 1e-6 relative. Negative control: rank 1
drops its gradients (its backward is fed loss * 0) and the same check fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rank_worlds import LR, METRIC, model
from train_helpers import assert_weights_match, tiny_model


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("what, metric", METRIC.items())
def test_two_ranks_give_the_weights_of_one(rank_worlds, what, metric):
    one, two, dropped = (
        rank_worlds.get(1)[what],
        rank_worlds.get(2)[what],
        rank_worlds.get(2, dropped=True)[what],
    )
    start = {k: p.detach().float().clone() for k, p in model(what).named_parameters()}
    moved = _max_diff(one["weights"], start)
    assert moved > 1e-3, f"{what}: the step barely moved the weights ({moved}); the check would be empty"
    assert_weights_match(two["weights"], one["weights"], lr=LR, steps=1)
    assert one["metrics"]["n_micro_batches"] == two["metrics"]["n_micro_batches"] > 2
    assert two["metrics"][metric] == pytest.approx(one["metrics"][metric], rel=1e-6)
    with pytest.raises(AssertionError, match="weight"):
        assert_weights_match(dropped["weights"], one["weights"], lr=LR, steps=1)


def test_train_stage_session_on_two_ranks_gives_the_weights_of_one(rank_worlds):
    one, two = rank_worlds.get(1)["session-z0"], rank_worlds.get(2)["session-z0"]
    start = {k: p.detach().float() for k, p in tiny_model().named_parameters()}
    assert _max_diff(one["weights"], start) > 1e-3
    assert_weights_match(two["weights"], one["weights"], lr=LR, steps=1)
    for key in ("actor/entropy", "critic/vf_loss"):
        assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-6), key
    ckpt = Path(f"{rank_worlds.path(2, 'session-z0')}.ckpt")
    assert (ckpt / "actor" / "steprl_complete.json").is_file()
    dropped = rank_worlds.get(2, dropped=True)["session-z0"]  # the follower's share never reaches the update
    with pytest.raises(AssertionError, match="weight"):
        assert_weights_match(dropped["weights"], one["weights"], lr=LR, steps=1)
