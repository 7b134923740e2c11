"""Bring your own model, end to end: a random-weight model of a real family in HF format with a chat template
in the family's shape (tests/real_arch.py) as ``model.path`` through prepare, base_model, sft, one GRPO
iteration on in-process vLLM (Qwen3 with LoRA on) and evaluate on vLLM, from a fresh workspace. The numbers do not matter; the
stages must run and every recorded step must continue the previous one token for token.
"""

from __future__ import annotations

import itertools
import json

import polars as pl
import pytest

from tests.flows.workspace import TINY, make_workspace, run
from tests.real_arch import FAMILIES, write_family

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(3600)]


@pytest.mark.parametrize(("family", "lora_rank"), [("qwen3", 4), ("llama", 0), ("mistral", 0)])
def test_family_model_runs_every_stage(tmp_path, family, lora_rank):
    model_dir = write_family(family, tmp_path / family)
    ws = make_workspace(
        tmp_path / "ws",
        {
            "model": {**TINY["model"], "path": str(model_dir), "lora": {"rank": lora_rank, "alpha": 8.0}},
            "rollout": {**TINY["rollout"], "tool_parser": FAMILIES[family].tool_parser},
            "train": {**TINY["train"], "iterations": 1},
            "evaluate": {"max_samples": 4},
        },
    )
    for stage in ("prepare", "base_model", "sft"):
        run(["python", "-m", f"flows.{stage}"], ws)
    base = json.loads((ws / "models" / "base" / "steprl_complete.json").read_text())
    assert str(model_dir) in json.dumps(base)  # copied from model.path, not the embedded default
    run(["python", "-m", "flows.train", "--algo", "grpo", "--rl-seed", "0"], ws, timeout=2400)
    run(["python", "-m", "flows.evaluate", "--model", "sft"], ws, timeout=1200)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ws / "models" / "base")
    assert tok.chat_template == FAMILIES[family].template  # the family's template travelled with the model
    batch = pl.read_parquet(ws / "runs" / "grpo-s0" / "iter_0000" / "batch.parquet")
    by_traj = batch.sort(["traj_id", "step"]).partition_by("traj_id")
    assert batch.height > 0 and by_traj
    for traj in by_traj:
        rows = traj.to_dicts()
        for a, b in itertools.pairwise(rows):
            head = list(a["prompt_ids"]) + list(a["response_ids"])
            assert list(b["prompt_ids"])[: len(head)] == head, a["traj_id"]
    assert json.loads((ws / "metrics" / "train_grpo-s0.json").read_text())["iterations"] == 1
    assert (ws / "models" / "grpo-s0" / "final" / "model.safetensors").is_file()
