"""rollout.engine_cpus as the own-process engine sees it: the CPU lists, the refusals before any work,
and the environment the spawned engine starts with (vLLM's VLLM_CPU_OMP_THREADS_BIND)."""

from __future__ import annotations

from components.rollout.base import cpu_bind_problem, cpu_ids
from components.rollout.vllm_engine import _engine_env


def test_cpu_lists():
    assert cpu_ids("1") == [1]
    assert cpu_ids("0,2-3, 6") == [0, 2, 3, 6]
    assert cpu_ids("3-1") == [] and cpu_ids("a") == [] and cpu_ids("1,") == []


def test_a_binding_the_process_cannot_have_is_named():
    assert cpu_bind_problem("auto", {0, 1}) is None
    assert cpu_bind_problem("nobind", {0}) is None
    assert cpu_bind_problem("1", {0, 1}) is None
    assert "may run on 1" in cpu_bind_problem("auto", {3})
    msg = cpu_bind_problem("1-2", {0, 1})
    assert "[2]" in msg and "allowed: [0, 1]" in msg


def test_the_own_process_engine_starts_with_the_binding_and_auto_leaves_vllms_default():
    assert _engine_env(True, "1")["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in _engine_env(True, "auto")
    assert "VLLM_CPU_OMP_THREADS_BIND" not in _engine_env(False, "1")
