"""A train run resumes only iterations made from the same SFT checkpoint and data: the fingerprint
hashes their bytes (a new SFT model of the same architecture has the same file sizes)."""

from __future__ import annotations

import json

from components.config import parse_params
from flows.train import MARKER, fingerprint
from tests.test_config import RAW


def _sft(d, weights: bytes):
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.safetensors").write_bytes(weights)
    (d / MARKER).write_text(json.dumps({"files": {"model.safetensors": len(weights)}}))
    return d


def test_fingerprint_changes_with_the_sft_weights_and_the_train_split(tmp_path):
    params = parse_params(RAW)
    split = tmp_path / "train.parquet"
    split.write_bytes(b"rows of seed 0")
    a = fingerprint(params, "grpo", _sft(tmp_path / "a", b"\x00" * 64), split)
    same = fingerprint(params, "grpo", _sft(tmp_path / "a2", b"\x00" * 64), split)
    other = fingerprint(params, "grpo", _sft(tmp_path / "b", b"\x01" * 64), split)  # same size, new bytes
    assert a == same
    assert other != a and other["sft"] == a["sft"]  # the marker alone (sizes) cannot tell them apart
    split.write_bytes(b"rows of seed 1")
    assert fingerprint(params, "grpo", tmp_path / "a", split) != a


def test_fingerprint_changes_with_the_tasks_own_settings(tmp_path):
    """A setting of tasks.<task> (the environment's rewards and prompt, e.g. sokoban's noop_penalty or
    repeat_hint) changes what the iterations play: a run in the same workspace starts afresh."""
    split = tmp_path / "train.parquet"
    split.write_bytes(b"rows")
    sft = _sft(tmp_path / "a", b"\x00" * 64)
    base = parse_params(RAW)
    calc = {**RAW["tasks"]["calc"], "max_operand": 50}
    switched = parse_params({**RAW, "tasks": {**RAW["tasks"], "calc": calc}})
    assert fingerprint(base, "grpo", sft, split) != fingerprint(switched, "grpo", sft, split)


def test_a_run_without_an_off_policy_correction_keeps_its_fingerprint(tmp_path):
    """algorithms.<name>.correction none (the default): the algorithm's block is what it was before the
    correction keys existed, so a run in progress resumes; a correction starts the run afresh."""
    split = tmp_path / "train.parquet"
    split.write_bytes(b"rows")
    sft = _sft(tmp_path / "a", b"\x00" * 64)
    base = fingerprint(parse_params(RAW), "grpo", sft, split)
    assert not {"correction", "correction_cap"} & set(base["algo"])
    grpo = {**RAW["algorithms"]["grpo"], "correction": "tis"}
    raw = {
        **RAW,
        "algorithms": {**RAW["algorithms"], "grpo": grpo},
        "train": {**RAW["train"], "old_logprobs": "recompute"},
    }
    tis = fingerprint(parse_params(raw), "grpo", sft, split)
    assert tis["algo"]["correction"] == "tis" and tis["algo"]["correction_cap"] == 2.0


def test_a_synchronous_run_keeps_its_fingerprint_and_a_staleness_starts_afresh(tmp_path):
    """rollout.staleness 0 (the default): the rollout block is what it was before the key existed;
    another staleness plays other rollouts, so the run starts afresh."""
    split = tmp_path / "train.parquet"
    split.write_bytes(b"rows")
    sft = _sft(tmp_path / "a", b"\x00" * 64)
    base = fingerprint(parse_params(RAW), "grpo", sft, split)
    assert "staleness" not in base["rollout"]
    tis = {a: {**RAW["algorithms"][a], "correction": "tis"} for a in RAW["compare"]["algorithms"]}
    raw = {**RAW, "rollout": {**RAW["rollout"], "staleness": 1}, "algorithms": {**RAW["algorithms"], **tis}}
    stale = fingerprint(parse_params(raw), "grpo", sft, split)
    assert stale["rollout"] == {**base["rollout"], "staleness": 1}
