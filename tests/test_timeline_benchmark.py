"""benchmarks/timeline.py: recorded spans are drawn where they happened (overlapping at staleness 1),
spans without a record are laid out one phase after the other."""

from __future__ import annotations

import json

import pytest

from benchmarks.timeline import draw, overlap, spans


def _iteration(run, k, metrics):
    d = run / f"iter_{k:04d}"
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps(metrics))


def test_recorded_spans_keep_their_overlap(tmp_path):
    run = tmp_path / "runs" / "grpo-s0"
    # staleness 1: generation 1 runs during update 0
    _iteration(
        run,
        0,
        {
            "timeline/rollout_start": 100.0,
            "timeline/rollout_end": 104.0,
            "timeline/update_start": 105.0,
            "timeline/update_end": 110.0,
        },
    )
    _iteration(
        run,
        1,
        {
            "timeline/rollout_start": 104.5,
            "timeline/rollout_end": 108.0,
            "timeline/update_start": 110.5,
            "timeline/update_end": 115.0,
        },
    )
    its, recorded = spans(run)
    assert recorded
    assert its[0] == {"rollout": (0.0, 4.0), "update": (5.0, 10.0), "forwards": (5.0, 5.0)}
    assert its[1]["rollout"] == (4.5, 8.0)  # inside update 0
    assert overlap(its) == pytest.approx(3.0)
    out = tmp_path / "t.png"
    draw({"s1": (its, recorded)}, out)
    assert out.stat().st_size > 1000


def test_unrecorded_spans_are_laid_out_from_durations(tmp_path):
    run = tmp_path / "runs" / "grpo-s0"
    timing = {
        "timing_s/rollout": 3.0,
        "timing_s/score": 0.5,
        "timing_s/advantage": 1.5,
        "timing_s/update": 4.0,
        "timing_s/sync": 1.0,
    }
    _iteration(run, 0, timing)
    _iteration(run, 1, {**timing, "timing_s/validation": 2.0})
    _iteration(run, 2, timing)
    its, recorded = spans(run)
    assert not recorded
    assert its[0] == {"rollout": (0.0, 3.0), "forwards": (3.0, 5.0), "update": (5.0, 9.0)}
    assert its[1] == {"rollout": (10.0, 13.0), "forwards": (13.0, 15.0), "update": (15.0, 19.0)}
    assert its[2]["rollout"] == (22.0, 25.0)  # after iteration 1's sync and validation
    assert overlap(its) == 0.0


def test_a_run_without_iterations_is_named(tmp_path):
    with pytest.raises(SystemExit, match="no iter_"):
        spans(tmp_path / "runs" / "grpo-s0")
