"""The critic_warmup stage's output is this run's or nothing: run directly (not through DVC, which
removes a stage's outputs first), a fit left in models/critic by an earlier run is removed, so
flows.train_settings.warm_critic, where the train stage takes its critic from, never starts a run
from it; a fitted critic beside the stage's off.json marker is not used either."""

from __future__ import annotations

import json

import pytest
import yaml

from components.marker import seal
from flows import REPO
from flows import critic_warmup as stage
from flows._stage import StageError
from flows.train_settings import warm_critic

PARAMS = str(REPO / "params.yaml")


def _fitted_critic(path) -> None:
    """A complete checkpoint at ``path`` (what an earlier fit's save_hf left), files and marker."""
    tmp = path.parent / ".critic.tmp"
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text("{}")
    (tmp / "model.safetensors").write_bytes(b"weights of an earlier fit")
    seal(tmp, path, path.parent / ".critic.old", {"episodes": 64})


@pytest.fixture
def outputs(tmp_path, monkeypatch):
    """The stage's outputs under tmp_path, an earlier fit already in models/critic."""
    critic = tmp_path / "models" / "critic"
    monkeypatch.setattr(stage, "CRITIC", critic)
    monkeypatch.setattr(stage, "METRICS", tmp_path / "metrics" / "critic_warmup.json")
    monkeypatch.setattr(stage, "CURVE", tmp_path / "plots" / "critic_warmup.csv")
    _fitted_critic(critic)
    assert warm_critic(critic) == critic
    return critic


def test_episodes_0_run_directly_leaves_no_earlier_fit_for_the_runs(outputs) -> None:
    stage.main(PARAMS)  # params.yaml: critic_warmup.episodes 0
    assert warm_critic(outputs) is None
    assert sorted(p.name for p in outputs.iterdir()) == ["off.json"]
    assert json.loads((outputs / "off.json").read_text())["off"] is True


def test_a_fit_beside_the_off_marker_is_not_used(outputs) -> None:
    (outputs / "off.json").write_text('{"off": true}')
    assert warm_critic(outputs) is None


def test_a_failed_fit_leaves_no_earlier_fit_either(outputs, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(stage, "SFT", tmp_path / "models" / "sft")  # no SFT checkpoint: the stage stops
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["critic_warmup"]["episodes"] = 64
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(StageError, match="not a complete checkpoint"):
        stage.main(str(tmp_path / "params.yaml"))
    assert not outputs.exists() and warm_critic(outputs) is None
