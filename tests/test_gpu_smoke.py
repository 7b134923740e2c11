"""benchmarks/gpu_smoke.py (``make gpu-smoke``) off a GPU: its cases are wired to the ZeRO stage and
LoRA settings they name, and without CUDA it stops with its message before loading anything."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from benchmarks.gpu_smoke import CASES, case_settings
from components.train.lora import LoraSettings
from flows import REPO
from tests.make_dry_run import make_n

TARGETS = ["q_proj", "v_proj"]


def test_each_case_sets_the_zero_stage_and_lora_it_names():
    assert CASES == ("default", "zero3", "lora")
    off = case_settings(1, None, TARGETS)
    assert set(off) == set(CASES)
    assert off["default"] == (1, None) and off["zero3"] == (3, None)
    assert off["lora"] == (1, LoraSettings(rank=16, alpha=32.0, target_modules=("q_proj", "v_proj")))
    mine = LoraSettings(rank=4, alpha=8.0, target_modules=("q_proj",))
    on = case_settings(2, mine, TARGETS)  # params.yaml's adapters in every case
    assert on == {"default": (2, mine), "zero3": (3, mine), "lora": (2, mine)}


def _smoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "benchmarks/gpu_smoke.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the smoke test itself")
def test_without_cuda_every_case_stops_with_the_message_before_any_work(tmp_path):
    out = _smoke("--cases", "default,zero3,lora", "--model", str(tmp_path / "absent"))
    assert out.returncode == 1
    assert out.stderr.strip().endswith(
        "gpu-smoke: no CUDA device (torch.cuda.is_available() is False): this needs a GPU machine "
        "set up with `make setup EXTRA=gpu`; nothing was run."
    )


def test_an_unknown_case_is_named_with_the_known_ones():
    out = _smoke("--cases", "zero3,lorra")
    assert out.returncode == 1
    assert "gpu-smoke: --cases zero3,lorra: unknown ['lorra'] (known: default, zero3, lora)" in out.stderr


def _make_n(*args: str) -> str:
    """The command ``make -n`` prints for the target (the last line)."""
    return make_n(*args, drop=("MODEL", "CASES")).strip().splitlines()[-1]


def test_make_passes_the_cases_on_and_defaults_to_models_base():
    # make chat's default run name (MODEL ?= grpo-s0, once global) reached gpu-smoke as --model grpo-s0
    assert _make_n("gpu-smoke") == "python benchmarks/gpu_smoke.py"
    assert _make_n("gpu-smoke", "CASES=zero3,lora") == "python benchmarks/gpu_smoke.py  --cases zero3,lora"
    assert _make_n("gpu-smoke", "MODEL=/m") == "python benchmarks/gpu_smoke.py --model /m"
    assert _make_n("chat") == "python -m flows.chat --model grpo-s0"
    assert _make_n("chat", "MODEL=ppo-s1") == "python -m flows.chat --model ppo-s1"
