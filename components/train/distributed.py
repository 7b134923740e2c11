"""Start (or join) the torch.distributed world DeepSpeed needs, on one CPU or under the launcher.

What it does:
- Without a launcher (no ``WORLD_SIZE`` in the environment) it fills in a one-process world:
  ``RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=<a free port>``.
  Under the ``deepspeed``/``torchrun`` launcher it uses the launcher's variables untouched.
- Under steprl's own launcher (:mod:`components.train.launch`: several processes on this machine)
  ``STORE_FILE_VAR`` names a file: the ranks meet on a ``FileStore`` there instead of a TCP store.
- Without CUDA it selects DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``) and the gloo backend;
  with CUDA, NCCL and the GPU ``LOCAL_RANK``.
- It is idempotent: a second call (or a call after someone else initialised torch.distributed)
  returns the same :class:`DistInfo` without touching the process group.

What it does not do: launch processes, pick GPUs for other ranks, or tear the group down.

Departures from a plain ``deepspeed.init_distributed()``:
1. On CPU, DeepSpeed would JIT-compile its shared-memory all-reduce C++ op (about a minute, and it
   needs a C++ toolchain); it serves DeepSpeed's inference all-reduce only, never the gradient
   all-reduce of training (torch.distributed's gloo), so we skip that build.
2. Nothing listens beyond loopback on one machine: a world of one makes its process group on an
   in-process ``HashStore``, several local processes on a ``FileStore`` (torch's ``env://``
   rendezvous would start a TCPStore listening on every interface, ``*:MASTER_PORT``), and gloo's own
   device binds the loopback interface (``GLOO_SOCKET_IFNAME=lo`` unless set). A world started by
   the ``deepspeed``/``torchrun`` launcher uses its rendezvous as before: it binds what the user
   configures (several machines: torchrun's, components.train.torchrun).
3. DeepSpeed caches a clone of the world's group (``deepspeed.utils.groups._WORLD_GROUP``) the first
   time an engine is built and never checks it again. When that world is destroyed (our launcher's
   teardown, or an in-process vLLM engine's ``close``) and another one made, the clone names a group
   of the dead world and the next ``deepspeed.initialize`` fails ("Group ... is not registered"), so
   each call forgets a clone that is not registered in the current world.
"""

from __future__ import annotations

import importlib
import os
import socket
from dataclasses import dataclass

import torch

from components.device import stage_device
from components.dist_env import LAUNCHER_VARS as _LAUNCHER_VARS
from components.dist_env import STORE_FILE_VAR

__all__ = ["STORE_FILE_VAR", "DistInfo", "dp_rank_world", "free_port", "init_distributed"]


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the world, and which device/backend it trains on."""

    rank: int
    world_size: int
    local_rank: int
    backend: str  # "gloo" (CPU) or "nccl" (CUDA)
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dp_rank_world() -> tuple[int, int]:
    """(rank, world size) of the data-parallel world; (0, 1) when no process group exists."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _fill_single_process_env() -> None:
    """Set the launcher variables for a world of one, unless a launcher set them already."""
    if "WORLD_SIZE" in os.environ:
        needed = _LAUNCHER_VARS[:3] if os.environ.get(STORE_FILE_VAR) else _LAUNCHER_VARS
        missing = [v for v in needed if v not in os.environ]
        if missing and int(os.environ["WORLD_SIZE"]) > 1:
            raise RuntimeError(
                f"WORLD_SIZE={os.environ['WORLD_SIZE']} is set but {missing} are not: "
                "start multi-process training with the deepspeed (or torchrun) launcher"
            )
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(free_port())


def _skip_shm_build_on_cpu() -> None:
    # importlib, not "import deepspeed.comm.torch as m": deepspeed.comm has a `torch` attribute
    # (the torch package itself) that the import-as form would return.
    ds_torch_comm = importlib.import_module("deepspeed.comm.torch")
    if hasattr(ds_torch_comm, "build_shm_op"):
        ds_torch_comm.build_shm_op = lambda: None


def _info() -> DistInfo:
    rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = str(torch.distributed.get_backend())
    return DistInfo(
        rank=rank, world_size=world, local_rank=local_rank, backend=backend, device=stage_device()
    )


def init_distributed() -> DistInfo:
    """Initialise DeepSpeed's communication (gloo on CPU, NCCL on CUDA) once; return this rank's info.

    Must run before the first ``import deepspeed`` anywhere in the process picks an accelerator, or
    at least before anything asks for it; :func:`components.train.engine.build_engine` calls it.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        import deepspeed

        _forget_groups_of_a_past_world()
        # Someone (us earlier, or the caller) already made the group; let DeepSpeed's comm wrap it.
        if not torch.cuda.is_available():
            _skip_shm_build_on_cpu()
        deepspeed.init_distributed(dist_backend=str(torch.distributed.get_backend()), verbose=False)
        return _info()

    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    _fill_single_process_env()
    on_cpu = os.environ.get("DS_ACCELERATOR") == "cpu" or not cuda
    backend = "gloo" if on_cpu else "nccl"

    import deepspeed
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator().device_name()
    if on_cpu and accel != "cpu":
        raise RuntimeError(
            f"DeepSpeed already chose accelerator {accel!r} but this process has no CUDA; "
            "call init_distributed() before anything else asks DeepSpeed for its accelerator, "
            "or set DS_ACCELERATOR=cpu in the environment"
        )
    if on_cpu:
        _skip_shm_build_on_cpu()
    if not on_cpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    world = int(os.environ["WORLD_SIZE"])
    if world == 1 or os.environ.get(STORE_FILE_VAR):
        _init_local_world(backend, world)  # DeepSpeed then wraps this group instead of making its own
    _forget_groups_of_a_past_world()
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)
    return _info()


def _forget_groups_of_a_past_world() -> None:
    """Drop DeepSpeed's cached clone of the world group when it belongs to a world that is gone."""
    groups = importlib.import_module("deepspeed.utils.groups")
    clone = groups._WORLD_GROUP
    if clone is None:
        return
    try:
        torch.distributed.get_process_group_ranks(clone)
    except (KeyError, ValueError, RuntimeError):  # not a group of this world
        groups._WORLD_GROUP = None


def _init_local_world(backend: str, world: int) -> None:
    """A process group on steprl's own store: in-process for a world of one, the launcher's
    ``FileStore`` for several processes of this machine (neither opens a socket); gloo's pairs on
    the loopback interface."""
    if backend == "gloo" and os.path.isdir("/sys/class/net/lo"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if world == 1:
        store = torch.distributed.HashStore()
    else:
        store = torch.distributed.FileStore(os.environ[STORE_FILE_VAR], world)
    rank = int(os.environ["RANK"])
    torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=world)
