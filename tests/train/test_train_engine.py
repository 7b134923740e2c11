"""DeepSpeed config builder (pure) and train_step: accumulation invariance, non-finite skips, LR
schedule, two engines in one process."""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
from train_helpers import (
    ENGINE_KW,
    GradCapture,
    assert_same_tensors,
    assert_weights_match,
    full_weights,
    optimizer_tensors,
    random_batch,
    tiny_model,
)

from components.train.engine import build_engine, lr_factor, make_ds_config, train_step
from components.train.sft import count_label_tokens, sft_loss_fn, split_micro_batches

CFG = dict(
    lr=3e-3,
    weight_decay=0.1,
    zero_stage=0,
    dtype="fp32",
    grad_clip=1.0,
    micro_batch_size=4,
    grad_accum_steps=2,
    warmup_steps=5,
    total_steps=50,
)


# ---------------------------------------------------------------- config (pure, no DeepSpeed)


def test_config_fp32_zero0() -> None:
    c = make_ds_config(**CFG)
    assert c["train_micro_batch_size_per_gpu"] == 4
    assert c["gradient_accumulation_steps"] == 2
    assert c["train_batch_size"] == 8
    assert c["optimizer"] == {
        "type": "AdamW",
        "params": {"lr": 3e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1, "torch_adam": True},
    }
    assert "scheduler" not in c  # the schedule is lr_factor, a torch LambdaLR
    assert c["gradient_clipping"] == 1.0
    assert c["zero_optimization"] == {"stage": 0}
    assert "bf16" not in c and "fp16" not in c


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_config_bf16_and_stages(stage: int) -> None:
    c = make_ds_config(**{**CFG, "dtype": "bf16", "zero_stage": stage}, world_size=4)
    assert c["bf16"] == {"enabled": True}
    assert c["zero_optimization"]["stage"] == stage
    assert c["train_batch_size"] == 4 * 2 * 4
    assert ("stage3_gather_16bit_weights_on_model_save" in c["zero_optimization"]) == (stage == 3)
    # fp32 gradient accumulation wherever DeepSpeed supports it (not ZeRO-0)
    assert c.get("data_types") == ({"grad_accum_dtype": "fp32"} if stage >= 1 else None)
    assert "data_types" not in make_ds_config(**{**CFG, "zero_stage": stage})


def test_lr_factor_by_hand() -> None:
    f = partial(lr_factor, total_steps=6, lr_schedule="linear_decay")
    # warmup 2: (k+1)/2 ; then (6 - k) / (6 - 2)
    assert [f(k, warmup_steps=2) for k in range(8)] == pytest.approx([0.5, 1, 1, 0.75, 0.5, 0.25, 0, 0])
    no_warmup = [f(k, warmup_steps=0) for k in range(7)]
    assert no_warmup == pytest.approx([1, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6, 0])
    c = partial(lr_factor, total_steps=6, lr_schedule="constant")
    assert [c(k, warmup_steps=3) for k in range(8)] == pytest.approx([1 / 3, 2 / 3, 1, 1, 1, 1, 1, 1])
    # warmup-stable-decay, warmup 2 and decay 3 of 8: (k+1)/2, then 1, then (8 - k) / 3
    w = partial(lr_factor, warmup_steps=2, total_steps=8, lr_schedule="wsd", decay_steps=3)
    assert [w(k) for k in range(9)] == pytest.approx([0.5, 1, 1, 1, 1, 1, 2 / 3, 1 / 3, 0])
    # a decay longer than the steps after warmup covers those steps: linear_decay's factors
    long = partial(lr_factor, warmup_steps=2, total_steps=8, lr_schedule="wsd", decay_steps=100)
    lin = partial(lr_factor, warmup_steps=2, total_steps=8, lr_schedule="linear_decay")
    assert [long(k) for k in range(9)] == pytest.approx([lin(k) for k in range(9)])
    with pytest.raises(ValueError, match="lr_schedule"):
        lr_factor(5, warmup_steps=0, total_steps=6, lr_schedule="cosine")  # type: ignore[arg-type]


def test_wsd_needs_a_decay() -> None:
    with pytest.raises(ValueError, match="decay_steps=0 must be at least 1"):
        make_ds_config(**{**CFG, "warmup_steps": 2, "total_steps": 8, "lr_schedule": "wsd", "decay_steps": 0})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("lr", 0.0),
        ("lr", float("nan")),
        ("weight_decay", -0.1),
        ("zero_stage", 4),
        ("zero_stage", True),
        ("dtype", "fp16"),
        ("grad_clip", 0.0),
        ("micro_batch_size", 0),
        ("micro_batch_size", 2.0),
        ("grad_accum_steps", 0),
        ("warmup_steps", -1),
        ("warmup_steps", 51),
        ("total_steps", 0),
        ("lr_schedule", "cosine"),
    ],
)
def test_config_rejects_bad_values_naming_them(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=name):
        make_ds_config(**{**CFG, name: value})


# ---------------------------------------------------------------- engine


def _sft_step(engine, batch, micro: int) -> dict:
    total = count_label_tokens(batch["labels"])
    return train_step(engine, split_micro_batches(batch, micro), partial(sft_loss_fn, normaliser=total))


def test_accumulation_invariance_same_gradients_and_weights() -> None:
    """1x8, 2x4, 4x2 and an uneven 3+3+2 split: the optimizer sees the same summed gradient (tight),
    and the updated weights agree after 2 steps.

    Weights get an lr-relative tolerance (see assert_weights_match).
    """
    lr = 1e-3
    kw = {**ENGINE_KW, "lr": lr}
    base = tiny_model(seed=1)
    batches = [random_batch(8, seed=10), random_batch(8, seed=11)]
    results = {}
    for micro in (8, 4, 2, 3):
        engine = build_engine(copy.deepcopy(base), **kw)
        capture = GradCapture(engine)
        norms, grads = [], []
        for b in batches:
            norms.append(_sft_step(engine, b, micro)["grad_norm"])
            grads.append(dict(capture.grads))
        capture.close()
        results[micro] = (norms, grads, full_weights(engine))
    ref_norms, ref_grads, ref_w = results[8]
    assert ref_norms[0] > 0 and len(ref_grads[0]) == len(list(base.parameters()))
    moved = max((ref_w[k] - p.detach()).abs().max().item() for k, p in base.named_parameters())
    assert moved > 1e-3  # the steps really changed the weights
    for micro, (norms, grads, w) in results.items():
        assert norms == pytest.approx(ref_norms, rel=1e-5), f"micro={micro}"
        for step in range(2):
            for k, g in ref_grads[step].items():
                torch.testing.assert_close(grads[step][k], g, rtol=1e-5, atol=1e-7, msg=f"micro={micro} {k}")
        assert_weights_match(w, ref_w, lr=lr, steps=2)

    # Negative control: a per-micro-batch token mean (the usual accumulation bug) changes the update.
    engine = build_engine(copy.deepcopy(base), **kw)
    for b in batches:
        mbs = split_micro_batches(b, 2)
        train_step(
            engine,
            mbs,
            lambda e, mb: sft_loss_fn(e, mb, normaliser=count_label_tokens(mb["labels"]) * len(mbs)),
        )
    wrong = full_weights(engine)
    with pytest.raises(AssertionError):
        assert_weights_match(wrong, ref_w, lr=lr, steps=2)


def _nan_loss(engine, mb):
    loss, m = sft_loss_fn(engine, mb, normaliser=1.0)
    return loss + float("nan"), m


def _inf_grad_finite_loss(engine, mb):
    """The loss is finite but the gradient flowing into the logits is infinite."""
    out = engine(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"])
    logits = out.logits
    logits.register_hook(lambda g: g * float("inf"))
    loss = logits.float().logsumexp(-1).mean()
    return loss, {}


@pytest.mark.parametrize(
    ("dtype", "stage"), [("fp32", 0), ("fp32", 2), ("bf16", 0), ("bf16", 1), ("fp32", 3)]
)
def test_nonfinite_update_is_skipped(dtype: str, stage: int) -> None:
    engine = build_engine(tiny_model(seed=2), **{**ENGINE_KW, "dtype": dtype, "zero_stage": stage})
    batch = random_batch(4, seed=3)
    first = _sft_step(engine, batch, 2)
    assert first["skipped"] == 0.0
    for bad in (_nan_loss, _inf_grad_finite_loss):
        weights, opt = full_weights(engine), optimizer_tensors(engine)
        sched, skipped = engine.lr_scheduler.state_dict(), engine.skipped_steps
        m = train_step(engine, split_micro_batches(batch, 2), bad)
        assert m["skipped"] == 1.0, bad.__name__
        assert engine.skipped_steps == skipped + 1
        after = full_weights(engine)
        for k in weights:
            assert torch.equal(after[k], weights[k]), f"{bad.__name__}: {k} changed"
        assert_same_tensors(opt, optimizer_tensors(engine))
        assert engine.lr_scheduler.state_dict() == sched
    # The gradients of the skipped batch were discarded: the next good step equals a fresh engine's
    # second step on the same data.
    good = _sft_step(engine, batch, 2)
    assert good["skipped"] == 0.0
    twin = build_engine(tiny_model(seed=2), **{**ENGINE_KW, "dtype": dtype, "zero_stage": stage})
    _sft_step(twin, batch, 2)
    twin_good = _sft_step(twin, batch, 2)
    assert good["grad_norm"] == pytest.approx(twin_good["grad_norm"], rel=1e-5)
    w, tw = full_weights(engine), full_weights(twin)
    for k in w:
        torch.testing.assert_close(w[k], tw[k], atol=1e-6, rtol=0)


def test_lr_schedule_values_used_by_each_step() -> None:
    """The lr reported (and used) by update k is lr * lr_factor(k); skipped updates do not advance it."""
    batch = random_batch(2, seed=4)
    lr = 1e-2
    engine = build_engine(tiny_model(), **{**ENGINE_KW, "lr": lr, "warmup_steps": 2, "total_steps": 4})
    used = [_sft_step(engine, batch, 2)["lr"] for _ in range(2)]
    assert train_step(engine, [batch], _nan_loss)["skipped"] == 1.0
    used += [_sft_step(engine, batch, 2)["lr"] for _ in range(3)]
    assert used == pytest.approx([lr / 2, lr, lr, lr / 2, 0.0])
    engine = build_engine(tiny_model(), **{**ENGINE_KW, "lr": lr, "warmup_steps": 1}, lr_schedule="constant")
    assert [_sft_step(engine, batch, 2)["lr"] for _ in range(3)] == pytest.approx([lr] * 3)


def test_two_engines_in_one_process_are_independent() -> None:
    actor = build_engine(tiny_model(seed=5), **ENGINE_KW)
    critic = build_engine(tiny_model(seed=6), **{**ENGINE_KW, "zero_stage": 1, "lr": 5e-3})
    batch = random_batch(4, seed=7)
    a0, c0 = full_weights(actor), full_weights(critic)
    losses_a = [_sft_step(actor, batch, 2)["loss"] for _ in range(3)]
    assert all(torch.equal(full_weights(critic)[k], c0[k]) for k in c0)
    a1 = full_weights(actor)
    losses_c = [_sft_step(critic, batch, 4)["loss"] for _ in range(3)]
    assert all(torch.equal(full_weights(actor)[k], a1[k]) for k in a1)
    assert losses_a[-1] < losses_a[0] and losses_c[-1] < losses_c[0]
    # each engine's own schedule advanced 3 updates: lr * (100 - 3) / 100
    assert actor.get_lr() == pytest.approx([1e-2 * 0.97] * 2)  # two param groups (decay / no decay)
    assert critic.get_lr() == pytest.approx([5e-3 * 0.97] * 2)
    assert any(not torch.equal(a0[k], a1[k]) for k in a0)


def test_train_step_rejects_bad_inputs() -> None:
    engine = build_engine(tiny_model(), **ENGINE_KW)
    batch = random_batch(2, seed=8)
    fn = partial(sft_loss_fn, normaliser=1.0)
    with pytest.raises(ValueError, match="empty"):
        train_step(engine, [], fn)
    with pytest.raises(TypeError, match="list of micro-batches"):
        train_step(engine, batch, fn)
    with pytest.raises(ValueError, match="does not require grad"):
        train_step(engine, [batch], lambda e, mb: (torch.tensor(1.0), {}))
    with pytest.raises(ValueError, match="scalar tensor"):
        train_step(engine, [batch], lambda e, mb: (torch.ones(2, requires_grad=True), {}))
    with pytest.raises(ValueError, match="'bad'"):
        train_step(engine, [batch], lambda e, mb: (fn(e, mb)[0], {"bad": "x"}))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        build_engine("not a model", **ENGINE_KW)  # type: ignore[arg-type]
