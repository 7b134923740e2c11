"""Data-parallel ranks on this machine, without a launcher of their own.

- :func:`local_world`: a context manager that makes the calling process rank 0 of a world of
  ``world_size`` processes and spawns the other ranks of this machine running ``fn(rank, *args)``.
  Rank 0 keeps doing what only it does (the stage's Prefect flow, MLflow logging, rollout,
  checkpoints) and meets the others in DeepSpeed's collectives. On leaving, it waits for them; if
  rank 0 fails, they are stopped. Rank 0's process group is destroyed on leaving.
- :func:`share_threads`: this process's torch threads divided among the ranks.
- :func:`run_local`: all ``world_size`` ranks spawned, ``fn(rank, *args)`` each; returns when all
  finished (tests, benchmarks).

Faults: a spawned rank that dies (a signal, a non-zero exit, an exception) stops the stage within
seconds (components.train.rank_watch: one line names the rank and how it ended); every spawned rank
gets SIGKILL from the kernel when its parent dies (components.process_tree.die_with_parent), so
rank 0 killed leaves no rank behind; spawned ranks ignore SIGINT (Ctrl-C in the terminal reaches
the whole process group: rank 0 alone decides, and stops the others as it leaves).

The ranks meet on a ``FileStore`` in a temporary directory (:data:`STORE_FILE_VAR`) and gloo binds
the loopback interface (:func:`components.train.distributed.init_distributed`): nothing listens on
the network. Ranks are started with ``spawn`` (fresh interpreters): ``fn`` and ``args`` must be
picklable.

Under ``torchrun`` (components.train.torchrun) this module spawns nothing: torchrun started the
ranks and watches them; :func:`local_world` only checks that this process is its rank 0. Ranks on
several machines are torchrun's (``--nnodes``; docs/scale-out.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing import ProcessContext

from components.dist_env import STORE_FILE_VAR
from components.environ import patched_environ
from components.process_tree import die_with_parent
from components.train.rank_watch import RankWatch
from components.train.torchrun import Torchrun, as_rank_0

__all__ = ["local_world", "run_local", "share_threads"]


def _rank_env(rank: int, world_size: int, store: Mapping[str, str]) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size), **store}


def _entry(
    index: int, first: int, world_size: int, store: dict[str, str], parent_pid: int, fn: Callable, args: tuple
) -> None:
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(_rank_env(first + index, world_size, store))
    try:
        fn(first + index, *args)
    finally:
        # Torn down before the interpreter exits: a gloo group left to die with the process can abort
        # it ("terminate called without an active exception") after fn has returned.
        if dist.is_initialized():
            dist.destroy_process_group()


def _spawn(n: int, first: int, world_size: int, store: dict, fn: Callable, args: tuple) -> ProcessContext:
    return mp.start_processes(
        _entry,
        args=(first, world_size, store, os.getpid(), fn, args),
        nprocs=n,
        join=False,
        start_method="spawn",
    )


def _check(world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be a positive int")


@contextlib.contextmanager
def _file_store() -> Iterator[dict[str, str]]:
    """The variables that send a world's ranks to a FileStore in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="steprl-world-") as tmp:
        yield {STORE_FILE_VAR: os.path.join(tmp, "store")}


@contextlib.contextmanager
def local_world(
    world_size: int, fn: Callable[..., Any], args: tuple = (), *, summary: Mapping[str, Any] | None = None
) -> Iterator[None]:
    """This process as rank 0 of ``world_size`` processes; the other ranks run ``fn(rank, *args)``.

    With ``world_size`` 1 nothing is spawned and the environment is left alone (a world of one).
    Under ``torchrun`` nothing is spawned either: torchrun started every rank, this one must be its
    rank 0 and its ``WORLD_SIZE`` must be ``world_size``; with ranks on several machines they first
    compare ``summary`` (JSON-able: the stage's params, its inputs' digests; components.train.torchrun
    .as_rank_0)."""
    _check(world_size)
    launched = Torchrun.from_env()
    if launched is not None:
        with as_rank_0(launched, world_size, summary):
            yield
        return
    if world_size == 1:
        yield
        return
    with _file_store() as store, patched_environ(_rank_env(0, world_size, store)):
        ctx = _spawn(world_size - 1, 1, world_size, store, fn, args)
        watch = RankWatch(ctx, first_rank=1, world_size=world_size)
        try:
            try:
                yield
                watch.wait_for_ranks()
            except BaseException as err:
                watch.settle(err)
                raise
            finally:
                watch.close()
        except BaseException as err:
            # The watch raises at most one WorldStopped into this thread, and not after close():
            # if it landed in the block above (cutting close() short), it is here now.
            watch.close()
            if watch.failure is not None and err is not watch.failure:
                raise watch.failure from err
            raise
        finally:
            if dist.is_initialized():  # this world is over: a later world (or vLLM) starts afresh
                dist.destroy_process_group()


def share_threads(world_size: int) -> int:
    """Each rank's share of this process's torch threads (at least 1); with several ranks, this
    process (rank 0) keeps only its share. Pass the share to the others.
    Under ``torchrun`` each rank is a process of its own that keeps its threads (torchrun sets
    ``OMP_NUM_THREADS``, 1 unless the user sets it)."""
    _check(world_size)
    if Torchrun.from_env() is not None:
        return torch.get_num_threads()
    threads = max(1, torch.get_num_threads() // world_size)
    if world_size > 1:
        torch.set_num_threads(threads)
    return threads


def run_local(world_size: int, fn: Callable[..., Any], args: tuple = ()) -> None:
    """Run ``fn(rank, *args)`` in ``world_size`` spawned processes (ranks 0..N-1); raise if one fails."""
    _check(world_size)
    with _file_store() as store:
        mp.start_processes(
            _entry,
            args=(0, world_size, store, os.getpid(), fn, args),
            nprocs=world_size,
            join=True,
            start_method="spawn",
        )
