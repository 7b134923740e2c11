"""The GSM8K loader on the shipped jsonl/parquet fixtures and on broken files (file, row and column named)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from components.envs.parsing import format_tool_call
from components.schemas import TaskSchema, validate_table
from components.tasks.calc import make_env
from components.tasks.calc.gsm8k import load_gsm8k, load_splits, parse_gsm8k_answer

DATA = Path(__file__).resolve().parents[1] / "data"
JSONL = DATA / "gsm8k_sample.jsonl"
PARQUET = DATA / "gsm8k_sample.parquet"


def test_jsonl_fixture():
    df = load_gsm8k(JSONL)
    validate_table(df, TaskSchema, str(JSONL))
    assert df.height == 8
    assert df["answer"].to_list() == ["72", "10", "210", "2000", "14", "20", "10", "-7"]
    assert df["n_calls"].to_list() == [2, 2, 2, 2, 0, 2, 2, 1]
    assert set(df["split"]) == {"train"}
    first = json.loads(df["expert"][0])
    assert first == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "48/2"}}}
            ],
        },
        {"role": "tool", "name": "calculator", "content": "24"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "48+24"}}}
            ],
        },
        {"role": "tool", "name": "calculator", "content": "72"},
        {"role": "assistant", "content": "<answer>72</answer>"},
    ]
    # no annotation: a direct-answer expert
    assert json.loads(df["expert"][4]) == [{"role": "assistant", "content": "<answer>14</answer>"}]


def test_parquet_fixture_equals_jsonl():
    assert load_gsm8k(PARQUET).equals(load_gsm8k(JSONL))


def test_every_fixture_expert_earns_full_reward_in_the_env():
    for row in load_gsm8k(JSONL).iter_rows(named=True):
        env = make_env(row)
        env.reset(row)
        expert = json.loads(row["expert"])
        for call, result in zip(expert[:-1:2], expert[1:-1:2]):
            fn = call["tool_calls"][0]["function"]
            assert env.step(format_tool_call(fn["name"], fn["arguments"])).messages == [result]
        out = env.step(expert[-1]["content"])
        assert out.done and out.reward == 1.0, row


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


GOOD = {"question": "What is 2 + 3?", "answer": "2+3 = <<2+3=5>>5\n#### 5"}


@pytest.mark.parametrize(
    "bad_row, message",
    [
        (
            {"question": "Q?", "answer": "It is 5."},
            "row 3: column 'answer' has no '#### <number>' final answer",
        ),
        (
            {"question": "Q?", "answer": "#### five"},
            "row 3: column 'answer' has no '#### <number>' final answer",
        ),
        ({"question": "", "answer": "#### 5"}, "row 3: column 'question' is not a non-empty string"),
        ({"answer": "#### 5"}, "row 3: column 'question' is missing"),
        ({"question": "Q?"}, "row 3: column 'answer' is missing"),
        ({"question": "Q?", "answer": 5}, "row 3: column 'answer' is not a non-empty string (got '5')"),
        ('{"question": "Q?", "answer": ', "row 3: not valid JSON"),
        ("[1, 2]", "row 3: expected a JSON object, got list"),
    ],
)
def test_broken_jsonl_names_file_row_and_column(tmp_path, bad_row, message):
    path = write_jsonl(tmp_path / "broken.jsonl", [GOOD, GOOD, bad_row, GOOD])
    with pytest.raises(ValueError) as err:
        load_gsm8k(path)
    assert f"broken.jsonl {message}" in str(err.value)


def test_blank_lines_keep_line_numbers(tmp_path):
    path = tmp_path / "gaps.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps({"question": "Q?", "answer": "none"}) + "\n")
    with pytest.raises(ValueError, match=r"gaps.jsonl row 3: column 'answer'"):
        load_gsm8k(path)


def test_broken_parquet(tmp_path):
    path = tmp_path / "broken.parquet"
    pl.DataFrame({"question": ["a", "b"], "answer": ["#### 1", "no final"]}).write_parquet(path)
    with pytest.raises(ValueError, match=r"broken.parquet row 2: column 'answer' has no '#### <number>'"):
        load_gsm8k(path)
    pl.DataFrame({"question": ["a"], "solution": ["#### 1"]}).write_parquet(path)
    with pytest.raises(ValueError, match=r"broken.parquet: missing column\(s\) \['answer'\]"):
        load_gsm8k(path)


def test_unsupported_and_missing_files(tmp_path):
    with pytest.raises(
        ValueError, match=r"unsupported file type '.csv'; supported: \['.jsonl', '.ndjson', '.parquet'\]"
    ):
        load_gsm8k(tmp_path / "x.csv")
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_gsm8k(tmp_path / "x.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="empty.jsonl: no rows"):
        load_gsm8k(tmp_path / "empty.jsonl")


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("a <<2*3=6>> b <<6+1=7>>\n#### 7", ("7", ["2*3", "6+1"])),
        ("#### 1,234", ("1234", [])),
        ("####-3", ("-3", [])),
        ("#### 2.50\n", ("2.5", [])),
        ("#### ", None),
        ("the answer is 5", None),
    ],
)
def test_parse_gsm8k_answer(answer, expected):
    assert parse_gsm8k_answer(answer) == expected


def test_refused_annotation_is_left_out(tmp_path):
    path = write_jsonl(
        tmp_path / "odd.jsonl", [{"question": "Q?", "answer": "<<x*2=4>> <<1/0=0>> <<2*2=4>>\n#### 4"}]
    )
    (row,) = load_gsm8k(path).iter_rows(named=True)
    expert = json.loads(row["expert"])
    assert row["n_calls"] == 1 and expert[0]["tool_calls"][0]["function"]["arguments"] == {
        "expression": "2*2"
    }


def test_load_splits_is_deterministic_and_disjoint():
    a = load_splits(JSONL, seed=0, n_train=100, n_val=2, n_test=3)
    b = load_splits(JSONL, seed=0, n_train=100, n_val=2, n_test=3)
    c = load_splits(JSONL, seed=1, n_train=100, n_val=2, n_test=3)
    assert all(a[k].equals(b[k]) for k in a)
    assert [a[k].height for k in ("train", "val", "test")] == [3, 2, 3]
    ids = [set(a[k]["id"]) for k in a]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    assert set().union(*ids) == set(load_gsm8k(JSONL)["id"])
    assert any(not a[k].equals(c[k]) for k in a)
    for k, df in a.items():
        assert set(df["split"]) == {k}
    assert load_splits(JSONL, seed=0, n_train=1, n_val=2, n_test=3)["train"].height == 1
    with pytest.raises(ValueError, match="8 unique questions, need n_val \\+ n_test \\+ 1 = 9"):
        load_splits(JSONL, seed=0, n_train=10, n_val=4, n_test=4)
