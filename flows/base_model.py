"""Stage `base_model`: the starting policy in HF format at models/base.

Either `model.path` (any local HF causal-LM directory, checked and re-saved) or the embedded default:
a byte-level BPE tokenizer trained on the task's training conversations and a small Qwen3 model.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
from prefect import flow, task

from components.config import ModelParams, Params
from components.envs import get_task
from components.envs.tool_formats import check_chat_template
from components.model.tiny import build_tiny_model, load_hf, save_hf
from components.model.tokenizer import build_tokenizer
from flows import REPO, processed
from flows._stage import StageError, read_params, repo_path, stage_main

OUT = REPO / "models" / "base"


def conversation_corpus(params: Params) -> list[str]:
    """Training conversations (prompt + each demonstration of a row) rendered with the embedded chat template."""
    spec = get_task(params.task)
    rows = pl.read_parquet(processed(params.task) / "train.parquet").to_dicts()
    # bytes only: used just to render the template (in the tool-call format of rollout.tool_parser)
    bootstrap = build_tokenizer([], vocab_size=300, tool_parser=params.rollout.tool_parser)
    return [
        bootstrap.apply_chat_template(spec.initial_messages(row) + demo, tools=spec.tools(), tokenize=False)
        for row in rows
        if row["expert"]
        for demo in spec.demonstrations(row)
    ]


@task
def build_default(params: Params) -> str:
    m: ModelParams = params.model
    tokenizer = build_tokenizer(
        conversation_corpus(params), vocab_size=m.vocab_size, tool_parser=params.rollout.tool_parser
    )
    model = build_tiny_model(
        tokenizer,
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        num_kv_heads=m.num_kv_heads,
        head_dim=m.head_dim,
        max_position_embeddings=m.max_position_embeddings,
        seed=params.seed,
        tie_embeddings=m.tie_embeddings,
    )
    n = sum(p.numel() for p in model.parameters())
    print(f"embedded default: vocab {len(tokenizer)}, {n / 1e6:.2f}M parameters")
    return str(save_hf(model, tokenizer, OUT, metadata={"source": "embedded", "parameters": n}))


@task
def copy_local(path: str) -> str:
    model, tokenizer = load_hf(path, require_marker=False)
    return str(save_hf(model, tokenizer, OUT, metadata={"source": path}))


@flow(name="base_model", log_prints=True)
def base_model_flow(params: Params) -> str:
    out = copy_local(str(repo_path(params.model.path))) if params.model.path else build_default(params)
    print(f"base model written to {out}")
    return out


def check_template(model_dir: Path, tool_parser: str, *, tools: bool = True) -> None:
    """StageError unless ``model_dir`` has a chat template and, for a task with ``tools``, it lists the
    tools and writes tool calls ``tool_parser`` reads (SFT renders its demonstrations with that
    template; the rollout parses them with that parser)."""
    from transformers import AutoTokenizer

    try:
        check_chat_template(AutoTokenizer.from_pretrained(model_dir), tool_parser, tools=tools)
    except ValueError as err:
        raise StageError(f"{model_dir}: {err}") from None


def main(params: str) -> None:
    p = read_params(params)
    if p.model.path:  # check before any work: a missing or broken model directory is one clear line
        path = repo_path(p.model.path)
        if not path.is_dir():
            raise StageError(f"model.path: {p.model.path!r} is not a directory")
        if not (path / "config.json").is_file():
            raise StageError(f"model.path: {p.model.path!r} has no config.json (not an HF model directory)")
        check_template(path, p.rollout.tool_parser, tools=bool(get_task(p.task).tools()))
    base_model_flow(p)


if __name__ == "__main__":
    stage_main(main)
