"""What ``auto`` precision picks, from the CPU flags, and that other values pass through or fail clearly."""

from __future__ import annotations

import pytest
import torch

import components.precision as precision

ZEN5 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni\nbogomips\t: 5192\n"
ZEN3 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma bmi2\nbogomips\t: 5192\n"
SAPPHIRE = "flags\t\t: avx512f amx_tile amx_bf16 amx_int8\n"


@pytest.mark.parametrize(("text", "has"), [(ZEN5, True), (ZEN3, False), (SAPPHIRE, True), ("", False)])
def test_cpu_bf16_is_read_from_the_flags_line(text, has):
    assert precision.cpu_has_bf16(text) is has


@pytest.mark.parametrize(
    ("native", "train", "rollout"), [(True, "amp_bf16", "bfloat16"), (False, "fp32", "float32")]
)
def test_auto_follows_the_hardware(monkeypatch, native, train, rollout):
    monkeypatch.setattr(precision, "has_bf16", lambda device_type="cpu": native)
    assert precision.resolve_train_dtype("auto") == train
    assert precision.resolve_rollout_dtype("auto") == rollout


def test_explicit_dtypes_pass_through_and_bad_ones_are_named(monkeypatch):
    monkeypatch.setattr(precision, "has_bf16", lambda device_type="cpu": False)
    assert [precision.resolve_train_dtype(d) for d in ("fp32", "bf16", "amp_bf16")] == [
        "fp32",
        "bf16",
        "amp_bf16",
    ]
    assert precision.resolve_rollout_dtype("bfloat16") == "bfloat16"
    with pytest.raises(ValueError, match="'fp16'.*fp32, bf16, amp_bf16, auto"):
        precision.resolve_train_dtype("fp16")
    with pytest.raises(ValueError, match="'half'.*float32, bfloat16, auto"):
        precision.resolve_rollout_dtype("half")


def test_tf32_is_turned_on_only_by_auto_on_cuda(monkeypatch):
    from components.precision import use_tf32

    before = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32)
    assert use_tf32("auto", "cpu") is False  # a CPU: untouched
    assert use_tf32("auto") is False  # this machine (no CUDA): untouched
    assert use_tf32("fp32", "cuda") is False  # an explicit dtype never turns it on
    assert (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32) == before
    calls = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", calls.append)
    assert use_tf32("auto", "cuda") is True
    assert calls == ["high"]
