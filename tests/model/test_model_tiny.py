"""Tiny Qwen3 builder, atomic HF save, completeness check and loading errors."""

from __future__ import annotations

import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, ViTConfig

import components.marker as marker
import components.model.tiny as tiny
from components.model.tiny import (
    MARKER_FILE,
    CheckpointError,
    build_tiny_model,
    is_complete_checkpoint,
    load_hf,
    save_hf,
)

SIZES = dict(
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    max_position_embeddings=128,
)


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok, **SIZES, seed=0)


def _state_equal(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_build_shapes_ids_and_tied_embeddings(tok, model):
    cfg = model.config
    assert cfg.model_type == "qwen3" and cfg.vocab_size == len(tok)
    assert (
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    ) == (32, 2, 2, 1, 16)
    assert cfg.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert cfg.eos_token_id == im_end and model.generation_config.eos_token_id == im_end
    assert cfg.pad_token_id == tok.pad_token_id == model.generation_config.pad_token_id
    assert model.generation_config.do_sample is False
    logits = model(torch.tensor([[1, 2, 3]])).logits  # (B, T, V)
    assert logits.shape == (1, 3, len(tok))


def test_untied_embeddings_are_two_matrices_and_stay_two_through_save_and_load(tok, tmp_path):
    untied = build_tiny_model(tok, **SIZES, seed=0, tie_embeddings=False)
    assert not untied.config.tie_word_embeddings
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    assert not torch.equal(untied.lm_head.weight, untied.model.embed_tokens.weight)
    loaded, _ = load_hf(save_hf(untied, tok, tmp_path / "untied"))
    assert not loaded.config.tie_word_embeddings and _state_equal(loaded, untied)
    assert loaded.lm_head.weight is not loaded.model.embed_tokens.weight


def test_build_is_seeded_and_leaves_global_rng_alone(tok, model):
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    same = build_tiny_model(tok, **SIZES, seed=0)
    assert torch.equal(torch.rand(3), expected_next)  # global RNG untouched by the build
    assert _state_equal(same, model)
    other = build_tiny_model(tok, **SIZES, seed=1)
    assert not torch.equal(other.model.embed_tokens.weight, model.model.embed_tokens.weight)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(num_heads=3, num_kv_heads=2), "num_heads=3 is not a multiple of num_kv_heads=2"),
        (dict(hidden_size=0), "hidden_size=0 must be a positive int"),
        (dict(head_dim=15), "head_dim=15 must be even"),
    ],
)
def test_build_rejects_bad_sizes(tok, change, message):
    with pytest.raises(ValueError, match=message):
        build_tiny_model(tok, **{**SIZES, **change}, seed=0)


def test_greedy_generation_stops_at_im_end(tok, model):
    """Force <|im_end|> at the 4th new token: generate (with the model's own config) stops right there."""
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    calls = {"n": 0}

    def force_eos(_module, _inputs, output):  # output: (B, T, V) logits
        calls["n"] += 1
        if calls["n"] == 4:
            output = output.clone()
            output[:, -1, im_end] = 1e4
        return output

    handle = model.lm_head.register_forward_hook(force_eos)
    try:
        prompt = torch.tensor([tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")])
        out = model.generate(prompt, max_new_tokens=20, attention_mask=torch.ones_like(prompt))
    finally:
        handle.remove()
    new = out[0, prompt.shape[1] :].tolist()
    assert len(new) == 4 and new[-1] == im_end and im_end not in new[:-1]


def test_save_load_round_trip(tok, model, tmp_path, calc_tool, calc_messages):
    out = save_hf(model, tok, tmp_path / "ckpt", metadata={"step": 7})
    assert out == (tmp_path / "ckpt").absolute()
    assert is_complete_checkpoint(out)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # no temporary sibling left behind
    marker = json.loads((out / MARKER_FILE).read_text())
    assert marker["metadata"] == {"step": 7} and "model.safetensors" in marker["files"]
    assert marker["files"]["config.json"] == (out / "config.json").stat().st_size

    loaded, tok2 = load_hf(out)
    assert _state_equal(loaded, model) and loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert loaded.generation_config.eos_token_id == model.generation_config.eos_token_id
    text = tok.apply_chat_template(calc_messages, tools=[calc_tool], tokenize=False)
    assert tok2.encode(text) == tok.encode(text) and tok2.chat_template == tok.chat_template
    x = torch.tensor([tok.encode(text)[:50]])
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, model(x).logits)
    # plain transformers loads it too
    assert isinstance(AutoModelForCausalLM.from_pretrained(out), type(model))
    assert AutoTokenizer.from_pretrained(out).encode(text) == tok.encode(text)


def test_crash_mid_write_leaves_nothing_that_looks_whole(tok, model, tmp_path, monkeypatch):
    """A process killed after writing the weights, before the marker: no cleanup runs."""
    monkeypatch.setattr(tiny.shutil, "rmtree", lambda *a, **k: None)  # a killed process cleans nothing

    def crash(*_a, **_k):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(tok, "save_pretrained", crash)
    target = tmp_path / "ckpt"
    with pytest.raises(KeyboardInterrupt):
        save_hf(model, tok, target)
    assert not target.exists()
    (leftover,) = list(tmp_path.iterdir())
    assert leftover.name.startswith(".ckpt.tmp-") and (leftover / "model.safetensors").is_file()
    assert not is_complete_checkpoint(leftover) and not is_complete_checkpoint(target)
    with pytest.raises(CheckpointError, match=f"{leftover}.*no {MARKER_FILE}"):
        load_hf(leftover)
    with pytest.raises(CheckpointError, match=f"{target}: it does not exist"):
        load_hf(target)


def test_crash_while_replacing_keeps_the_old_checkpoint(tok, model, tmp_path, monkeypatch):
    target = save_hf(model, tok, tmp_path / "ckpt", metadata={"step": 1})
    newer = build_tiny_model(tok, **SIZES, seed=5)

    def crash_after_weights(_tmp):
        raise OSError("disk full")

    monkeypatch.setattr(marker, "file_sizes", crash_after_weights)
    with pytest.raises(OSError, match="disk full"):
        save_hf(newer, tok, target, metadata={"step": 2})
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # the failed temp dir was cleaned up
    assert is_complete_checkpoint(target)
    assert json.loads((target / MARKER_FILE).read_text())["metadata"] == {"step": 1}
    assert _state_equal(load_hf(target)[0], model)
    # and a successful replace swaps the contents
    save_hf(newer, tok, target, metadata={"step": 2})
    assert _state_equal(load_hf(target)[0], newer)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_tampered_checkpoint_is_incomplete(tok, model, tmp_path):
    target = save_hf(model, tok, tmp_path / "ckpt")
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])  # truncated copy
    assert not is_complete_checkpoint(target)
    with pytest.raises(CheckpointError, match=f"{target}: file model.safetensors has"):
        load_hf(target)
    (target / MARKER_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_hf(target)
    (target / "tokenizer.json").unlink()
    (target / MARKER_FILE).unlink()
    with pytest.raises(CheckpointError, match=f"{target}: it has no {MARKER_FILE}"):
        load_hf(target)


def test_foreign_hf_dirs(tok, model, tmp_path):
    # A plain HF directory (no marker) loads with require_marker=False, e.g. a downloaded model.
    plain = tmp_path / "plain"
    model.save_pretrained(plain)
    tok.save_pretrained(plain)
    assert not is_complete_checkpoint(plain)
    assert _state_equal(load_hf(plain, require_marker=False)[0], model)
    # ... but not without its tokenizer
    no_tok = tmp_path / "no_tok"
    model.save_pretrained(no_tok)
    with pytest.raises(CheckpointError, match=f"{no_tok}: no usable tokenizer"):
        load_hf(no_tok, require_marker=False)
    # ... nor with a tokenizer larger than the embedding table
    tok.save_pretrained(no_tok)
    config = json.loads((no_tok / "config.json").read_text())
    (no_tok / "config.json").write_text(json.dumps({**config, "vocab_size": len(tok) - 1}))
    with pytest.raises(
        CheckpointError, match=f"{no_tok}: tokenizer has {len(tok)} tokens but the model embeds only"
    ):
        load_hf(no_tok, require_marker=False)
    # a sharded checkpoint with a shard missing is incomplete
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text(model.config.to_json_string())
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps(
            {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
        )
    )
    (sharded / "model-00001-of-00002.safetensors").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"shards missing: \['model-00002-of-00002.safetensors'\]"):
        load_hf(sharded, require_marker=False)
    # a vision encoder is not a causal LM
    vit = tmp_path / "vit"
    ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=1, intermediate_size=16
    ).save_pretrained(vit)
    (vit / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match=f"{vit}: model_type='vit' is not a causal LM"):
        load_hf(vit, require_marker=False)
    with pytest.raises(CheckpointError, match="no config.json"):
        load_hf(tmp_path, require_marker=False)


def test_save_refuses_to_replace_unrelated_directory(tok, model, tmp_path):
    precious = tmp_path / "src"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match=f"refusing to replace {precious}"):
        save_hf(model, tok, precious)
    assert (precious / "notes.txt").read_text() == "keep me"
    with pytest.raises(TypeError):
        save_hf(model, tok, tmp_path / "x", metadata={"bad": object()})
    assert not (tmp_path / "x").exists()
