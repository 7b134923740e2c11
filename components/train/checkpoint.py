"""Crash-safe checkpoints of a DeepSpeed engine: HF-format model (+ tokenizer), optionally engine state.

Layout of a checkpoint directory::

    <dir>/config.json, model.safetensors, generation_config.json, tokenizer files   (HF format)
         (a LoRA model: adapter_config.json, adapter_model.safetensors instead of the weights)
    <dir>/ds/...                      DeepSpeed state (optimizer, scheduler, counters), optional
    <dir>/steprl_complete.json        completion marker, written last

What it does:
- ``save_checkpoint``: every rank takes part (ZeRO-3 weights are gathered, DeepSpeed writes each rank's
  shard); rank 0 writes into a hidden temporary sibling ``.<name>.tmp-<tag>``, fsyncs, writes the
  marker (file names and sizes) last, then renames it into place. An existing checkpoint at the
  target is replaced only after the new one is complete (rename aside, rename in, delete old); an
  exception mid-write deletes the temporary directory and leaves the old checkpoint untouched.
- ``is_complete`` / ``check_complete``: whether a directory has a marker whose files are all there
  with the recorded sizes; ``check_complete`` raises :class:`CheckpointError` naming the directory.
- ``load_model``: the HF model (+ tokenizer when saved) from a complete checkpoint.
- ``load_engine_state``: restore weights, optimizer, scheduler and step counters into an engine
  built with the same settings, for an exact resume.

The marker has the same name and format as the one ``components.model.tiny.save_hf`` writes
(``{"format": "steprl-hf-checkpoint/1", "files": {path: bytes}, "metadata": {...}}``), so either
module's loader accepts the other's checkpoints.

What it does not do: keep several checkpoints / rotate them, or write anywhere but a filesystem that
all ranks share (multi-node training needs a shared directory). The HF weights are the engine
module's weights in the engine dtype (bf16 engines save bf16 weights; the fp32 master copy lives in
``ds/``). For a moment during replacement no directory exists at the target (never a partial one).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

from components.marker import (
    MARKER_FILE,
    MARKER_FORMAT,
    CheckpointError,
    check_target,
    incomplete_reason,
    seal,
)
from components.train.distributed import dp_rank_world
from components.train.zero3 import gathered

__all__ = [
    "DS_SUBDIR",
    "MARKER_FILE",
    "MARKER_FORMAT",
    "CheckpointError",
    "check_complete",
    "is_complete",
    "load_engine_state",
    "load_model",
    "read_metadata",
    "save_checkpoint",
]

DS_SUBDIR = "ds"
_DS_TAG = "state"
_CLIENT_KEY = "steprl_client_state"  # DeepSpeed returns its own keys too; ours live under this one


def _barrier() -> None:
    if dp_rank_world()[1] > 1:
        torch.distributed.barrier()


def _broadcast_str(value: str) -> str:
    if dp_rank_world()[1] == 1:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def save_checkpoint(
    engine: Any,
    out_dir: str | os.PathLike,
    *,
    tokenizer: Any | None = None,
    save_engine_state: bool = False,
    metadata: dict[str, Any] | None = None,
    client_state: dict[str, Any] | None = None,
    hf_model: Any | None = None,
) -> Path:
    """Write ``engine``'s model (+ ``tokenizer``, + DeepSpeed state) to ``out_dir`` atomically.

    Call on every rank. ``metadata`` (JSON-serialisable) is stored in the marker, e.g.
    ``{"step": 40}``; ``client_state`` is stored with the DeepSpeed state and returned by
    :func:`load_engine_state`. ``hf_model``: what writes the HF files instead of ``engine.module``
    (a ``peft.PeftModel`` around it writes its adapters alone). A model with frozen parameters (LoRA)
    keeps only its trained ones in the DeepSpeed state: the frozen ones are those it was built from.
    Returns ``out_dir`` as an absolute Path.
    """
    module = engine.module if hf_model is None else hf_model
    if not hasattr(module, "save_pretrained"):
        raise CheckpointError(
            f"cannot save {type(module).__name__} to {out_dir}: "
            "it is not a transformers model (no save_pretrained)"
        )
    if client_state is not None and not save_engine_state:
        raise CheckpointError(f"client_state given for {out_dir} but save_engine_state=False would drop it")
    out = Path(out_dir).absolute()
    check_target(out)  # every rank sees the same filesystem: all raise, or none does
    try:
        meta = json.loads(json.dumps(metadata or {}))
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"metadata for {out} is not JSON-serialisable: {err}") from None
    rank, _ = dp_rank_world()
    tag = _broadcast_str(f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp = out.parent / f".{out.name}.tmp-{tag}"
    old = out.parent / f".{out.name}.old-{tag}"
    try:
        if rank == 0:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()
        with gathered(engine):
            if rank == 0:
                module.save_pretrained(tmp)
                if tokenizer is not None:
                    tokenizer.save_pretrained(tmp)
        _barrier()
        if save_engine_state:
            engine.save_checkpoint(
                str(tmp / DS_SUBDIR),
                tag=_DS_TAG,
                client_state={_CLIENT_KEY: dict(client_state or {})},
                exclude_frozen_parameters=_has_frozen(engine),
            )
        _barrier()
        if rank == 0:
            seal(tmp, out, old, meta)
        _barrier()
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _has_frozen(engine: Any) -> bool:
    return any(not p.requires_grad for p in engine.module.parameters())


def is_complete(path: str | os.PathLike) -> bool:
    """True when ``path`` is a checkpoint written to the end (marker present, every file intact)."""
    return incomplete_reason(Path(path).absolute()) is None


def check_complete(path: str | os.PathLike) -> Path:
    """``path`` as an absolute Path if complete; else :class:`CheckpointError` naming it and why."""
    p = Path(path).absolute()
    reason = incomplete_reason(p)
    if reason is not None:
        raise CheckpointError(f"checkpoint {p} is not usable: {reason}")
    return p


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The ``metadata`` stored in a complete checkpoint's marker."""
    p = check_complete(path)
    return dict(json.loads((p / MARKER_FILE).read_text()).get("metadata", {}))


def load_model(path: str | os.PathLike, *, dtype: torch.dtype = torch.float32) -> tuple[Any, Any | None]:
    """``(model, tokenizer or None)`` from a complete checkpoint; the tokenizer is None if none was saved."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = check_complete(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(p, dtype=dtype)
    except Exception as err:
        raise CheckpointError(f"checkpoint {p}: model failed to load ({err})") from err
    if not (p / "tokenizer_config.json").is_file():
        return model, None
    try:
        tokenizer = AutoTokenizer.from_pretrained(p)
    except Exception as err:
        raise CheckpointError(f"checkpoint {p}: tokenizer failed to load ({err})") from err
    return model, tokenizer


def load_engine_state(engine: Any, path: str | os.PathLike) -> dict[str, Any]:
    """Restore weights, optimizer, LR schedule and counters saved with ``save_engine_state=True``.

    ``engine`` must be built with the same model shape, ZeRO stage and world size (and with frozen
    parameters, LoRA, from the same base: those are not in the state). Call on every rank. Returns
    the ``client_state`` given at save time.
    """
    p = check_complete(path)
    ds_dir = p / DS_SUBDIR
    if not (ds_dir / _DS_TAG).is_dir():
        raise CheckpointError(
            f"checkpoint {p} has no engine state ({DS_SUBDIR}/): it was saved with save_engine_state=False"
        )
    load_path, client_state = engine.load_checkpoint(
        str(ds_dir),
        tag=_DS_TAG,
        load_optimizer_states=True,
        load_lr_scheduler_states=True,
        load_module_strict=not _has_frozen(engine),
    )
    if load_path is None:
        raise CheckpointError(f"checkpoint {p}: DeepSpeed could not load the engine state from {ds_dir}")
    return dict((client_state or {}).get(_CLIENT_KEY, {}))
