"""Partial rollouts (``rollout.partial``): an iteration's rollout stops once it has its batch, and the
episodes still running go on in the next iteration's rollout, under the weights of that iteration.

Iteration k's rollout tops the groups in flight up to ``rollout.partial_pool`` x ``need`` with new
prompt groups and plays them turn by turn beside the groups carried from iteration k-1, until
``need`` groups are complete (every episode of the group ended). The batch is the first ``need``
complete groups in the order they were started (carried groups first); everything else is carried
on: unfinished episodes, and the ended episodes of groups that are still incomplete or did not fit
the batch. A group is never split between batches, so the group estimators (GRPO, RLOO, GiGPO) see
whole groups as they do without partial rollouts. With a pool of 1 every group in flight must
complete, which is the synchronous rollout again; with 1.5 the slowest third of the pool's groups
does not hold the iteration up: it goes on under the next weights.

Every round of turns advances every unfinished episode, and an episode ends by ``rollout.max_steps``
turns at the latest, so a group started at iteration k is complete by its ``max_steps``-th rollout:
no group waits for ever, and no iteration's batch is short unless the prompt pool is.

Each step keeps the policy version that generated it (``policy_version``); a batch's staleness is the
iteration minus those versions, so a step can be older than ``rollout.staleness``: by at most the
iterations its episode stayed in flight. The carried state is its step records, not live objects:
the next rollout rebuilds each unfinished episode by playing its recorded actions again
(:func:`components.agent.loop.replay_episode`), which checks the token ids and the environment's
answers against the records. A stopped run therefore resumes from the tables alone, and an
environment that answers otherwise the second time (a sandbox call that timed out once) ends that
episode at its last record (truncated) instead of going on from a state that is not the recorded one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["complete_groups", "ended_episodes", "problem_id", "take_batch"]


def problem_id(group_id: str) -> str:
    """The problem (train-split ``id``) of a training group ``"<iteration>-<id>"``."""
    head, sep, rest = str(group_id).partition("-")
    if not sep or not head.isdigit():
        raise ValueError(f"group_id {group_id!r} is not '<iteration>-<problem id>'")
    return rest


def ended_episodes(rows: Sequence[Mapping[str, Any]]) -> dict[str, bool]:
    """traj_id -> whether the episode has ended (its last record says ``done``), in first-seen order."""
    out: dict[str, bool] = {}
    for r in rows:
        out[str(r["traj_id"])] = bool(r["done"])
    return out


def complete_groups(ended: Mapping[str, bool], group_of: Mapping[str, str]) -> list[str]:
    """The groups all of whose episodes have ended, in the order their first episode appears."""
    order: dict[str, bool] = {}
    for traj, done in ended.items():
        g = group_of[traj]
        order[g] = order.get(g, True) and done
    return [g for g, complete in order.items() if complete]


def take_batch(rows: Sequence[Mapping[str, Any]], need: int) -> tuple[list[dict], list[dict]]:
    """Split step ``rows`` (groups in the order they were started) into the batch, the rows of the
    first ``need`` complete groups, and the rows carried to the next iteration (every other group's),
    each in the rows' order."""
    if need < 1:
        raise ValueError(f"need={need} must be >= 1")
    group_of = {str(r["traj_id"]): str(r["group_id"]) for r in rows}
    taken = set(complete_groups(ended_episodes(rows), group_of)[:need])
    batch = [dict(r) for r in rows if str(r["group_id"]) in taken]
    carried = [dict(r) for r in rows if str(r["group_id"]) not in taken]
    return batch, carried
