"""`make repro` ends with where the time went: the stages this run ran, from their timing/ files."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from flows import repro

START = datetime(2026, 12, 1, 20, 0, 0, tzinfo=UTC)


def _record(timing: Path, stage: str, finished: datetime, start: float, parts: dict, total: float) -> None:
    timing.mkdir(exist_ok=True)
    (timing / f"{stage}.json").write_text(
        json.dumps(
            {
                "stage": stage,
                "finished": finished.isoformat(timespec="seconds"),
                "process_start": start,
                "parts": parts,
                "other": total - start - sum(parts.values()),
                "total": total,
            }
        )
    )


def _fixture(timing: Path) -> None:
    _record(timing, "prepare", START - timedelta(hours=1), 8.0, {}, 40.0)  # up to date: an older run's
    _record(timing, "train-grpo-0", START + timedelta(seconds=400), 9.5, {"iterations": 250.0, "save": 3.0,
            "rollout_engine": 30.0}, 300.0)  # fmt: skip
    _record(timing, "sft", START + timedelta(seconds=90), 7.0, {"sft": 60.0}, 80.0)
    (timing / "notes.json").write_text("[1, 2]")  # not a record


def test_the_table_lists_this_runs_stages_in_order_with_their_largest_parts(tmp_path):
    timing = tmp_path / "timing"
    _fixture(timing)
    records = repro.stages_since(timing, START)
    assert [r["stage"] for r in records] == ["sft", "train-grpo-0"]  # prepare was up to date
    lines = repro.time_table(records, wall_s=420.0).splitlines()
    assert lines[0].split()[:3] == ["stage", "wall", "s"]
    assert lines[1].split() == ["sft", "80.0", "7.0", "sft", "60"]
    assert lines[2].split() == ["train-grpo-0", "300.0", "9.5", "iterations", "250,", "rollout_engine", "30"]
    assert lines[3].split() == ["stages", "(sum)", "380.0", "16.5"]
    assert lines[4].split()[:3] == ["this", "run", "420.0"]
    assert lines[4].endswith("hand-offs: 40 s)")


def test_nothing_is_printed_when_no_stage_ran(tmp_path, capsys):
    timing = tmp_path / "timing"
    _fixture(timing)
    assert repro.time_table(repro.stages_since(timing, START + timedelta(days=1)), wall_s=3.0) == ""
    repro.print_time_table(START + timedelta(days=1), 0.0, timing)
    repro.print_time_table(START, 0.0, tmp_path / "absent")
    assert capsys.readouterr().out == ""


def test_the_command_ends_with_the_table_of_the_stages_it_ran(tmp_path, monkeypatch, capsys):
    """main() prints the table after the command, whatever its exit code (here a stand-in stage)."""
    timing = tmp_path / "timing"
    monkeypatch.setattr(repro, "TIMING_DIR", timing)
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # no server is started
    stage = (
        "import json, sys, datetime;"
        f"open({str(timing / 'sft.json')!r}, 'w').write(json.dumps({{'stage': 'sft', 'process_start': 2.0,"
        "'parts': {'sft': 5.0}, 'other': 1.0, 'total': 8.0,"
        "'finished': datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}));"
        "sys.exit(4)"
    )
    timing.mkdir()
    assert repro.main(["--", sys.executable, "-c", stage]) == 4
    out = capsys.readouterr().out
    assert "repro: where the time went" in out
    assert out.strip().splitlines()[-3].split() == ["sft", "8.0", "2.0", "sft", "5"]
