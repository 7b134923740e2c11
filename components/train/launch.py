"""Data-parallel ranks on this machine, or on several, without a launcher of their own.

- :func:`local_world`: a context manager that makes the calling process rank 0 of a world of
  ``world_size`` processes and spawns the other ranks of this machine running ``fn(rank, *args)``.
  Rank 0 keeps doing what only it does (the stage's Prefect flow, MLflow logging, rollout,
  checkpoints) and meets the others in DeepSpeed's collectives. On leaving, it waits for them; if
  rank 0 fails, they are stopped. Rank 0's process group is destroyed on leaving.
- :func:`node_world`: on machine n > 0 of several (components.train.nodes), that machine's ranks,
  ``fn(rank, *args)`` each; returns when they all ended, raises when one failed or rank 0 is gone.
- :func:`share_threads`: this process's torch threads divided among the ranks of a machine.
- :func:`run_local`: all ``world_size`` ranks spawned, ``fn(rank, *args)`` each; returns when all
  finished (tests, benchmarks).

Faults: a spawned rank that dies (a signal, a non-zero exit, an exception) stops the stage within
seconds (components.train.rank_watch: one line names the rank and how it ended); every spawned rank
gets SIGKILL from the kernel when its parent dies (components.process_tree.die_with_parent), so
rank 0 killed leaves no rank behind; spawned ranks ignore SIGINT (Ctrl-C in the terminal reaches
the whole process group: rank 0 alone decides, and stops the others as it leaves).

On one machine the ranks meet on a ``FileStore`` in a temporary directory (:data:`STORE_FILE_VAR`);
on several, on node 0's ``TCPStore`` (:data:`TCP_STORE_VAR`, bound to the address the user gives);
gloo binds the loopback interface when the world is on one machine or the address is loopback
(:func:`components.train.distributed.init_distributed`). Ranks are started with ``spawn`` (fresh
interpreters): ``fn`` and ``args`` must be picklable.

Under ``torchrun`` (components.train.torchrun) this module spawns nothing: torchrun started the
ranks and watches them; :func:`local_world` only checks that this process is its rank 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing import ProcessContext, ProcessExitedException, ProcessRaisedException

from components.dist_env import STORE_FILE_VAR, TCP_STORE_VAR
from components.process_tree import die_with_parent
from components.train.nodes import (
    HEARTBEAT_S,
    NodeError,
    NodeReporter,
    Nodes,
    RemoteNodes,
    agree,
    host_store,
    join_store,
)
from components.train.rank_watch import RankFailed, RankWatch, how_it_ended
from components.train.torchrun import Torchrun, as_rank_0

__all__ = ["local_world", "node_world", "run_local", "share_threads"]

log = logging.getLogger(__name__)


def _rank_env(rank: int, local_rank: int, world_size: int, store: Mapping[str, str]) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world_size), **store}


def _tcp_env(nodes: Nodes) -> dict[str, str]:
    return {
        TCP_STORE_VAR: nodes.address,
        "MASTER_ADDR": nodes.master_addr,
        "MASTER_PORT": str(nodes.master_port),
    }


def _entry(
    index: int,
    first: int,
    first_local: int,
    world_size: int,
    store: dict[str, str],
    parent_pid: int,
    fn: Callable,
    args: tuple,
) -> None:
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(_rank_env(first + index, first_local + index, world_size, store))
    try:
        fn(first + index, *args)
    finally:
        # Torn down before the interpreter exits: a gloo group left to die with the process can abort
        # it ("terminate called without an active exception") after fn has returned.
        if dist.is_initialized():
            dist.destroy_process_group()


def _spawn(n: int, first: int, first_local: int, world_size: int, store: dict, fn: Callable, args: tuple):
    if n == 0:
        return ProcessContext([], [])
    return mp.start_processes(
        _entry,
        args=(first, first_local, world_size, store, os.getpid(), fn, args),
        nprocs=n,
        join=False,
        start_method="spawn",
    )


def _check(world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be a positive int")


@contextlib.contextmanager
def _set_env(values: Mapping[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _store(world_size: int, nodes: Nodes, summary: Mapping[str, Any] | None) -> Iterator[dict]:
    """The rendezvous of rank 0's machine: a FileStore (one machine) or node 0's TCPStore, after
    the nodes agreed on ``summary``. Yields the variables that tell a rank where it is."""
    if nodes.count == 1:
        with tempfile.TemporaryDirectory(prefix="steprl-world-") as tmp:
            yield {STORE_FILE_VAR: os.path.join(tmp, "store")}
        return
    store = host_store(nodes)
    try:
        log.info(
            f"node 0 of {nodes.count}: waiting for the other nodes on {nodes.address} "
            f"(up to {nodes.timeout_s:.0f} s)"
        )
        agree(store, nodes, summary or {})
        yield _tcp_env(nodes)
    finally:
        del store  # the server stops (and closes its socket) with its last reference


@contextlib.contextmanager
def local_world(
    world_size: int,
    fn: Callable[..., Any],
    args: tuple = (),
    *,
    nodes: Nodes | None = None,
    summary: Mapping[str, Any] | None = None,
) -> Iterator[None]:
    """This process as rank 0 of ``world_size`` processes; this machine's other ranks run
    ``fn(rank, *args)``. With ``nodes`` of several machines this is node 0: the others run
    :func:`node_world` and must post the same ``summary`` (JSON-able: the stage's params, its inputs'
    digests); their ranks are watched through node 0's store.

    With ``world_size`` 1 nothing is spawned and the environment is left alone (a world of one).
    Under ``torchrun`` nothing is spawned either: torchrun started every rank, this one must be its
    rank 0 and its ``WORLD_SIZE`` must be ``world_size`` (components.train.torchrun.as_rank_0)."""
    _check(world_size)
    launched = Torchrun.from_env()
    if launched is not None:
        with as_rank_0(launched, world_size, summary):
            yield
        return
    nodes = nodes or Nodes()
    ranks = nodes.local_ranks(world_size)
    if nodes.rank != 0:
        raise NodeError(f"local_world runs rank 0: this is node {nodes.rank} (use node_world)")
    if world_size == 1:
        yield
        return
    with _store(world_size, nodes, summary) as store, _set_env(_rank_env(0, 0, world_size, store)):
        ctx = _spawn(len(ranks) - 1, 1, 1, world_size, store, fn, args)
        remote = RemoteNodes(nodes, world_size) if nodes.count > 1 else None
        watch = RankWatch(ctx, first_rank=1, world_size=world_size, remote=remote)
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
            # The watch raises at most one WorldStopped into this thread, and not after close(): if
            # it landed in the block above (cutting close() short), it is here now.
            watch.close()
            if watch.failure is not None and err is not watch.failure:
                raise watch.failure from err
            raise
        finally:
            if dist.is_initialized():  # this world is over: a later world (or vLLM) starts afresh
                dist.destroy_process_group()


def node_world(
    world_size: int, fn: Callable[..., Any], args: tuple = (), *, nodes: Nodes, summary: Mapping[str, Any]
) -> None:
    """Machine ``nodes.rank`` > 0 of a stage's world: its ranks run ``fn(rank, *args)`` until they all
    end (returns) or one fails or node 0 is gone (stops the others, raises RankFailed / NodeError)."""
    _check(world_size)
    ranks = nodes.local_ranks(world_size)
    if nodes.rank == 0:
        raise NodeError("node_world runs the ranks of nodes 1 ..: node 0 runs the stage (local_world)")
    store = join_store(nodes)
    log.info(f"node {nodes.rank} of {nodes.count}: joining node 0 at {nodes.address}")
    agree(store, nodes, summary)
    del store
    reporter = NodeReporter(nodes)
    ctx = _spawn(len(ranks), ranks.start, 0, world_size, _tcp_env(nodes), fn, args)
    try:
        while True:
            try:
                if ctx.join(timeout=HEARTBEAT_S / 4, grace_period=1.0):
                    reporter.report("done", {})
                    return
            except (ProcessExitedException, ProcessRaisedException) as err:
                if not reporter.check():  # the rank failed because rank 0 is gone (its collectives fail)
                    raise NodeError(_gone(nodes, reporter.lost)) from None
                rank = ranks.start + err.error_index
                how = how_it_ended(err)
                reporter.report("failed", {"rank": rank, "pid": err.error_pid, "how": how})
                failure = RankFailed(rank, world_size, err.error_pid, how, where=f"node {nodes.rank}, ")
                log.error(f"error: {failure}: stopping this node")
                raise failure from None
            if not reporter.alive():
                raise NodeError(_gone(nodes, reporter.lost))
    except BaseException as err:  # Ctrl-C here, or an error of this launcher: node 0 is told at once
        if not isinstance(err, (RankFailed, NodeError)):
            how = f"was stopped with its node ({type(err).__name__})"
            reporter.report("failed", {"rank": ranks.start, "pid": os.getpid(), "how": how})
        raise
    finally:
        reporter.close()
        for proc in ctx.processes:
            if proc.is_alive():
                proc.terminate()
        for proc in ctx.processes:
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()


def _gone(nodes: Nodes, why: str | None) -> str:
    return (
        f"node {nodes.rank}: node 0's store at {nodes.address} stopped answering ({why}): "
        "rank 0 is gone; stopping this node's ranks"
    )


def share_threads(world_size: int, nodes: Nodes | None = None) -> int:
    """Each of this machine's ranks' share of this process's torch threads (at least 1); with
    several ranks here, this process (rank 0) keeps only its share. Pass the share to the others.
    Under ``torchrun`` each rank is a process of its own that keeps its threads (torchrun sets
    ``OMP_NUM_THREADS``, 1 unless the user sets it)."""
    _check(world_size)
    if Torchrun.from_env() is not None:
        return torch.get_num_threads()
    local = len((nodes or Nodes()).local_ranks(world_size))
    threads = max(1, torch.get_num_threads() // local)
    if local > 1:
        torch.set_num_threads(threads)
    return threads


def run_local(world_size: int, fn: Callable[..., Any], args: tuple = ()) -> None:
    """Run ``fn(rank, *args)`` in ``world_size`` spawned processes (ranks 0..N-1); raise if one fails."""
    _check(world_size)
    with tempfile.TemporaryDirectory(prefix="steprl-world-") as tmp:
        store = {STORE_FILE_VAR: os.path.join(tmp, "store")}
        mp.start_processes(
            _entry,
            args=(0, 0, world_size, store, os.getpid(), fn, args),
            nprocs=world_size,
            join=True,
            start_method="spawn",
        )
