"""Per-iteration metrics with the names verl users know (critic/score/mean, actor/pg_loss, ...).

Tool use, with the same definitions as ``components.agent.loop.episode_metrics`` (evaluation):
``tool_calls/per_step`` (= tool_calls_per_step), ``tool_calls/per_trajectory`` (=
tool_calls_per_episode), ``tool_calls/answer_without_tool_rate`` (= answer_without_tool_rate),
``num_steps/mean`` (= mean_turns). ``format_error/rate`` is per step like format_error_rate.

``process_reward/mean`` and ``process_reward/scored_step_frac``: the task's process rewards (the mean
over the steps it scored, and the share of steps it scored), for tasks that score tool calls.

For critic-based estimators, ``critic/vf_explained_var`` is the critic's explained variance of the
returns on the iteration's batch (its values from before the update), with ``_low`` / ``_high``, its
95% bootstrap interval over the batch's trajectories (``components.stats.explained_variance_interval``).

For estimators that group steps by state (``gigpo``), :func:`anchor_metrics` adds
``gigpo/anchor_groups``, ``gigpo/anchor_group_size`` and ``gigpo/anchored_step_frac``
(``components.train.advantage.anchor_group_stats``).
"""

from __future__ import annotations

import polars as pl

from components.algos import get_advantage_estimator
from components.stats import explained_variance_interval
from components.train.advantage import anchor_group_stats


def iteration_metrics(batch: pl.DataFrame, update: dict[str, float]) -> dict[str, float]:
    """Metrics of one iteration from its batch table (before the update) and the update's metrics."""
    traj = batch.group_by("traj_id").agg(
        pl.col("reward").sum().alias("ret"),
        pl.col("correct").any().alias("ok"),
        pl.len().alias("steps"),
        pl.col("truncated").any().alias("trunc"),
        ((pl.col("done") & ~pl.col("truncated")).any() & (pl.col("n_calls").sum() == 0)).alias(
            "no_tool_answer"
        ),
    )
    adv = batch["advantages"].explode().drop_nulls()
    ret = batch["returns"].explode().drop_nulls()
    calls = batch["n_calls"].sum()
    m = {
        "critic/score/mean": traj["ret"].mean(),
        "critic/score/max": traj["ret"].max(),
        "critic/score/min": traj["ret"].min(),
        "critic/rewards/mean": batch["reward"].mean(),
        "critic/advantages/mean": adv.mean(),
        "critic/advantages/max": adv.max(),
        "critic/advantages/min": adv.min(),
        "critic/returns/mean": ret.mean(),
        "train/accuracy": traj["ok"].mean(),
        "num_steps/mean": traj["steps"].mean(),
        "truncated/rate": traj["trunc"].mean(),
        "response_length/mean": batch["response_ids"].list.len().mean(),
        "response_length/max": batch["response_ids"].list.len().max(),
        "prompt_length/mean": batch["prompt_ids"].list.len().mean(),
        "tool_calls/valid_rate": (batch["n_valid_calls"].sum() / calls) if calls else 0.0,
        "tool_calls/per_trajectory": calls / max(traj.height, 1),
        "tool_calls/per_step": calls / max(batch.height, 1),
        # every call of the iteration's rollout (the load on a tool: the code task's sandbox)
        "tool_calls/per_iteration": float(calls),
        # episodes that ended on their own final turn (not truncated) without any tool call
        "tool_calls/answer_without_tool_rate": traj["no_tool_answer"].mean(),
        "format_error/rate": batch["format_error"].mean(),
        "perf/generated_tokens": float(batch["response_ids"].list.len().sum()),
        "batch/step_rows": float(batch.height),
    }
    if "process_reward" in batch.columns and batch["process_reward"].null_count() < batch.height:
        scored = batch["process_reward"].drop_nulls()
        m["process_reward/mean"] = scored.mean()  # over the steps the task scored
        m["process_reward/scored_step_frac"] = scored.len() / batch.height
    if "values" in batch.columns and batch["values"].null_count() < batch.height:
        vals = batch["values"].explode().drop_nulls()
        m["critic/values/mean"] = vals.mean()
        # per trajectory: its rows' (token or step) returns and values, for the interval's resampling
        groups: dict[str, tuple[list[float], list[float]]] = {}
        for t, rs, vs in zip(batch["traj_id"], batch["returns"].to_list(), batch["values"].to_list()):
            if vs:
                g = groups.setdefault(t, ([], []))
                g[0].extend(rs[: len(vs)])
                g[1].extend(vs[: len(rs)])
        ev = explained_variance_interval([g[0] for g in groups.values()], [g[1] for g in groups.values()])
        m["critic/vf_explained_var"] = ev.value
        m["critic/vf_explained_var_low"] = ev.low
        m["critic/vf_explained_var_high"] = ev.high
    m.update(update)
    return {k: float(v) for k, v in m.items() if v is not None}


def anchor_metrics(batch: pl.DataFrame, estimator: str) -> dict[str, float]:
    """``gigpo/*``: the anchor-state step groups of the batch (step groups with >= 2 steps: how many,
    their mean size, the fraction of step rows in one), for estimators that group steps by state
    (``needs_obs_index``); nothing for the others."""
    if not get_advantage_estimator(estimator).needs_obs_index:
        return {}
    rows = batch.select(c for c in ("group_id", "step", "obs_key") if c in batch.columns).to_dicts()
    return {f"gigpo/{k}": float(v) for k, v in anchor_group_stats(rows).items()}
