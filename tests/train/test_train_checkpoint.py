"""Checkpoints: HF round trip, atomic replacement, interrupted writes, refusals, exact resume, ZeRO-3."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from train_helpers import ENGINE_KW, full_weights, random_batch, tiny_model, tiny_tokenizer

from components.train.checkpoint import (
    MARKER_FILE,
    CheckpointError,
    check_complete,
    is_complete,
    load_engine_state,
    load_model,
    read_metadata,
    save_checkpoint,
)
from components.train.engine import build_engine
from components.train.sft import run_sft, split_micro_batches

PROBE = torch.tensor([[5, 9, 17, 33, 64, 100, 127, 4]])


def _logits(model: torch.nn.Module) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=PROBE).logits


def _train(engine, steps: int, seed: int = 0) -> None:
    batches = [split_micro_batches(random_batch(4, seed=seed + i), 2) for i in range(steps)]
    run_sft(engine, batches, steps=steps, progress=False)


@pytest.fixture(scope="module")
def trained() -> object:
    """An fp32 ZeRO-0 engine after 2 SFT steps (shared: tests that train it further build their own)."""
    engine = build_engine(tiny_model(seed=1), **ENGINE_KW)
    _train(engine, 2)
    return engine


def test_round_trip_identical_logits_tokenizer_and_metadata(trained, tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    out = save_checkpoint(trained, tmp_path / "ckpt", tokenizer=tok, metadata={"step": 2, "stage": "sft"})
    assert out == (tmp_path / "ckpt").absolute()
    assert is_complete(out) and check_complete(out) == out
    assert read_metadata(out) == {"step": 2, "stage": "sft"}
    marker = json.loads((out / MARKER_FILE).read_text())
    assert marker["format"] == "steprl-hf-checkpoint/1"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(marker["files"])
    model, tok2 = load_model(out)
    assert torch.equal(_logits(model), _logits(trained.module))
    assert tok2 is not None and tok2("w5 w77 w127")["input_ids"] == tok("w5 w77 w127")["input_ids"]
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary siblings left
    # without a tokenizer, load_model returns None for it
    save_checkpoint(trained, tmp_path / "no_tok")
    assert load_model(tmp_path / "no_tok")[1] is None


def test_replace_existing_only_when_new_is_complete(tmp_path: Path) -> None:
    engine = build_engine(tiny_model(seed=2), **ENGINE_KW)
    target = tmp_path / "latest"
    save_checkpoint(engine, target, metadata={"step": 0})
    old_logits = _logits(load_model(target)[0])
    _train(engine, 1)
    save_checkpoint(engine, target, metadata={"step": 1})
    assert read_metadata(target) == {"step": 1}
    new_logits = _logits(load_model(target)[0])
    assert torch.equal(new_logits, _logits(engine.module)) and not torch.equal(new_logits, old_logits)
    assert [p.name for p in tmp_path.iterdir()] == ["latest"]


@pytest.mark.parametrize("where", ["model", "tokenizer", "engine_state", "rename"])
def test_interrupted_save_keeps_previous_checkpoint(trained, tmp_path: Path, monkeypatch, where: str) -> None:
    target = tmp_path / "ckpt"
    tok = tiny_tokenizer()
    save_checkpoint(trained, target, tokenizer=tok, metadata={"step": 2})
    before = _logits(load_model(target)[0])

    class Boom(RuntimeError):
        pass

    def half_write(obj, real):
        def fail(directory, *args, **kwargs):
            real(directory, *args, **kwargs)  # some files land on disk ...
            (Path(directory) / "partial.bin").write_bytes(b"\0" * 100)
            raise Boom(f"disk full while writing {where}")  # ... then the write dies

        return fail

    if where == "model":
        module = trained.module
        monkeypatch.setattr(module, "save_pretrained", half_write(module, module.save_pretrained))
    elif where == "tokenizer":
        monkeypatch.setattr(tok, "save_pretrained", half_write(tok, tok.save_pretrained))
    elif where == "engine_state":
        monkeypatch.setattr(trained, "save_checkpoint", half_write(trained, trained.save_checkpoint))
    else:  # the old checkpoint was renamed aside, then renaming the new one into place fails
        import components.train.checkpoint as ckpt_mod

        real_rename = ckpt_mod.os.rename

        def rename(src, dst):
            if ".tmp-" in str(src):
                raise Boom("rename failed")
            real_rename(src, dst)

        monkeypatch.setattr(ckpt_mod.os, "rename", rename)
    with pytest.raises(Boom):
        save_checkpoint(trained, target, tokenizer=tok, save_engine_state=True, metadata={"step": 3})
    monkeypatch.undo()
    # the old checkpoint is untouched and still the only directory there
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    assert is_complete(target) and read_metadata(target) == {"step": 2}
    assert torch.equal(_logits(load_model(target)[0]), before)


def test_incomplete_directories_are_refused_by_name(trained, tmp_path: Path) -> None:
    good = save_checkpoint(trained, tmp_path / "good", tokenizer=tiny_tokenizer())
    # a hard kill before the marker was written
    no_marker = tmp_path / "killed"
    shutil.copytree(good, no_marker)
    (no_marker / MARKER_FILE).unlink()
    assert not is_complete(no_marker)
    with pytest.raises(CheckpointError, match=rf"{no_marker}.*no {MARKER_FILE}"):
        load_model(no_marker)
    # a truncated weight file
    truncated = tmp_path / "truncated"
    shutil.copytree(good, truncated)
    with open(truncated / "model.safetensors", "r+b") as fh:
        fh.truncate(100)
    with pytest.raises(CheckpointError, match=r"model\.safetensors has 100 bytes"):
        check_complete(truncated)
    # a deleted file
    missing = tmp_path / "missing"
    shutil.copytree(good, missing)
    (missing / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json listed in .* is missing"):
        load_model(missing)
    # a garbage marker
    garbage = tmp_path / "garbage"
    shutil.copytree(good, garbage)
    (garbage / MARKER_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        read_metadata(garbage)
    with pytest.raises(CheckpointError, match="does not exist"):
        check_complete(tmp_path / "nowhere")
    assert not is_complete(tmp_path / "nowhere")


def test_save_refusals_write_nothing(trained, tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        save_checkpoint(trained, precious)
    assert (precious / "notes.txt").read_text() == "keep me"
    with pytest.raises(CheckpointError, match="not JSON-serialisable"):
        save_checkpoint(trained, tmp_path / "x", metadata={"bad": object()})
    with pytest.raises(CheckpointError, match="client_state"):
        save_checkpoint(trained, tmp_path / "x", client_state={"step": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["precious"]
    engine_like = type("E", (), {"module": torch.nn.Linear(2, 2)})()
    with pytest.raises(CheckpointError, match="not a transformers model"):
        save_checkpoint(engine_like, tmp_path / "y")


def test_resume_equals_uninterrupted_run(tmp_path: Path) -> None:
    """2 steps, save with engine state, 2 more == fresh engine + load_engine_state + the same 2 steps."""
    kw = {**ENGINE_KW, "warmup_steps": 2, "total_steps": 6}
    engine = build_engine(tiny_model(seed=3), **kw)
    _train(engine, 2, seed=0)
    ckpt = save_checkpoint(engine, tmp_path / "ck", save_engine_state=True, client_state={"data_pos": 2})
    _train(engine, 2, seed=2)
    uninterrupted = full_weights(engine)

    model, _ = load_model(ckpt)
    resumed = build_engine(model, **kw)
    assert load_engine_state(resumed, ckpt) == {"data_pos": 2}
    _train(resumed, 2, seed=2)
    w = full_weights(resumed)
    for k in uninterrupted:
        assert torch.equal(w[k], uninterrupted[k]), k
    assert resumed.get_lr() == engine.get_lr()
    assert resumed.lr_scheduler.state_dict()["last_epoch"] == 4
    assert engine.lr_scheduler.state_dict()["last_epoch"] == 4

    with pytest.raises(CheckpointError, match="no engine state"):
        load_engine_state(resumed, save_checkpoint(engine, tmp_path / "hf_only"))


def test_zero3_save_gathers_full_weights(tmp_path: Path) -> None:
    model = tiny_model(seed=4)
    expected = _logits(model)
    engine = build_engine(model, **{**ENGINE_KW, "zero_stage": 3})
    out = save_checkpoint(engine, tmp_path / "z3", tokenizer=tiny_tokenizer(), save_engine_state=True)
    loaded, _ = load_model(out)
    torch.testing.assert_close(_logits(loaded), expected, atol=1e-6, rtol=1e-6)
    assert (out / "ds" / "state").is_dir()
