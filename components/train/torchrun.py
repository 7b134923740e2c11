"""A stage whose ranks ``torchrun`` started: recognise it, check it against the params, and follow it.

``torchrun`` (torch.distributed.run) starts every rank itself, one process each, with ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_WORLD_SIZE`` (its agents, one a
machine), ``MASTER_ADDR``/``MASTER_PORT`` (its agent's store) and ``TORCHELASTIC_RUN_ID`` (set in every process it starts: how steprl recognises it). It
watches the ranks and stops the group when one fails, naming it (``ChildFailedError``). Under it,
steprl spawns nothing (components.train.launch defers): rank 0 runs the stage (Prefect, MLflow,
rollout, outputs), every other rank runs the stage's worker and returns when the stage ends.

- :meth:`Torchrun.from_env`: this process's place in torchrun's world, or None without torchrun.
- :meth:`Torchrun.check`: torchrun's ``WORLD_SIZE`` must equal ``deepspeed.world_size`` (the params
  fix the batch split and so the weights; the launcher only places the ranks).
- :func:`agree`: with ranks on several machines (``GROUP_WORLD_SIZE > 1``: the same on every rank,
  where ``LOCAL_WORLD_SIZE`` is each machine's own and may differ), every rank's summary (the stage's params, its inputs' and code's digests) compared with rank 0's before
  training, which torchrun does not do; a rank that differs stops every rank, naming the keys.
- :func:`as_rank_0` / :func:`run_rank`: rank 0's side and another rank's side of such a stage.

Several machines go through torchrun only (``--nnodes``, its c10d rendezvous); steprl's own launcher
(components.train.launch) places ranks on this machine.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from components.dist_env import TORCHRUN_VAR

__all__ = ["NodeError", "Torchrun", "agree", "as_rank_0", "differences", "disagreements", "run_rank"]


class NodeError(RuntimeError):
    """torchrun's world does not fit the params, or its ranks do not agree; the message says which."""


@dataclass(frozen=True)
class Torchrun:
    """Where torchrun placed this process."""

    rank: int
    world_size: int
    local_world_size: int
    machines: int = 1  # torchrun's agents (--nnodes): GROUP_WORLD_SIZE, the same on every rank

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Torchrun | None:
        """This process's place when torchrun started it (``TORCHELASTIC_RUN_ID`` set), else None."""
        env = os.environ if env is None else env
        if TORCHRUN_VAR not in env:
            return None
        try:
            rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
            local_world = int(env.get("LOCAL_WORLD_SIZE", world))
            machines = int(env["GROUP_WORLD_SIZE"])
        except (KeyError, ValueError) as err:
            raise NodeError(
                f"{TORCHRUN_VAR} is set (a process torchrun started) but RANK/WORLD_SIZE/LOCAL_WORLD_SIZE/"
                f"GROUP_WORLD_SIZE are not integers: {err}"
            ) from None
        # Not WORLD_SIZE // LOCAL_WORLD_SIZE: machines with other process counts would see other
        # counts, and a rank that skipped agree() would leave the others in their all_gather.
        return cls(rank, world, local_world, max(1, machines))

    def check(self, world_size: int, key: str = "deepspeed.world_size") -> None:
        """torchrun's world must be the params' world: NodeError naming both otherwise."""
        if self.world_size != world_size:
            raise NodeError(
                f"torchrun started WORLD_SIZE={self.world_size} ranks but {key}={world_size}: "
                f"set {key}={self.world_size}, or start {world_size} rank(s) "
                "(--nnodes x --nproc-per-node); the params fix how batches are split, the launcher only "
                "places the ranks"
            )


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def differences(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """The flattened keys whose values differ between two summaries (missing on one side included)."""
    a, b = _flat(mine), _flat(theirs)
    return sorted(k for k in a.keys() | b.keys() if a.get(k, "<missing>") != b.get(k, "<missing>"))


def agree(run: Torchrun, summary: Mapping[str, Any]) -> None:
    """Every rank's ``summary`` gathered over the world's process group and compared with rank 0's;
    NodeError on every rank when one differs (the ranks and keys named). One machine: returns at
    once. Whether to gather is decided from ``run.machines`` alone, equal on every rank (a collective
    some ranks skip hangs the others)."""
    if run.machines == 1:
        return
    from components.train.distributed import init_distributed

    init_distributed()
    mine = json.loads(json.dumps(summary, sort_keys=True, default=str))
    everyone: list[Any] = [None] * run.world_size
    dist.all_gather_object(everyone, mine)
    wrong = disagreements(everyone)
    if wrong:
        raise NodeError("; ".join(wrong))


def disagreements(summaries: list[Mapping[str, Any]]) -> list[str]:
    """One line per rank whose summary differs from rank 0's (``summaries[rank]``), naming the keys."""
    wrong = []
    for rank, theirs in enumerate(summaries[1:], start=1):
        diff = differences(summaries[0], theirs)
        if diff:
            shown = ", ".join(diff[:12]) + (f" and {len(diff) - 12} more" if len(diff) > 12 else "")
            wrong.append(f"rank {rank} runs with other settings or inputs than rank 0: {shown} differ")
    return wrong


def _leave() -> None:
    if dist.is_initialized():  # torn down before the interpreter exits (as launch._entry does)
        dist.destroy_process_group()


@contextlib.contextmanager
def as_rank_0(run: Torchrun, world_size: int, summary: Mapping[str, Any] | None) -> Iterator[None]:
    """Rank 0 of torchrun's world: checked, agreed with the others; the process group is destroyed on
    leaving. A failure of another rank is torchrun's to report: it stops this process too."""
    run.check(world_size)
    if run.rank != 0:
        raise NodeError(f"rank {run.rank} of torchrun's world tried to run the stage: rank 0 runs it")
    try:
        agree(run, summary or {})
        yield
    finally:
        _leave()


def run_rank(
    run: Torchrun, world_size: int, fn: Callable[..., Any], args: tuple = (), *, summary: Mapping[str, Any]
) -> None:
    """Rank ``run.rank`` >= 1 of torchrun's world: checked, agreed with the others, then
    ``fn(run.rank, *args)``; returns when ``fn`` does."""
    run.check(world_size)
    if run.rank == 0:
        raise NodeError("rank 0 of torchrun's world runs the stage (as_rank_0), not run_rank")
    try:
        agree(run, summary)
        fn(run.rank, *args)
    finally:
        _leave()
