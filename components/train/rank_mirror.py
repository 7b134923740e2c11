"""One RL session on several data-parallel ranks: rank 0 leads, ranks 1..N-1 repeat its engine calls.

Rank 0 (the train stage's process: Prefect, MLflow, the rollout engine, the estimator) wraps its
:class:`~components.train.rl_session.RLSession` in a :class:`Leader`. A call that every rank's
DeepSpeed engines must join (:data:`MIRRORED`: ``update``, ``save``, ``restore``) is first broadcast
to the other ranks, its method name and arguments (the iteration's annotated rows included) pickled
by ``torch.distributed.broadcast_object_list`` over the trainer's own process group; each of them runs
:func:`follow` on a session of its own built from the same checkpoint without a rollout engine, and
makes the same call. Inside it DeepSpeed all-reduces the gradients, as in data-parallel SFT: each rank
trains its share of every optimizer step (:func:`components.train.rl_update.actor_update`). Everything
else (rollout, validation, the log-probs and values the estimator reads) runs on rank 0 alone, which
is why the trained engines must hold whole weights on every rank (ZeRO stages 0-2).

A follower that fails stops taking calls; rank 0's watch (components.train.rank_watch) sees it end
and stops the stage within seconds, whatever rank 0 is doing.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

__all__ = ["MIRRORED", "Leader", "follow"]

MIRRORED = ("update", "save", "restore")
_STOP = "__stop__"


def _broadcast(message: tuple | None) -> tuple:
    box = [message]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class Leader:
    """Rank 0's view of the session: the session's own attributes, with :data:`MIRRORED` calls sent
    to every follower before they run here."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.session, name)
        if name not in MIRRORED:
            return attr

        def mirrored(*args: Any, **kwargs: Any) -> Any:
            _broadcast((name, args, kwargs))
            return attr(*args, **kwargs)

        return mirrored

    def close(self) -> None:
        """Release the followers (they return from :func:`follow`), then close the session."""
        try:
            _broadcast((_STOP, (), {}))
        finally:
            self.session.close()


def follow(session: Any) -> int:
    """On ranks 1..N-1: make rank 0's :data:`MIRRORED` calls on ``session`` until it closes; returns
    how many calls were made."""
    calls = 0
    while True:
        name, args, kwargs = _broadcast(None)
        if name == _STOP:
            return calls
        if name not in MIRRORED:
            raise RuntimeError(f"rank 0 sent {name!r}, which is not a mirrored call {MIRRORED}")
        getattr(session, name)(*args, **kwargs)
        calls += 1
