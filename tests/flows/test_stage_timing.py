"""The record of where a stage's time went (flows._stage: timing/<stage>.json, read by
benchmarks/stage_time.py): the stage's name, its parts, and the rest of the run."""

from __future__ import annotations

import json
import sys

import pytest

from flows import _stage


@pytest.fixture
def clock(tmp_path, monkeypatch):
    """An empty STAGE_PARTS and a TIMING_DIR under tmp_path."""
    monkeypatch.setattr(_stage, "STAGE_PARTS", {})
    monkeypatch.setattr(_stage, "TIMING_DIR", tmp_path / "timing")
    return tmp_path / "timing"


def test_the_stage_name_is_its_module_and_its_own_arguments(monkeypatch):
    def main(**_):
        pass

    main.__module__ = "flows.train"
    extra = (("--algo", {}), ("--rl-seed", {"type": int, "dest": "rl_seed"}))
    assert (
        _stage.stage_name(main, {"params": "p.yaml", "algo": "grpo", "rl_seed": 0}, extra) == "train-grpo-0"
    )
    main.__module__ = "__main__"  # python -m flows.evaluate: the module's name is in __main__'s spec
    spec = type("Spec", (), {"name": "flows.evaluate"})()
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", spec, raising=False)
    assert _stage.stage_name(main, {"model": "sft"}, (("--model", {}),)) == "evaluate-sft"


def test_timed_parts_add_up_and_the_rest_is_other(clock):
    parts: dict[str, float] = {}
    for _ in range(2):
        with _stage.timed("episodes"), _stage.timed("mine", parts):
            pass
    assert set(_stage.STAGE_PARTS) == {"episodes"} and set(parts) == {"mine"}
    _stage.STAGE_PARTS["episodes"] = 3.0
    written = json.loads(_stage.write_stage_timing("evaluate-sft", 2.0, 5.0).read_text())
    assert written["stage"] == "evaluate-sft" and written["finished"]
    assert (written["process_start"], written["parts"], written["other"], written["total"]) == (
        2.0,
        {"episodes": 3.0},
        2.0,
        7.0,
    )
    assert (clock / "evaluate-sft.json").is_file()


def test_stage_main_writes_the_record_only_when_the_stage_succeeds(clock, monkeypatch):
    monkeypatch.setattr(_stage, "make_stage_deterministic", lambda params: None)

    def main(params: str, model: str) -> None:
        with _stage.timed("episodes"):
            if model == "bad":
                raise _stage.StageError("no such model")

    main.__module__ = "flows.evaluate"
    extra = ("--model", {"required": True})
    monkeypatch.setattr(sys, "argv", ["evaluate", "--model", "bad"])
    with pytest.raises(SystemExit):
        _stage.stage_main(main, extra)
    assert not clock.exists()
    monkeypatch.setattr(sys, "argv", ["evaluate", "--model", "sft"])
    _stage.stage_main(main, extra)
    record = json.loads((clock / "evaluate-sft.json").read_text())
    assert set(record["parts"]) == {"episodes"} and record["process_start"] > 0
