"""The GPU pre-flight (flows._gpu, components.gpu_memory) and the out-of-memory line of stage_main.

No GPU is needed: the pre-flight reads the device through ``on_cuda`` and ``torch.cuda.mem_get_info``
and the checkpoint through ``count_parameters``, all replaced here by figures of real cards and models
(an 80 GiB H100, Qwen2.5-7B's 7.6B parameters, Qwen2.5-0.5B's 0.49B).
"""

from __future__ import annotations

import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

import flows._gpu as gpu
import flows._stage as stage
from components.config import load_params
from components.gpu_memory import HEADROOM_BYTES, GiB, count_parameters, plan_gpu_memory
from flows import REPO
from flows._stage import StageError, stage_main


def test_count_parameters_counts_the_checkpoint_without_loading_it(tmp_path):
    cfg = Qwen3Config(
        vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, tie_word_embeddings=True,
    )  # fmt: skip
    cfg.save_pretrained(tmp_path)  # config.json only: no weights to load
    expected = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
    assert count_parameters(tmp_path) == expected


def test_plan_by_hand():
    n = 1_000_000_000
    kw = dict(
        trained_models=2, train_dtype="fp32", reference=True, rollout_engine="vllm",
        rollout_dtype="bfloat16", vllm_share=0.25,
    )  # fmt: skip
    plan = plan_gpu_memory(n, free=70 * GiB, total=80 * GiB, **kw)
    assert plan.trainer_needs == 2 * 16 * n + 4 * n + HEADROOM_BYTES  # 34.5 GiB
    assert plan.vllm_needs == 2 * n
    assert plan.vllm_room == 20 * GiB and plan.trainer_room == 50 * GiB
    assert plan.vllm_fits and plan.trainer_fits
    crowded = plan_gpu_memory(n, free=50 * GiB, total=80 * GiB, **kw)  # another process holds 30 GiB
    assert crowded.trainer_room == 30 * GiB and not crowded.trainer_fits
    starved = plan_gpu_memory(n, free=70 * GiB, total=80 * GiB, **{**kw, "vllm_share": 0.02})
    assert not starved.vllm_fits  # 1.6 GiB < 1.86 GiB of bf16 weights


def test_plan_hf_engine_weights_count_against_the_trainer_and_eval_needs_no_trainer():
    n = 10**9
    hf = plan_gpu_memory(n, free=80 * GiB, total=80 * GiB, trained_models=1, rollout_engine="hf")
    assert hf.trainer_needs == 16 * n + 2 * n + HEADROOM_BYTES and hf.vllm_share == 0.0
    ev = plan_gpu_memory(
        n, free=80 * GiB, total=80 * GiB, trained_models=0, rollout_engine="vllm", vllm_share=0.3
    )
    assert ev.trainer_needs == 0 and ev.trainer_fits and ev.vllm_fits


@pytest.fixture
def h100(monkeypatch):
    """Pretend to be on an 80 GiB GPU with 79 GiB free; returns a setter for the checkpoint's size."""
    calls = []
    monkeypatch.setattr(gpu, "on_cuda", lambda: True)
    monkeypatch.setattr(gpu, "stage_device", lambda: torch.device("cuda", 0))
    monkeypatch.setattr(
        torch.cuda, "mem_get_info", lambda device=None: calls.append(device) or (79 * GiB, 80 * GiB)
    )
    monkeypatch.setattr("components.precision.has_bf16", lambda device_type="cpu": True)

    def size(n: int) -> None:
        monkeypatch.setattr(gpu, "count_parameters", lambda model_dir: n)

    size.calls = calls
    return size


def params(**rollout):
    """params.yaml with a 7B model.path and bf16 rollout (``auto`` on a bf16 GPU), as a GPU user sets."""
    rollout = {"dtype": "auto", **rollout}
    p = load_params(REPO / "params.yaml")
    return p.model_copy(
        update={
            "model": p.model.model_copy(update={"path": "/models/Qwen2.5-7B-Instruct"}),
            "rollout": p.rollout.model_copy(update=rollout),
        }
    )


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_a_model_too_big_for_the_gpu_names_model_path(h100):
    h100(7_620_000_000)
    with pytest.raises(StageError) as err:
        gpu.check_gpu_memory(params(), "models/sft", trained_models=2, rollout=True)
    text = one_line(err)
    assert text.startswith(
        "model.path=/models/Qwen2.5-7B-Instruct (7.62B parameters) needs at least 228.1 GiB"
    )
    assert "rollout.gpu_memory_utilization=0.3 reserves 24.0 GiB" in text  # the trainer gets the rest
    with pytest.raises(StageError) as err:  # fp32 rollout: vLLM's share cannot hold 28.4 GiB of weights
        gpu.check_gpu_memory(params(dtype="float32"), "models/sft", trained_models=2, rollout=True)
    assert one_line(err).startswith("rollout.gpu_memory_utilization=0.3 gives vLLM 24.0 GiB")
    with pytest.raises(StageError, match="model.path"):  # SFT alone: 122 GB of training state > 79 GiB
        gpu.check_gpu_memory(params(), "models/base", trained_models=1)


def test_a_vllm_share_that_starves_vllm_or_the_trainer_names_the_share(h100):
    h100(1_540_000_000)  # Qwen2.5-1.5B: 24.6 GB actor state, 3.1 GB of bf16 weights for vLLM
    gpu.check_gpu_memory(params(gpu_memory_utilization=0.3), "models/sft", trained_models=1, rollout=True)
    with pytest.raises(StageError) as err:
        gpu.check_gpu_memory(
            params(gpu_memory_utilization=0.02), "models/sft", trained_models=1, rollout=True
        )
    assert one_line(err).startswith("rollout.gpu_memory_utilization=0.02 gives vLLM 1.6 GiB")
    with pytest.raises(StageError) as err:  # critic + actor = 49 GB beside vLLM's 72 GiB
        gpu.check_gpu_memory(params(gpu_memory_utilization=0.9), "models/sft", trained_models=2, rollout=True)
    text = one_line(err)
    assert (
        "rollout.gpu_memory_utilization=0.9 reserves 72.0 GiB" in text and "lower rollout.gpu_memory" in text
    )


def test_a_model_that_fits_passes(h100):
    h100(494_000_000)  # Qwen2.5-0.5B: PPO (actor + critic) + KL reference + vLLM on one H100
    gpu.check_gpu_memory(params(), "models/sft", trained_models=2, reference=True, rollout=True)
    gpu.check_gpu_memory(params(engine="hf"), "models/sft", trained_models=2, reference=True, rollout=True)
    assert len(h100.calls) == 2 and h100.calls[0] == torch.device("cuda", 0)


def test_on_cpu_nothing_is_measured(monkeypatch):
    monkeypatch.setattr(gpu, "on_cuda", lambda: False)
    monkeypatch.setattr(
        torch.cuda, "mem_get_info", lambda device=None: pytest.fail("measured a GPU on a CPU")
    )
    monkeypatch.setattr(gpu, "count_parameters", lambda model_dir: pytest.fail("counted on a CPU"))
    gpu.check_gpu_memory(params(), "models/sft", trained_models=2, rollout=True)


def test_an_out_of_memory_error_ends_the_stage_with_one_line(monkeypatch, capsys):
    def run(params: str) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.\nGPU 0 has ...")

    monkeypatch.setattr(stage, "make_stage_deterministic", lambda params: None)
    monkeypatch.setattr(sys, "argv", ["flows.train", "--params", "params.yaml"])
    with pytest.raises(SystemExit) as exit_:
        stage_main(run)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: out of GPU memory (CUDA out of memory. Tried")
    assert "train.micro_batch_size" in err[0] and "rollout.gpu_memory_utilization" in err[0]


# --- LoRA (model.lora) -----------------------------------------------------------------------------
# Qwen2.5-7B's shapes (config.json only: counted on the meta device, nothing downloaded or loaded)
QWEN25_7B = dict(
    vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
    num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False,
)  # fmt: skip
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_plan_with_lora_by_hand():
    """With LoRA a trained model is its frozen weights (2 bytes each in bf16 mode) + 16 bytes per adapter
    parameter, and the KL reference costs nothing (the actor with its adapters off)."""
    n, m = 10**9, 10**7
    kw = dict(free=80 * GiB, total=80 * GiB, trained_models=2, reference=True, rollout_engine="vllm")
    bf16 = plan_gpu_memory(n, train_dtype="bf16", vllm_share=0.3, lora_params=m, **kw)
    assert bf16.trainer_needs == 2 * (2 * n + 16 * m) + HEADROOM_BYTES
    fp32 = plan_gpu_memory(n, train_dtype="fp32", vllm_share=0.3, lora_params=m, **kw)
    assert fp32.trainer_needs == 2 * (4 * n + 16 * m) + HEADROOM_BYTES
    full = plan_gpu_memory(n, train_dtype="bf16", vllm_share=0.3, **kw)
    assert full.trainer_needs == 2 * 16 * n + 2 * n + HEADROOM_BYTES
    with pytest.raises(ValueError, match="lora_params=-1"):
        plan_gpu_memory(n, train_dtype="bf16", lora_params=-1, **kw)


def test_lora_fits_a_7b_ppo_run_on_an_80_gib_gpu_that_full_training_does_not(h100, tmp_path):
    """PPO (actor + critic + KL reference + vLLM at 0.3) on Qwen2.5-7B, bf16, an 80 GiB card with 79 GiB
    free: 242.1 GiB without LoRA, 30.6 GiB with rank-16 adapters on every Linear layer (40.4M)."""
    from transformers import Qwen2Config

    from components.gpu_memory import count_lora_parameters

    Qwen2Config(**QWEN25_7B).save_pretrained(tmp_path)
    n = count_parameters(tmp_path)
    m = count_lora_parameters(tmp_path, rank=16, target_modules=ALL_LINEAR)
    per_layer = 16 * (2 * (3584 + 3584) + 2 * (3584 + 512) + 3 * (3584 + 18944))  # q o, k v, gate up down
    assert n == 7_615_616_512 and m == 28 * per_layer == 40_370_176

    base = params()
    ds = base.deepspeed.model_copy(update={"dtype": "bf16"})
    on = base.model.model_copy(update={"lora": base.model.lora.model_copy(update={"rank": 16})})
    full = base.model_copy(update={"deepspeed": ds})
    lora = full.model_copy(update={"model": on})
    run = dict(trained_models=2, reference=True, rollout=True)
    gpu.check_gpu_memory(lora, tmp_path, lora=True, **run)  # 2 x (14.2 GiB + 0.6 GiB) + 1 GiB < 55 GiB
    with pytest.raises(StageError) as err:
        gpu.check_gpu_memory(full, tmp_path, lora=False, **run)
    text = one_line(err)
    assert text.startswith(
        "model.path=/models/Qwen2.5-7B-Instruct (7.62B parameters) needs at least 242.1 GiB"
    )
    assert text.endswith("or train LoRA adapters (model.lora.rank=16)")
    fp32 = lora.model_copy(update={"deepspeed": base.deepspeed})  # frozen weights at 4 bytes: 58.9 GiB
    with pytest.raises(StageError) as err:
        gpu.check_gpu_memory(fp32, tmp_path, lora=True, **run)
    text = one_line(err)
    assert "needs at least 58.9 GiB" in text and "model.lora.rank=16: frozen weights in fp32" in text
    assert "40.4M adapter parameters" in text and not text.endswith("(model.lora.rank=16)")
