"""SFT: the token-level NLL by hand, micro-batch splitting, the global normaliser, overfitting a batch."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from train_helpers import ENGINE_KW, assert_weights_match, full_weights, random_batch, tiny_model

from components.train.engine import build_engine
from components.train.sft import (
    common_prefix,
    count_label_tokens,
    run_sft,
    split_micro_batches,
    token_nll_sum,
)


def test_token_nll_sum_by_hand() -> None:
    # Position t predicts token t+1. Row: labels [-100, 1, 0]; logits at t=0 give p(1) = 3/4,
    # at t=1 p(0) = 4/5; the last position predicts nothing, so NaN there must not leak in.
    # The head is the identity here, so the hidden states are the logits.
    logits = torch.tensor([[[0.0, math.log(3.0)], [math.log(4.0), 0.0], [float("nan"), float("nan")]]])
    labels = torch.tensor([[-100, 1, 0]])
    nll, n = token_nll_sum(hidden=logits, labels=labels, head=torch.nn.Identity())
    assert n == 2
    assert nll.item() == pytest.approx(math.log(4 / 3) + math.log(5 / 4), abs=1e-6)
    # Masking the first target leaves only the second position.
    nll, n = token_nll_sum(hidden=logits, labels=torch.tensor([[-100, -100, 0]]), head=torch.nn.Identity())
    assert n == 1 and nll.item() == pytest.approx(math.log(5 / 4), abs=1e-6)
    # A label on position 0 is never a target (nothing predicts the first token).
    assert count_label_tokens(torch.tensor([[7, -100, -100]])) == 0
    with pytest.raises(ValueError, match="disagree"):
        token_nll_sum(hidden=logits, labels=torch.tensor([[1, 2]]), head=torch.nn.Identity())


def test_token_nll_matches_transformers_loss() -> None:
    model = tiny_model(seed=3)
    batch = random_batch(5, seed=5)
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    hidden = model.get_decoder()(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
    ).last_hidden_state
    # the head on the labelled positions only: the same loss as the full logits transformers computes
    nll, n = token_nll_sum(hidden=hidden, labels=batch["labels"], head=model.get_output_embeddings())
    assert n == count_label_tokens(batch["labels"])
    torch.testing.assert_close(nll / n, out.loss, atol=1e-6, rtol=1e-6)


def test_split_micro_batches() -> None:
    batch = random_batch(8, seed=1)
    parts = split_micro_batches(batch, 3)
    assert [p["input_ids"].shape[0] for p in parts] == [3, 3, 2]
    for k in batch:
        assert torch.equal(torch.cat([p[k] for p in parts]), batch[k])
    with pytest.raises(ValueError, match="micro_batch_size"):
        split_micro_batches(batch, 0)
    with pytest.raises(KeyError, match="labels"):
        split_micro_batches({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}, 2)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        split_micro_batches({**batch, "attention_mask": batch["attention_mask"][:, :3]}, 2)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        split_micro_batches({k: v[0] for k, v in batch.items()}, 2)


def test_overfit_fixed_batch_and_metrics() -> None:
    model = tiny_model(seed=4)
    batch = random_batch(4, seed=2)
    with torch.no_grad():
        hf_loss = model(**batch).loss.item()
    engine = build_engine(model, **{**ENGINE_KW, "lr": 1e-2, "total_steps": 30})
    seen: list[tuple[int, dict]] = []
    history = run_sft(
        engine,
        (split_micro_batches(batch, 2) for _ in range(30)),
        steps=30,
        on_step=lambda step, m: seen.append((step, m)),
    )
    assert [s for s, _ in seen] == list(range(1, 31))
    assert len(history) == 30 and history[0] is seen[0][1]
    losses = [m["loss"] for m in history]
    # the first step's loss is the token mean over the whole batch, as transformers computes it
    assert losses[0] == pytest.approx(hf_loss, rel=1e-5)
    assert losses[-1] < 0.5 * losses[0], losses
    first = history[0]
    for key in ("loss", "grad_norm", "lr", "tokens_per_s", "skipped", "n_label_tokens", "n_tokens"):
        assert key in first
    assert first["n_label_tokens"] == count_label_tokens(batch["labels"])
    assert first["n_tokens"] == batch["attention_mask"].sum().item()
    assert first["tokens_per_s"] > 0 and first["grad_norm"] > 0 and first["skipped"] == 0.0


def test_run_sft_micro_batching_does_not_change_training() -> None:
    """Same losses, grad norms and weights over 3 steps however the batches are cut.

    Weights get an lr-relative tolerance (see assert_weights_match); the gradient-level check is in
    test_train_engine.py.
    """
    base = tiny_model(seed=6)
    batches = [random_batch(6, seed=20 + i) for i in range(3)]
    runs = {}
    for micro in (6, 2, 4):  # 4 -> uneven 4 + 2
        engine = build_engine(copy.deepcopy(base), **{**ENGINE_KW, "lr": 1e-3})
        hist = run_sft(engine, ([*split_micro_batches(b, micro)] for b in batches), steps=3, progress=False)
        runs[micro] = ([v for m in hist for v in (m["loss"], m["grad_norm"])], full_weights(engine))
    ref_losses, ref_w = runs[6]
    moved = max((ref_w[k] - p.detach()).abs().max().item() for k, p in base.named_parameters())
    assert moved > 1e-3
    for micro, (losses, w) in runs.items():
        assert losses == pytest.approx(ref_losses, rel=1e-5), micro
        assert_weights_match(w, ref_w, lr=1e-3, steps=3)


def test_run_sft_errors_name_the_problem() -> None:
    engine = build_engine(tiny_model(), **ENGINE_KW)
    batch = random_batch(2, seed=9)
    with pytest.raises(ValueError, match="ran out after 2 of steps=3"):
        run_sft(engine, [[batch], [batch]], steps=3, progress=False)
    unlabelled = {**batch, "labels": torch.full_like(batch["labels"], -100)}
    with pytest.raises(ValueError, match="no labelled tokens"):
        run_sft(engine, [[unlabelled]], steps=1, progress=False)
    with pytest.raises(KeyError, match="step 1 micro-batch 1"):
        run_sft(engine, [[batch, {"input_ids": batch["input_ids"]}]], steps=1, progress=False)
    with pytest.raises(ValueError, match="steps"):
        run_sft(engine, [[batch]], steps=0)


def _system_prompt_batch(n: int, *, seed: int, shared: int = 12) -> dict[str, torch.Tensor]:
    """random_batch rows behind one common ``shared``-token prefix (a system prompt), unlabelled."""
    b = random_batch(n, seed=seed)
    prefix = torch.arange(4, 4 + shared).expand(n, shared)
    return {
        "input_ids": torch.cat([prefix, b["input_ids"]], 1),
        "labels": torch.cat([torch.full((n, shared), -100), b["labels"]], 1),
        "attention_mask": torch.cat([torch.ones(n, shared, dtype=torch.long), b["attention_mask"]], 1),
    }


def test_common_prefix_stops_before_the_first_predicted_label() -> None:
    batch = _system_prompt_batch(4, seed=1)
    sp = common_prefix(batch)
    assert sp is not None
    P = sp.prefix_ids.shape[1]
    first = int((batch["labels"] != -100).long().argmax(1).min())
    assert 12 <= P <= first - 1  # the random tokens after the system prompt may match by chance
    assert torch.equal(torch.cat([sp.prefix_ids.expand(4, P), sp.suffix_ids], 1), batch["input_ids"])
    # a labelled token right after the shared part: the prefix stops one token earlier
    batch["labels"][2, 10] = batch["input_ids"][2, 10]
    assert common_prefix(batch).prefix_ids.shape[1] == 9
    assert common_prefix(batch, min_prefix=10) is None
    assert common_prefix({k: v[:1] for k, v in batch.items()}) is None  # one row: nothing to share
    assert common_prefix(random_batch(4, seed=3)) is None  # no common start


def test_shared_prefix_sft_step_matches_the_plain_forward() -> None:
    """Loss, gradient norm and updated weights of SFT steps are those of one forward per row."""
    base = tiny_model(seed=8)
    batches = [_system_prompt_batch(6, seed=30 + i) for i in range(3)]
    runs = {}
    for shared in (True, False):
        engine = build_engine(copy.deepcopy(base), **{**ENGINE_KW, "lr": 1e-3})
        # plain: one row per micro-batch, so there is no common prefix (same batch, same normaliser)
        if not shared:
            parts = [[{k: v[i : i + 1] for k, v in b.items()} for i in range(6)] for b in batches]
        else:
            parts = [split_micro_batches(b, 6) for b in batches]
        hist = run_sft(engine, iter(parts), steps=3, progress=False)
        runs[shared] = (hist, full_weights(engine))
    (h_shared, w_shared), (h_plain, w_plain) = runs[True], runs[False]
    # the 12-token prefix is forwarded once, not 6 times
    assert h_shared[0]["n_forwarded_tokens"] <= h_shared[0]["n_tokens"] - 5 * 12
    assert h_plain[0]["n_forwarded_tokens"] == h_plain[0]["n_tokens"]
    for a, b in zip(h_shared, h_plain):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    assert_weights_match(w_shared, w_plain, lr=1e-3, steps=3)
