"""RLSession.annotate with old log-probs taken from the rollout: no actor forward, exact copies."""

from __future__ import annotations

import dataclasses

import pytest
from train_helpers import session_config

from components.train.rl_session import RLSession, SessionConfig

CFG = session_config(critic_lr=1e-3, old_logprobs="rollout")


class _NoForward:
    def __getattr__(self, name):
        raise AssertionError(f"the actor was used ({name}) although old log-probs come from the rollout")


def _session(cfg: SessionConfig) -> RLSession:
    s = object.__new__(RLSession)  # engines are not needed for this path
    s.cfg, s.actor, s.ref, s.critic, s.pad_id = cfg, _NoForward(), None, None, 0
    return s


@pytest.mark.parametrize("source", ["rollout", "detached"])  # detached: the update replaces them itself
def test_rollout_logprobs_become_old_logprobs_without_a_forward(source):
    rows = [
        {
            "traj_id": "a",
            "step": 0,
            "prompt_ids": [1, 2],
            "response_ids": [3, 4],
            "response_logprobs": [-0.5, -1.25],
        },
        {"traj_id": "b", "step": 0, "prompt_ids": [1], "response_ids": [5], "response_logprobs": [-2.0]},
    ]
    out = _session(dataclasses.replace(CFG, old_logprobs=source)).annotate(rows)
    assert [r["old_logprobs"] for r in out] == [[-0.5, -1.25], [-2.0]]
    assert all(r["ref_logprobs"] is None and r["values"] is None for r in out)
    assert "old_logprobs" not in rows[0]  # the input rows are not modified


def test_unknown_old_logprobs_source_is_named():
    with pytest.raises(ValueError, match="old_logprobs='vllm'"):
        RLSession("/nonexistent", dataclasses.replace(CFG, old_logprobs="vllm"), None)
