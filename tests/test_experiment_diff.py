"""benchmarks/experiment_diff.py: one model compared across two experiments' metrics directories."""

from __future__ import annotations

import polars as pl

from benchmarks.experiment_diff import compare, seed_tables


def _write(d, name: str, correct: list[int], loops: list[float]) -> None:
    d.mkdir(exist_ok=True)
    ids = [f"p{i}" for i in range(len(correct))]
    pl.DataFrame({"id": ids, "correct": correct, "loop_rate": loops}).write_parquet(
        d / f"problems_{name}.parquet"
    )


def test_b_minus_a_per_model_with_per_seed_values(tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for seed in (0, 1):
        _write(a, f"grpo-s{seed}", [1, 0, 0, 0], [0.5, 0.5, 0.0, 0.0])
        _write(b, f"grpo-s{seed}", [1, 1, 1, 0], [0.0, 0.0, 0.0, 0.0])
    _write(a, "grpo_wide-s0", [0, 0, 0, 0], [0.0] * 4)  # another algorithm whose name starts alike
    assert sorted(seed_tables(a, "grpo")) == ["grpo-s0", "grpo-s1"]
    lines = compare(a, b, "grpo", {"greedy success": "correct", "greedy loop rate": "loop_rate"})
    assert lines[0] == "grpo: A ['grpo-s0', 'grpo-s1'], B ['grpo-s0', 'grpo-s1'], 4 problems"
    assert (
        "A 0.250  B 0.750  B-A +0.500 [" in lines[1] and "per seed A 0.250/0.250  B 0.750/0.750" in lines[1]
    )
    assert "A 0.250  B 0.000  B-A -0.250 [" in lines[2]
    assert compare(a, tmp_path / "none", "grpo", {"greedy success": "correct"})[0].startswith(
        "grpo: no per-problem"
    )
