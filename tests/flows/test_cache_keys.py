"""The content-addressed Prefect cache keys of flows/_cache.py."""

from __future__ import annotations

from types import SimpleNamespace

from flows._cache import content_key, source_digest


def _task(x, data, run, params):  # the "task" whose source enters the key
    return x


def _key(key_fn, **parameters) -> str:
    return key_fn(SimpleNamespace(task=SimpleNamespace(fn=_task, name="t")), parameters)


def test_content_key_follows_file_bytes_and_parameters_but_not_ignored_ones(tmp_path):
    data = tmp_path / "d.parquet"
    data.write_bytes(b"one")
    key_fn = content_key("data", ignore=("run", "params"))
    base = _key(key_fn, x=1, data=str(data), run="grpo-s0", params={"seed": 0})
    assert _key(key_fn, x=1, data=str(data), run="ppo-s1", params={"seed": 1}) == base
    assert _key(key_fn, x=2, data=str(data), run="grpo-s0", params={"seed": 0}) != base
    data.write_bytes(b"two")
    assert _key(key_fn, x=1, data=str(data), run="grpo-s0", params={"seed": 0}) != base
    assert _key(content_key("data"), x=1, data=str(data), run="grpo-s0", params={"seed": 0}) != _key(
        content_key("data"), x=1, data=str(data), run="ppo-s1", params={"seed": 0}
    )


def test_a_file_parameter_may_be_none(tmp_path):
    """versioned_rollout's ``carried`` table is None without partial rollouts: its rollout must still
    get a key (a key that raises leaves the result unpersisted, so a resumed run generates it again)."""
    data = tmp_path / "d.parquet"
    data.write_bytes(b"")
    key_fn = content_key("data", ignore=("run", "params"))
    none = _key(key_fn, x=1, data=None, run="grpo-s0", params={})
    assert none == _key(key_fn, x=1, data=None, run="ppo-s1", params={})
    assert none != _key(key_fn, x=1, data=str(data), run="grpo-s0", params={})  # not an empty file's


def test_source_digest_follows_python_files_only(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "sub" / "m.py").write_text("x = 1\n")
    before = source_digest(pkg)
    (pkg / "notes.txt").write_text("not code")
    assert source_digest(pkg) == before
    (pkg / "sub" / "m.py").write_text("x = 2\n")
    assert source_digest(pkg) != before
