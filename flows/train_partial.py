"""The train stage's rollout task at ``rollout.partial`` (components.train.partial): iteration k tops
the groups in flight up to ``rollout.partial_pool`` x ``need`` with new prompt groups, plays them
beside the episodes carried from iteration k-1, stops once ``need`` groups are complete, and carries
the rest to iteration k+1 in ``runs/<name>/iter_<k>/inflight.parquet``.

The task is cached on the bytes of what it reads (the policy's marker, the train split, the carried
table), like :func:`flows.train.rollout`, so a stopped run resumes it from the tables alone.
"""

from __future__ import annotations

import math
import random

import polars as pl
from prefect import task

from components.agent.loop import Episode, replay_episode
from components.config import Params
from components.envs import get_task
from components.io import write_parquet
from components.schemas import StepSchema, validate_table
from components.train.collapse import collapse_metrics
from components.train.partial import complete_groups, ended_episodes, problem_id, take_batch
from components.train.staleness import staleness_metrics
from flows import processed
from flows._cache import content_key
from flows.train_settings import iter_dir, prompts_per_iteration, rl_prompts

INFLIGHT = "inflight.parquet"


def carried_table(name: str, k: int) -> str | None:
    """The table iteration ``k``'s partial rollout goes on from: iteration k-1's in-flight steps."""
    return None if k == 0 else str(iter_dir(name, k - 1) / INFLIGHT)


@task(cache_key_fn=content_key("policy", "train_split", "carried", ignore=("session",)), persist_result=True)
def partial_rollout(
    session,
    algo: str,
    name: str,
    k: int,
    version: int,
    policy: str,
    train_split: str,
    carried: str | None,
    params: Params,
    run: str,
) -> dict:
    """Iteration ``k``'s partial rollout by policy version ``version``: rollouts.parquet holds the batch
    (the first complete groups), inflight.parquet what goes on in iteration k+1; every step row has
    the ``policy_version`` that generated it. Returns the batch's path, its ``partial/*``,
    ``rollout/staleness_*`` and ``collapse/*`` metrics."""
    spec = get_task(params.task)
    a, t, r = params.algorithms[algo], params.train, params.rollout
    need = prompts_per_iteration(params, algo)
    pool = rl_prompts(pl.read_parquet(train_split), params).to_dicts()
    by_id = {str(row["id"]): row for row in pool}
    old = pl.read_parquet(carried).to_dicts() if carried else []

    def env(row: dict):
        return spec.make_env(
            row,
            malformed_penalty=t.malformed_penalty,
            data_dir=processed(params.task),
            tool_parser=r.tool_parser,
        )

    records: dict[str, list[dict]] = {}
    for row in old:
        records.setdefault(str(row["traj_id"]), []).append(row)
    group_of = {traj: str(rows[0]["group_id"]) for traj, rows in records.items()}
    kept: dict[str, list[dict]] = {}  # ended episodes carried as records (their groups still incomplete)
    live: list[Episode] = []
    departures = 0
    for traj, rows in records.items():
        if rows[-1]["done"]:
            kept[traj] = rows
            continue
        row = by_id[problem_id(group_of[traj])]
        ep = Episode(traj, group_of[traj], env(row), row)
        departure = replay_episode(ep, session.renderer, rows, context_window=r.context_window)
        if departure is None:
            live.append(ep)
            continue
        print(f"{name} iteration {k}: {departure}; the episode ends at its last record (truncated)")
        departures += 1
        kept[traj] = [*rows[:-1], {**rows[-1], "done": True, "truncated": True}]
    in_flight = len({group_of[traj] for traj in records})
    top_up = max(0, math.ceil(r.partial_pool * need) - in_flight)
    fresh = random.Random(params.seed * 100_003 + k).sample(pool, min(top_up, len(pool)))
    for row in fresh:
        for j in range(a.samples_per_prompt):
            traj = f"{k}-{row['id']}-{j}"
            group_of[traj] = f"{k}-{row['id']}"
            live.append(Episode(traj, group_of[traj], env(row), row))
    groups = len(set(group_of.values()))

    def enough() -> bool:
        if any(ep.turn == 0 and not ep.done for ep in live):  # every started episode plays a turn first
            return False
        ended = {traj: True for traj in kept} | {ep.traj_id: ep.done for ep in live}
        return len(complete_groups(ended, group_of)) >= min(need, groups)

    before = {ep.traj_id: len(ep.steps) for ep in live}
    session.play(
        live,
        **r.episode_limits(),
        temperature=t.temperature,
        seed=params.seed * 7919 + k,
        desc=f"{name} rollout {k} (partial)",
        until=enough,
    )
    played = {ep.traj_id: ep for ep in live}
    steps: list[dict] = []
    for traj in group_of:  # the order the groups were started in: carried first, then this iteration's
        if traj in kept:
            steps += kept[traj]
            continue
        ep = played[traj]
        for i, s in enumerate(ep.steps):
            steps.append({**s, "policy_version": s["policy_version"] if i < before[traj] else version})
    batch, carry = take_batch(steps, need)
    where = f"{name} iteration {k}"
    df = validate_table(pl.DataFrame(batch), StepSchema, f"{where} rollouts")
    out = iter_dir(name, k)
    left = pl.DataFrame(carry, schema=df.schema) if carry else df.clear()
    write_parquet(validate_table(left, StepSchema, f"{where} in-flight steps"), out / INFLIGHT)
    metrics = {
        "partial/carried_in_episodes": float(len(records)),
        "partial/carried_out_episodes": float(len(ended_episodes(carry))),
        "partial/new_groups": float(len(fresh)),
        "partial/replay_departures": float(departures),
        "partial/turns": float(max((len(ep.steps) - before[ep.traj_id] for ep in live), default=0)),
        **{f"rollout/{key}": v for key, v in staleness_metrics(df["policy_version"].to_list(), k).items()},
        **collapse_metrics(batch),
    }
    return {"rollouts": str(write_parquet(df, out / "rollouts.parquet")), "metrics": metrics}
