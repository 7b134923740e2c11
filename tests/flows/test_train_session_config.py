"""The train stage builds no reference model unless a KL term is on, and passes the old log-prob source."""

from __future__ import annotations

import pytest

import flows.train as train
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
