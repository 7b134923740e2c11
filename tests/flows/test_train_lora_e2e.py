"""The train stage with LoRA (model.lora.rank > 0) from a fresh workspace: prepare, base_model, sft, then
one PPO iteration (actor + critic + KL reference) with adapters, on the hf rollout engine.

What a user's ``dvc exp run -S model.lora.rank=16`` runs: the stage starts, trains the adapters,
checkpoints them, and writes models/<run>/final as a plain HF model of the merged weights.
"""

from __future__ import annotations

import json

import pytest

from tests.flows.workspace import TINY, run, sft_workspace

pytestmark = pytest.mark.slow


def test_one_ppo_iteration_with_lora_writes_adapters_and_a_merged_final(tmp_path):
    ws = sft_workspace(
        tmp_path / "ws",
        {
            "model": {**TINY["model"], "lora": {"rank": 4, "alpha": 8.0}},
            "rollout": {**TINY["rollout"], "engine": "hf"},
            "train": {**TINY["train"], "iterations": 1, "kl_coef": 0.05},
        },
    )
    run(["python", "-m", "flows.train", "--algo", "ppo", "--rl-seed", "0"], ws, timeout=1200)

    ckpt = ws / "runs" / "ppo-s0" / "iter_0000" / "checkpoint"
    for part in ("actor", "critic"):
        assert (ckpt / part / "adapter_model.safetensors").is_file(), part
        assert not (ckpt / part / "model.safetensors").exists(), part
    final = ws / "models" / "ppo-s0" / "final"
    assert (final / "model.safetensors").is_file() and not (final / "adapter_config.json").exists()
    import torch
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(final)  # no peft needed
    sft = AutoModelForCausalLM.from_pretrained(ws / "models" / "sft")
    moved = max(
        (a - b).abs().max().item()
        for (_, a), (_, b) in zip(merged.state_dict().items(), sft.state_dict().items(), strict=True)
    )
    assert moved > 0, "the adapters did not change the merged weights"
    assert all(torch.isfinite(p).all() for p in merged.parameters())
    metrics = json.loads((ws / "metrics" / "train_ppo-s0.json").read_text())
    assert metrics  # the stage finished and wrote its summary

    bad = sft_workspace(
        tmp_path / "bad", {"model": {**TINY["model"], "lora": {"rank": 4, "target_modules": ["c_attn"]}}}
    )
    out = run(["python", "-m", "flows.train", "--algo", "ppo", "--rl-seed", "0"], bad, check=False)
    assert out.returncode == 2
    assert "error: train: model.lora.target_modules ['c_attn']" in out.stderr
    assert "'q_proj'" in out.stderr and not (bad / "runs" / "ppo-s0").exists()  # before any work
