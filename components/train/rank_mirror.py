"""One RL session on several data-parallel ranks: rank 0 leads, ranks 1..N-1 repeat its engine calls.

Rank 0 (the train stage's process: Prefect, MLflow, the rollout engine, the estimator) wraps its
:class:`~components.train.rl_session.RLSession` in a :class:`Leader`. A call that every rank's
DeepSpeed engines must join (:data:`MIRRORED`: ``update``, ``save``, ``restore``) is first broadcast
to the other ranks, its method name and arguments (the iteration's annotated rows included) pickled
by ``torch.distributed.broadcast_object_list`` over the trainer's own process group; each of them runs
:func:`follow` on a session of its own built from the same checkpoint without a rollout engine, and
makes the same call. Inside it DeepSpeed all-reduces the gradients, as in data-parallel SFT: each rank
trains its share of every optimizer step (:func:`components.train.rl_update.actor_update`). Everything
else (rollout, validation, the final evaluation) runs on rank 0 alone, on the rollout engine. With
ZeRO stages 0-2 every rank holds whole weights, and the log-probs and values the estimator reads, the
weight sync and the final model are rank 0's alone too. Under ZeRO-3 (``session.zero3``) each rank
holds a shard of every weight: a forward and a read of whole weights are collectives, so
:data:`GATHERING` (``annotate``, ``sync``, ``final_model``) is mirrored too, and the followers' results
are dropped (:func:`mirrored_calls`).

A follower that fails stops taking calls; rank 0's watch (components.train.rank_watch) sees it end
and stops the stage within seconds, whatever rank 0 is doing.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

__all__ = ["GATHERING", "MIRRORED", "Leader", "follow", "mirrored_calls"]

MIRRORED = ("update", "save", "restore")
# what reads whole weights or runs a forward: every rank's call under ZeRO-3 (sharded parameters)
GATHERING = ("annotate", "sync", "final_model")
_STOP = "__stop__"


def mirrored_calls(session: Any) -> tuple[str, ...]:
    """The session methods every rank makes: :data:`MIRRORED`, and :data:`GATHERING` under ZeRO-3."""
    return MIRRORED + GATHERING if getattr(session, "zero3", False) else MIRRORED


def _broadcast(message: tuple | None) -> tuple:
    box = [message]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class Leader:
    """Rank 0's view of the session: the session's own attributes, with :func:`mirrored_calls` sent
    to every follower before they run here."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.mirrored = mirrored_calls(session)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.session, name)
        if name not in self.mirrored:
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
    """On ranks 1..N-1: make rank 0's :func:`mirrored_calls` on ``session`` until it closes; returns
    how many calls were made."""
    mirrored = mirrored_calls(session)
    calls = 0
    while True:
        name, args, kwargs = _broadcast(None)
        if name == _STOP:
            return calls
        if name not in mirrored:
            raise RuntimeError(f"rank 0 sent {name!r}, which is not a mirrored call {mirrored}")
        getattr(session, name)(*args, **kwargs)
        calls += 1
