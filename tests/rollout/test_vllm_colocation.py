"""vLLM colocation settings: passed to vllm.LLM (gpu_memory_utilization, enable_sleep_mode) and
sleep/wake around the update on CUDA only; on CPU accepted, with one log line saying they do nothing.
vllm.LLM is replaced by a recorder (a real CUDA vLLM cannot run here)."""

from __future__ import annotations

import logging
import sys
from types import ModuleType, SimpleNamespace

import pytest

import components.rollout.factory as factory
from components.rollout.base import EngineSettings
from components.rollout.vllm_engine import VLLMEngine


class FakeLLM:
    def __init__(self, **kw):
        self.kw, self.calls = kw, []

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self):
        self.calls.append(("wake_up",))


@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in package ``vllm`` with ``vllm.LLM`` and ``vllm.envs`` (the engine imports both), so the
    test needs no earlier test to have imported the real one."""
    mod, envs = ModuleType("vllm"), ModuleType("vllm.envs")
    mod.__path__ = []  # a package: `import vllm.envs` finds the submodule planted below
    mod.LLM, mod.envs = FakeLLM, envs
    envs.VLLM_ENABLE_V1_MULTIPROCESSING = False
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setitem(sys.modules, "vllm.envs", envs)


@pytest.mark.parametrize("cuda", [True, False])
def test_settings_reach_vllm_on_cuda_only(fake_vllm, monkeypatch, caplog, cuda):
    monkeypatch.setattr(factory, "on_cuda", lambda: cuda)
    settings = EngineSettings("vllm", gpu_memory_utilization=0.4, sleep_mode=True)
    with caplog.at_level(logging.INFO, logger=factory.__name__):
        engine = factory.make_engine(settings, "/m", stop_token_ids=[2])
    kw = engine.llm.kw
    if cuda:
        assert kw["gpu_memory_utilization"] == 0.4 and kw["enable_sleep_mode"] is True
        assert engine.sleep() is True
        engine.wake_up()
        assert engine.llm.calls == [("sleep", 1), ("wake_up",)]
        assert "do nothing" not in caplog.text
    else:
        assert "gpu_memory_utilization" not in kw and "enable_sleep_mode" not in kw
        assert engine.sleep() is False
        engine.wake_up()
        assert engine.llm.calls == []
        lines = [r for r in caplog.records if "do nothing" in r.getMessage()]
        assert len(lines) == 1 and "rollout.sleep_during_update" in lines[0].getMessage()


def test_engine_settings_reject_a_utilization_outside_0_1_and_an_unknown_engine():
    with pytest.raises(ValueError, match="gpu_memory_utilization=1.5"):
        EngineSettings("hf", gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match=r"unknown rollout engine 'sglang'; valid: \['hf', 'vllm'\]"):
        EngineSettings("sglang")


@pytest.mark.parametrize("slept", [True, False])
def test_session_update_sleeps_and_wakes_the_engine(monkeypatch, slept):
    """The update asks the engine to sleep, and wakes it after the update only if it did sleep (an
    engine without sleep mode, or not on CUDA, answers False)."""
    from components.train.rl_session import RLSession

    calls = []
    s = object.__new__(RLSession)
    s.rollout_engine = SimpleNamespace(
        sleep=lambda: calls.append("sleep") or slept, wake_up=lambda: calls.append("wake_up")
    )
    monkeypatch.setattr(s, "_update", lambda rows, **kw: calls.append("update") or {"m": 1.0}, raising=False)
    assert s.update([], actor=None, critic=None, seed=0) == {"m": 1.0}
    assert calls == (["sleep", "update", "wake_up"] if slept else ["sleep", "update"])


def test_vllm_engine_without_sleep_mode_never_sleeps(fake_vllm):
    engine = VLLMEngine("/m", stop_token_ids=[2])
    assert engine.sleep() is False and engine.llm.calls == []
