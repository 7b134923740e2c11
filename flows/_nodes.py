"""A multi-rank stage's world: checked against the params, and what its machines must agree on.

On one machine steprl spawns the ``deepspeed.world_size`` ranks itself (components.train.launch).
On several, ``torchrun`` places them (``--nnodes``, ``--nproc-per-node``; docs/scale-out.md): its
``WORLD_SIZE`` must equal ``deepspeed.world_size``, rank 0 runs the stage as usual and every other
rank its worker (:func:`torchrun_follower`: no flow, no MLflow run, no outputs). With ranks on
several machines they compare :func:`summary` before training: the stage's params, the digests of
its inputs and of the code; a rank with other params, inputs or code stops every rank, naming the
keys that differ.

steprl's own several-machine launcher (``STEPRL_NODES`` and friends) is gone: a stage that finds
those variables set refuses to start rather than run everything on one machine unasked.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.config import Params
from components.train.torchrun import NodeError, Torchrun
from flows import REPO
from flows._cache import file_digest, source_digest
from flows._stage import StageError

# The variables of the launcher that torchrun replaced: set, they are a mistake, not a no-op.
GONE_VARS = ("STEPRL_NODES", "STEPRL_NODE_RANK", "STEPRL_MASTER_ADDR", "STEPRL_MASTER_PORT")


def check_world(params: Params) -> Torchrun | None:
    """torchrun's place for this process (None without torchrun), its ``WORLD_SIZE`` checked against
    ``deepspeed.world_size``; a bad setting is a StageError."""
    gone = [v for v in GONE_VARS if os.environ.get(v, "").strip()]
    if gone:
        raise StageError(
            f"{', '.join(gone)} set: steprl's own several-machine launcher is gone; start the stage on "
            "every machine with torchrun (--nnodes, --node-rank, --rdzv-endpoint; docs/scale-out.md) "
            "and unset these"
        )
    try:
        launched = Torchrun.from_env()
        if launched is not None:
            launched.check(params.deepspeed.world_size)
    except NodeError as err:
        raise StageError(str(err)) from None
    return launched


def machines() -> int:
    """How many machines the stage's ranks span (torchrun's agents; 1 without torchrun)."""
    launched = Torchrun.from_env()
    return 1 if launched is None else launched.machines


def summary(stage: str, params: Params, inputs: Mapping[str, Path], **args: Any) -> dict[str, Any]:
    """What every machine of ``stage`` must run with: params, input digests (by name), code, ``args``
    (empty on one machine: nothing to compare, nothing hashed)."""
    if machines() == 1:
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
