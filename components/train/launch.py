"""Data-parallel ranks on this machine, without a launcher and without a listening socket.

- :func:`local_world`: a context manager that makes the calling process rank 0 of a world of
  ``world_size`` processes and spawns ranks 1..N-1 running ``fn(rank, *args)``. Rank 0 keeps doing
  what only it does (the stage's Prefect flow, MLflow logging, rollout, checkpoints) and meets the
  workers in DeepSpeed's collectives. On leaving, it waits for the workers; if rank 0 fails, they are
  terminated (a worker blocked in a collective would otherwise wait for the process group's timeout).
  Rank 0's process group is destroyed on leaving.
- :func:`share_threads`: this process's torch threads divided among the ranks of a local world.
- :func:`run_local`: all ``world_size`` ranks spawned, ``fn(rank, *args)`` each; returns when all
  finished (tests, benchmarks).

The ranks meet on a ``FileStore`` in a temporary directory (:data:`STORE_FILE_VAR`), and gloo binds
the loopback interface (:func:`components.train.distributed.init_distributed`): nothing listens on a
network interface. Several machines are the ``deepspeed``/``torchrun`` launcher's job instead.
Workers are started with ``spawn`` (fresh interpreters): ``fn`` and ``args`` must be picklable.
A worker that dies mid-run is noticed by rank 0 only when its next collective times out (torch's
process-group timeout, 30 minutes for gloo) or when the context joins the workers at its end.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from components.train.distributed import STORE_FILE_VAR

__all__ = ["local_world", "run_local", "share_threads"]


def _rank_env(rank: int, world_size: int, store: str) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        STORE_FILE_VAR: store,
    }


def _entry(index: int, offset: int, world_size: int, store: str, fn: Callable, args: tuple) -> None:
    rank = index + offset
    os.environ.update(_rank_env(rank, world_size, store))
    try:
        fn(rank, *args)
    finally:
        # Torn down before the interpreter exits: a gloo group left to die with the process can abort
        # it ("terminate called without an active exception") after fn has returned.
        if dist.is_initialized():
            dist.destroy_process_group()


def _check(world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be a positive int")


@contextlib.contextmanager
def local_world(world_size: int, fn: Callable[..., Any], args: tuple = ()) -> Iterator[None]:
    """This process as rank 0 of ``world_size`` local processes; ranks 1.. run ``fn(rank, *args)``.

    With ``world_size`` 1 nothing is spawned and the environment is left alone (a world of one)."""
    _check(world_size)
    if world_size == 1:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="steprl-world-") as tmp:
        store = os.path.join(tmp, "store")
        saved = {k: os.environ.get(k) for k in _rank_env(0, world_size, store)}
        os.environ.update(_rank_env(0, world_size, store))
        ctx = mp.start_processes(
            _entry,
            args=(1, world_size, store, fn, args),
            nprocs=world_size - 1,
            join=False,
            start_method="spawn",
        )
        try:
            yield
            while not ctx.join():  # raises ProcessRaisedException / ProcessExitedException on failure
                pass
        except BaseException:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            raise
        finally:
            if dist.is_initialized():  # this world is over: a later world (or vLLM) starts afresh
                dist.destroy_process_group()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def share_threads(world_size: int) -> int:
    """Each of ``world_size`` local ranks' share of this process's torch threads (at least 1); with
    several ranks this process (rank 0) keeps only its share. Pass the share to the spawned ranks."""
    _check(world_size)
    threads = max(1, torch.get_num_threads() // world_size)
    if world_size > 1:
        torch.set_num_threads(threads)
    return threads


def run_local(world_size: int, fn: Callable[..., Any], args: tuple = ()) -> None:
    """Run ``fn(rank, *args)`` in ``world_size`` spawned processes (ranks 0..N-1); raise if one fails."""
    _check(world_size)
    with tempfile.TemporaryDirectory(prefix="steprl-world-") as tmp:
        store = os.path.join(tmp, "store")
        mp.start_processes(
            _entry, args=(0, world_size, store, fn, args), nprocs=world_size, join=True, start_method="spawn"
        )
