"""iteration_metrics: the tool-use metrics of an RL iteration by hand, and the same numbers as the
evaluation's episode_metrics on the same step records."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from components.agent.loop import episode_metrics
from flows.train_metrics import anchor_metrics, iteration_metrics


def _row(
    traj: str,
    step: int,
    *,
    calls: int = 0,
    valid: int | None = None,
    reward: float = 0.0,
    correct: bool = False,
    done: bool = False,
    truncated: bool = False,
    fmt: bool = False,
) -> dict:
    return {
        "traj_id": traj,
        "group_id": traj[0],
        "step": step,
        "prompt_ids": [1] * (10 + step),
        "response_ids": [2] * 4,
        "reward": reward,
        "done": done,
        "truncated": truncated,
        "correct": correct,
        "format_error": fmt,
        "n_calls": calls,
        "n_valid_calls": calls if valid is None else valid,
        "advantages": [0.5] * 4,
        "returns": [reward] * 4,
    }


def _batch() -> list[dict]:
    return [
        # 2 calls then a correct answer
        _row("a0", 0, calls=1),
        _row("a0", 1, calls=1),
        _row("a0", 2, reward=1.0, correct=True, done=True),
        # an answer at step 0, without a tool
        _row("b0", 0, done=True),
        # a call, then a response cut at max_response_len
        _row("c0", 0, calls=2, valid=1, fmt=True),
        _row("c0", 1, done=True, truncated=True, fmt=True),
    ]


def test_tool_use_metrics_by_hand() -> None:
    m = iteration_metrics(pl.DataFrame(_batch()), {"actor/pg_loss": 0.25})
    assert m["tool_calls/per_step"] == pytest.approx(4 / 6)  # 1 + 1 + 0 | 0 | 2 + 0 calls, 6 steps
    assert m["tool_calls/per_iteration"] == 4.0
    assert m["tool_calls/per_trajectory"] == pytest.approx(4 / 3)
    assert m["tool_calls/answer_without_tool_rate"] == pytest.approx(1 / 3)  # b0 only
    assert m["tool_calls/valid_rate"] == pytest.approx(3 / 4)
    assert m["num_steps/mean"] == pytest.approx(6 / 3)
    assert m["format_error/rate"] == pytest.approx(2 / 6)
    assert m["truncated/rate"] == pytest.approx(1 / 3)
    assert m["actor/pg_loss"] == 0.25
    assert all(isinstance(v, float) for v in m.values())

    # a truncated episode without any call is not an answer without a tool
    cut_only = [_row("d0", 0, done=True, truncated=True, fmt=True)]
    assert iteration_metrics(pl.DataFrame(cut_only), {})["tool_calls/answer_without_tool_rate"] == 0.0
    assert (
        iteration_metrics(pl.DataFrame([_row("b0", 0, done=True)]), {})["tool_calls/answer_without_tool_rate"]
        == 1.0
    )


def test_same_numbers_as_the_evaluation() -> None:
    rows = _batch() + [
        _row("e0", 0, calls=3),
        _row("e0", 1, calls=1, done=True, truncated=True),
        _row("f0", 0, done=True, fmt=True),
    ]
    it = iteration_metrics(pl.DataFrame(rows), {})
    ev = episode_metrics(rows)
    for train_key, eval_key in [
        ("tool_calls/per_step", "tool_calls_per_step"),
        ("tool_calls/per_trajectory", "tool_calls_per_episode"),
        ("tool_calls/answer_without_tool_rate", "answer_without_tool_rate"),
        ("num_steps/mean", "mean_turns"),
        ("format_error/rate", "format_error_rate"),
        ("truncated/rate", "truncated_rate"),
        ("tool_calls/valid_rate", "valid_tool_call_rate"),
        ("train/accuracy", "accuracy"),
    ]:
        assert it[train_key] == pytest.approx(ev[eval_key]), train_key
    assert ev["answer_without_tool_rate"] == pytest.approx(2 / 5)  # b0 and f0 (untagged final text)


def test_anchor_metrics_only_for_estimators_that_group_by_state():
    rows = [
        {"traj_id": "a", "group_id": "g", "step": 0, "obs_key": "s0"},
        {"traj_id": "a", "group_id": "g", "step": 1, "obs_key": "s1"},
        {"traj_id": "a", "group_id": "g", "step": 2, "obs_key": "s0"},  # a revisit of s0
        {"traj_id": "b", "group_id": "g", "step": 0, "obs_key": "s1"},  # s1 at another step index
        {"traj_id": "c", "group_id": "h", "step": 0, "obs_key": "s0"},  # s0 of another prompt group
    ]
    batch = pl.DataFrame(rows)
    assert anchor_metrics(batch, "gigpo") == {
        "gigpo/anchor_groups": 2.0,
        "gigpo/anchor_group_size": 2.0,
        "gigpo/anchored_step_frac": 4 / 5,
    }
    assert anchor_metrics(batch, "grpo") == {} and anchor_metrics(batch, "step_gae") == {}
    # a batch without obs_key (rollouts of an older loop): groups by step index, as the estimator does
    no_keys = batch.drop("obs_key")
    assert anchor_metrics(no_keys, "gigpo")["gigpo/anchor_groups"] == 1.0  # step 0 of g: {a, b}; c alone in h


def test_critic_explained_variance_with_its_interval_over_trajectories():
    # 40 trajectories of 2 steps x 4 tokens; the value knows the return up to noise
    rows = []
    for t in range(40):
        ret = float(t % 5)
        for s in range(2):
            r = _row(f"t{t}", s, reward=ret if s == 1 else 0.0, done=s == 1)
            r["returns"] = [ret] * 4
            r["values"] = [ret + (0.8 if (t + s) % 2 else -0.8)] * 4
            rows.append(r)
    m = iteration_metrics(pl.DataFrame(rows), {})
    returns = np.array([x for r in rows for x in r["returns"]])
    values = np.array([x for r in rows for x in r["values"]])
    plain = 1 - np.var(returns - values, ddof=1) / np.var(returns, ddof=1)
    assert m["critic/vf_explained_var"] == pytest.approx(plain)
    assert m["critic/vf_explained_var_low"] < plain < m["critic/vf_explained_var_high"]
    # without values (a critic-free estimator) no critic figure at all
    assert not any(k.startswith("critic/vf_") for k in iteration_metrics(pl.DataFrame(_batch()), {}))
