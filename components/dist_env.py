"""The environment variables that place a process in a torch.distributed world, in one place.

A launcher (``deepspeed``, ``torchrun``, or steprl's own :mod:`components.train.launch`) sets them;
:mod:`components.train.distributed` reads them to join the world, and
:mod:`components.rollout.vllm_engine` removes them from the environment of a vLLM engine that runs in
a process of its own (it must not join the trainer's world). It reads and sets nothing itself.
"""

from __future__ import annotations

__all__ = ["LAUNCHER_VARS", "STORE_FILE_VAR", "TORCHRUN_VAR", "TORCHRUN_VARS", "WORLD_VARS"]

# What the deepspeed/torchrun launcher sets for every rank.
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# Set by components.train.launch: the FileStore path of a world of local processes.
STORE_FILE_VAR = "STEPRL_STORE_FILE"
# Set by torchrun in every process it starts: how a stage knows torchrun placed its ranks.
TORCHRUN_VAR = "TORCHELASTIC_RUN_ID"
# What else torchrun sets for a rank; TORCHELASTIC_USE_AGENT_STORE makes any TCP rendezvous in the
# process a client of MASTER_ADDR:MASTER_PORT (torch.distributed.rendezvous), so a process outside
# the world (a vLLM engine) must not inherit it.
TORCHRUN_VARS = (
    TORCHRUN_VAR,
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_ERROR_FILE",
)
# Everything that makes a process join a world: what a process outside the world must not inherit.
WORLD_VARS = (*LAUNCHER_VARS, *TORCHRUN_VARS, STORE_FILE_VAR)
