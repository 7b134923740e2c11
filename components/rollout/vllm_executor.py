"""vLLM's executors, made to end with the process that started the engine (``own_process`` engines).

An engine in a process of its own (``VLLMEngine(own_process=True)``) is vLLM's ``EngineCore``
process, spawned by the trainer's rank 0; its worker process ends with it (vLLM's own death pipe).
Nothing ends the ``EngineCore`` when rank 0 is killed (SIGKILL, out of memory): it would wait for
requests forever. These executors are the ones vLLM would pick (the multiprocessing executor on
CPU, where vLLM requires it, the in-process one elsewhere), given to vLLM by import path
(``distributed_executor_backend``, its documented hook for a custom executor); they are built
in the ``EngineCore`` process and first arm the parent-death signal there
(components.process_tree.die_with_parent, SIGTERM: vLLM's handler then shuts the engine and its
worker down as on any stop).
"""

from __future__ import annotations

import multiprocessing
import signal

from vllm.v1.executor.multiproc_executor import MultiprocExecutor
from vllm.v1.executor.uniproc_executor import UniProcExecutor

from components.process_tree import die_with_parent

__all__ = ["DiesWithParentMultiproc", "DiesWithParentUniProc"]


def _arm() -> None:
    parent = multiprocessing.parent_process()
    if parent is not None:  # a spawned EngineCore; an engine in this very process has no parent to follow
        die_with_parent(parent.pid, signal.SIGKILL)


class DiesWithParentMultiproc(MultiprocExecutor):
    def _init_executor(self) -> None:
        _arm()
        super()._init_executor()


class DiesWithParentUniProc(UniProcExecutor):
    def _init_executor(self) -> None:
        _arm()
        super()._init_executor()
