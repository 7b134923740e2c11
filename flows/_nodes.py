"""A multi-rank stage on several machines: this machine's settings, what the nodes must agree on.

``STEPRL_NODES`` / ``STEPRL_NODE_RANK`` / ``STEPRL_MASTER_ADDR`` / ``STEPRL_MASTER_PORT``
(components.train.nodes) say where the ``deepspeed.world_size`` ranks run. Node 0 runs the stage as
usual (``dvc exp run``, ``python -m flows.<stage>``); every other node runs the same command line
with its node rank, which runs its share of the ranks only (no Prefect flow, no MLflow run, no
outputs) and returns when the stage ends. Before any rank starts the nodes compare
:func:`summary`: the stage's params, the digests of its inputs and of the code; a node with other
params, inputs or code is refused with the keys that differ.

Under ``torchrun`` (components.train.torchrun) torchrun places the ranks instead: ``STEPRL_NODES``
must be unset, torchrun's ``WORLD_SIZE`` must equal ``deepspeed.world_size``, rank 0 runs the stage
and every other rank its worker (:func:`torchrun_follower`); with ranks on several machines they
compare the same :func:`summary` before training.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.config import Params
from components.train.nodes import NODES_VAR, NodeError, Nodes
from components.train.torchrun import Torchrun
from flows import REPO
from flows._cache import file_digest, source_digest
from flows._stage import StageError


def stage_nodes(params: Params) -> Nodes:
    """This machine's place among the stage's machines (one machine unless ``STEPRL_NODES`` says
    otherwise; one under torchrun), checked against ``deepspeed.world_size`` (torchrun's
    ``WORLD_SIZE`` too); a bad setting is a StageError."""
    try:
        nodes = Nodes.from_env()
        nodes.local_ranks(params.deepspeed.world_size)
        launched = Torchrun.from_env()
        if launched is not None:
            launched.check(params.deepspeed.world_size)
    except NodeError as err:
        raise StageError(str(err)) from None
    if launched is not None and nodes.count > 1:
        raise StageError(
            f"{NODES_VAR}={nodes.count} under torchrun: torchrun places the ranks (--nnodes, "
            f"--nproc-per-node); unset {NODES_VAR} and STEPRL_NODE_RANK / STEPRL_MASTER_*"
        )
    if nodes.count > 1 and params.deepspeed.world_size == 1:
        raise StageError(
            f"STEPRL_NODES={nodes.count} with deepspeed.world_size=1: nothing to run on other nodes"
        )
    return nodes


def summary(
    nodes: Nodes, stage: str, params: Params, inputs: Mapping[str, Path], **args: Any
) -> dict[str, Any]:
    """What every node of ``stage`` must run with: params, input digests (by name), code, ``args``
    (empty on one machine: nothing to compare, nothing hashed)."""
    launched = Torchrun.from_env()
    if nodes.count == 1 and (launched is None or launched.machines == 1):
        return {}
    return {
        "stage": stage,
        "args": args,
        "params": params.model_dump(mode="json"),
        "inputs": {name: file_digest(path) for name, path in inputs.items()},
        "code": source_digest(REPO / "components", REPO / "flows"),
    }


def torchrun_follower() -> Torchrun | None:
    """torchrun's place for this process when it is a rank other than 0 (it runs the stage's worker:
    no flow, no MLflow, no outputs); None without torchrun and on rank 0 (it runs the stage)."""
    launched = Torchrun.from_env()
    return launched if launched is not None and launched.rank > 0 else None
