"""The train stage builds no reference model unless a KL term is on, and passes the old log-prob source."""

from __future__ import annotations

import pytest

import flows.train as train
import flows.train_settings as train_settings
from components.config import load_params
from flows import REPO


class _Recorder:
    """Stands in for RLSession here only to capture the config the flow builds it with."""

    def __init__(self, init_dir, cfg, tools) -> None:
        self.cfg = cfg


@pytest.mark.parametrize(("kl_coef", "use_ref"), [(0.0, False), (0.05, True)])
def test_reference_model_only_with_a_kl_term(monkeypatch, kl_coef, use_ref):
    params = load_params(REPO / "params.yaml")
    params = params.model_copy(update={"train": params.train.model_copy(update={"kl_coef": kl_coef})})
    monkeypatch.setattr(train, "RLSession", _Recorder)
    cfg = train._open_session(params, "grpo").cfg
    assert cfg.use_ref is use_ref
    assert cfg.old_logprobs == params.train.old_logprobs


def test_default_old_logprobs_are_the_updates_own_detached():
    """The exact source that costs no forward: the default update is on-policy (one step per iteration)."""
    assert load_params(REPO / "params.yaml").train.old_logprobs == "detached"


class _UpdateRecorder:
    """Stands in for a live RLSession in the update task: records what the actor and critic are given."""

    def update(self, rows, *, actor, critic, seed):
        self.actor, self.critic = actor, critic
        return {}

    def save(self, path, metadata):
        return str(path)


@pytest.mark.parametrize(("critic_mini", "expected"), [(None, 512), (64, 64)])
def test_the_critic_takes_its_own_mini_batch_size(monkeypatch, tmp_path, critic_mini, expected):
    import polars as pl

    params = load_params(REPO / "params.yaml")
    t = params.train.model_copy(update={"critic_mini_batch_size": critic_mini, "mini_batch_size": 512})
    params = params.model_copy(update={"train": t})
    batch = tmp_path / "batch.parquet"
    pl.DataFrame({"traj_id": ["a"]}).write_parquet(batch)
    rec = _UpdateRecorder()
    monkeypatch.setattr(train, "iter_dir", lambda name, k: tmp_path / name / f"iter_{k}")
    train.update.fn(rec, "ppo", "ppo-s0", 0, str(batch), "policy", params, "run")
    assert rec.critic.mini_batch_size == expected
    assert rec.actor.mini_batch_size == 512  # the actor keeps one step per iteration
    assert rec.critic.micro_batch_size == rec.actor.micro_batch_size == t.micro_batch_size


def test_a_stale_rollout_runs_vllm_in_a_process_of_its_own():
    """rollout.staleness >= 1 generates while the update runs: vLLM's kernels in the trainer's process
    changed the update's last bits, so the engine gets a process of its own (at 0: in-process)."""
    params = load_params(REPO / "params.yaml")
    assert train_settings.session_config(params, "grpo").rollout.own_process is False
    tis = {a: params.algorithms[a].model_copy(update={"correction": "tis"}) for a in params.algorithms}
    stale = params.model_copy(
        update={"rollout": params.rollout.model_copy(update={"staleness": 1}), "algorithms": tis}
    )
    assert train_settings.session_config(stale, "grpo").rollout.own_process is True


def test_own_process_puts_vllm_in_a_process_of_its_own_at_staleness_0():
    params = load_params(REPO / "params.yaml", overrides={"rollout.own_process": True})
    settings = train_settings.session_config(params, "grpo").rollout
    assert settings.own_process is True and params.rollout.staleness == 0
    assert settings.sleep_mode is True  # synchronous: nothing generates during the update
    assert settings.inflight_updates is False
