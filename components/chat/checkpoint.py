"""Which model directory ``--model`` names, and whether vLLM can serve it as a chat model.

``resolve_model(value, models_root)``: ``value`` is a directory (absolute or relative to the working
directory), or a run name under ``models_root``: ``grpo-s0`` -> ``<models_root>/grpo-s0/final`` (an RL
run), ``sft`` -> ``<models_root>/sft``. The directory must hold an HF checkpoint: ``config.json``, a
tokenizer (``tokenizer.json`` or ``tokenizer_config.json``) and a chat template (``chat_template.jinja``
or one inside ``tokenizer_config.json``); a steprl completion marker, when there is one, must say the
checkpoint is complete. Every failure is a ``ValueError`` with one line naming the directory.
"""

from __future__ import annotations

import json
from pathlib import Path

from components.marker import MARKER_FILE, incomplete_reason

__all__ = ["resolve_model"]


def _runs(models_root: Path) -> list[str]:
    if not models_root.is_dir():
        return []
    return sorted(p.name for p in models_root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _has_chat_template(path: Path) -> bool:
    if (path / "chat_template.jinja").is_file():
        return True
    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))


def resolve_model(value: str, models_root: str | Path) -> Path:
    """The checkpoint directory ``value`` names (see the module docstring); ValueError if none."""
    models_root = Path(models_root)
    path = Path(value).expanduser()
    if not path.is_dir():
        found = [c for c in (models_root / value / "final", models_root / value) if value and c.is_dir()]
        if not found:
            runs = _runs(models_root)
            known = f"runs under {models_root}: {', '.join(runs)}" if runs else f"no runs under {models_root}"
            raise ValueError(f"--model {value!r} is neither a directory nor a run name ({known})")
        path = found[0]
    missing = [f for f in ("config.json",) if not (path / f).is_file()]
    if not ((path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()):
        missing.append("tokenizer.json or tokenizer_config.json")
    if missing:
        raise ValueError(f"{path} is not an HF checkpoint: no {' and no '.join(missing)}")
    if not _has_chat_template(path):
        raise ValueError(f"{path} has no chat template (chat_template.jinja or tokenizer_config.json)")
    if (path / MARKER_FILE).exists():
        reason = incomplete_reason(path)
        if reason:
            raise ValueError(f"{path} is an incomplete checkpoint: {reason}")
    return path.resolve()
