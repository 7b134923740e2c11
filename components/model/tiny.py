"""The embedded default model, and crash-safe saving/loading of HF-format checkpoints.

What it does:
- ``build_tiny_model``: a randomly initialised, seeded Qwen3-architecture causal LM sized by flat
  arguments, with tied input/output embeddings (or untied), special-token ids taken from the
  tokenizer and a generation config whose EOS is the tokenizer's end-of-turn token (``<|im_end|>``
  for ours), so greedy generation stops at the end of an assistant turn in transformers and in vLLM
  alike.
- ``save_hf``: writes model + tokenizer (+ generation config) into a temporary sibling directory,
  fsyncs them, writes the completion marker ``steprl_complete.json`` (file names and sizes) last, and
  only then renames the directory into place. An interrupted write leaves a hidden ``.<name>.tmp-*``
  sibling and never a directory at ``out_dir`` that looks whole.
- ``is_complete_checkpoint`` / ``load_hf``: check the marker against the files, load model and
  tokenizer, and raise :class:`CheckpointError` naming the directory when it is missing, incomplete
  or not a causal LM.

What it does not do: train, shard across processes, or save optimizer state (``components.train``).
Replacing an existing checkpoint at ``out_dir`` is a rename-aside then rename-in: for a moment no
directory exists at ``out_dir`` (never a half-written one).

transformers' model classes are imported by the functions that build or load a model, not with this
module (importing them costs several times ``import torch``: docs/performance.md): a stage that only
checks or saves checkpoints (``is_complete_checkpoint``, ``save_hf``) does not pay for them.
``build_tiny_model`` imports the Qwen3 classes it builds; ``load_hf`` the Auto classes, since a
``model.path`` may hold any causal-LM architecture.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from components.marker import MARKER_FILE, CheckpointError, check_target, incomplete_reason, seal

__all__ = [
    "MARKER_FILE",
    "CheckpointError",
    "build_tiny_model",
    "is_complete_checkpoint",
    "load_hf",
    "save_hf",
]

if TYPE_CHECKING:
    from transformers import PreTrainedModel, Qwen3ForCausalLM

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


def build_tiny_model(
    tokenizer: Any,
    *,
    hidden_size: int,
    intermediate_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    max_position_embeddings: int,
    seed: int,
    tie_embeddings: bool = True,
) -> Qwen3ForCausalLM:
    """A seeded, randomly initialised Qwen3 causal LM whose vocabulary is ``len(tokenizer)``.

    ``tie_embeddings``: one matrix for the input embeddings and the output layer (as Qwen3's small
    models), or two.

    The global torch RNG is left as it was (initialisation runs under a forked RNG).
    """
    from transformers import GenerationConfig
    from transformers.models.qwen3 import Qwen3Config, Qwen3ForCausalLM

    sizes = dict(
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
    )
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    if head_dim % 2:
        raise ValueError(f"head_dim={head_dim} must be even (rotary embeddings rotate pairs)")
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise ValueError("tokenizer has no eos_token: generation would never stop")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    bos_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else pad_id

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_embeddings,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id, do_sample=False
    )
    return model


def save_hf(
    model: PreTrainedModel, tokenizer: Any, out_dir: str | os.PathLike, *, metadata: dict | None = None
) -> Path:
    """Write model + tokenizer to ``out_dir`` atomically; returns ``out_dir`` as a Path.

    ``metadata`` (JSON-serialisable) is stored in the completion marker, e.g. ``{"step": 40}``.
    An existing ``out_dir`` is replaced only if it is empty or looks like a checkpoint (has a marker
    or a ``config.json``), so a wrong path cannot wipe an unrelated directory.
    """
    out = Path(out_dir).absolute()
    check_target(out)
    meta = json.loads(json.dumps(metadata or {}))  # fail before writing anything if not JSON-able
    out.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = out.parent / f".{out.name}.tmp-{tag}"
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        seal(tmp, out, out.parent / f".{out.name}.old-{tag}", meta)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    """True when ``path`` holds a checkpoint written to the end by :func:`save_hf`."""
    return incomplete_reason(Path(path)) is None


def _hf_weights_reason(path: Path) -> str | None:
    """For a directory without our marker: why its HF weights are incomplete, or None."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = path / index_name
        if index.is_file():
            try:
                shards = set(json.loads(index.read_text())["weight_map"].values())
            except (ValueError, KeyError, TypeError) as err:
                return f"its {index_name} is unreadable ({err})"
            missing = sorted(s for s in shards if not (path / s).is_file())
            return f"weight shards missing: {missing}" if missing else None
    if (path / "model.safetensors").is_file() or (path / "pytorch_model.bin").is_file():
        return None
    return "it has no model weights (model.safetensors or pytorch_model.bin)"


def load_hf(
    path: str | os.PathLike, *, dtype: torch.dtype = torch.float32, require_marker: bool = True
) -> tuple[PreTrainedModel, Any]:
    """Load ``(model, tokenizer)`` from an HF directory; raise :class:`CheckpointError` naming it.

    ``require_marker=True`` (our own checkpoints) demands a complete :func:`save_hf` marker;
    ``False`` accepts any HF causal-LM directory (e.g. a downloaded Qwen2.5), checking only that its
    config, weight files and tokenizer are there.
    """
    p = Path(path).absolute()
    if require_marker:
        reason = incomplete_reason(p)
    elif not p.is_dir():
        reason = "it does not exist" if not p.exists() else "it is not a directory"
    elif not (p / "config.json").is_file():
        reason = "it has no config.json"
    else:
        reason = _hf_weights_reason(p)
    if reason is not None:
        raise CheckpointError(f"cannot load checkpoint {p}: {reason}")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(p)
    except Exception as err:
        raise CheckpointError(
            f"cannot load checkpoint {p}: config.json is not a model config ({err})"
        ) from err
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise CheckpointError(
            f"cannot load checkpoint {p}: model_type={config.model_type!r} is not a causal LM"
        )
    # transformers 5 silently builds an empty tokenizer when the files are missing: look first.
    if not any((p / name).is_file() for name in _TOKENIZER_FILES):
        raise CheckpointError(
            f"cannot load checkpoint {p}: no usable tokenizer (none of {list(_TOKENIZER_FILES)})"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(p)
    except Exception as err:
        raise CheckpointError(f"cannot load checkpoint {p}: no usable tokenizer ({err})") from err
    vocab = getattr(config, "vocab_size", None) or getattr(config.get_text_config(), "vocab_size", None)
    if vocab is not None and len(tokenizer) > vocab:
        raise CheckpointError(
            f"cannot load checkpoint {p}: tokenizer has {len(tokenizer)} tokens but the model embeds only {vocab}"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(p, dtype=dtype)
    except Exception as err:
        raise CheckpointError(f"cannot load checkpoint {p}: model weights failed to load ({err})") from err
    return model, tokenizer
