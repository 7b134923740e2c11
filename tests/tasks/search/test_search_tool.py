"""The BM25 index and the search tool: top-k, caps, save/load, and hostile inputs (never an exception)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from components.envs.parsing import format_tool_call
from components.tasks.search import make_env
from components.tasks.search.index import SearchIndex, load_index
from components.tasks.search.tool import SearchTool, format_hits

PASSAGES = pl.DataFrame(
    {
        "id": ["p0", "p1", "p2", "p3"],
        "title": ["Ava Lin", "Tamo", "Bolt Co", "Ben Kim"],
        "text": [
            "Ava Lin is a baker born in Tamo who works for Bolt Co.",
            "Tamo is a city in Veldia whose mayor is Ben Kim.",
            "Bolt Co is a toy company in Tamo founded by Ava Lin.",
            "Ben Kim is a pilot born in Rivo who works for Nova Labs.",
        ],
    }
)


@pytest.fixture(scope="module")
def index():
    return SearchIndex.build(PASSAGES)


def test_top_k_best_first(index):
    hits = index.search("Ben Kim", 2)
    assert [h.title for h in hits] == ["Ben Kim", "Tamo"]
    assert hits[0].score >= hits[1].score > 0
    assert [h.title for h in index.search("Ben Kim", 1)] == ["Ben Kim"]
    # k larger than the corpus: only passages with a positive score
    assert {h.title for h in index.search("Rivo", 10)} == {"Ben Kim"}
    assert index.search("the of and", 3) == [] and index.search("zzzz", 3) == []


def test_save_and_load_round_trip(index, tmp_path):
    index.save(tmp_path / "ix")
    loaded = load_index(tmp_path / "ix")
    assert loaded is load_index(tmp_path / "ix")  # one shared copy
    assert [(h.id, h.score) for h in loaded.search("Bolt Co Tamo", 3)] == [
        (h.id, h.score) for h in index.search("Bolt Co Tamo", 3)
    ]
    with pytest.raises(FileNotFoundError, match="no search index"):
        load_index(tmp_path / "missing")


def test_bad_passage_table_names_the_column():
    bad = PASSAGES.with_columns(pl.Series("id", ["p0", "p0", "p2", "p3"]))
    with pytest.raises(ValueError, match="column 'id'"):
        SearchIndex.build(bad, "corpus.jsonl")
    with pytest.raises(ValueError, match="no passages"):
        SearchIndex.build(PASSAGES.head(0))


def test_result_text_and_cap(index):
    tool = SearchTool(index, top_k=2, max_result_chars=400)
    out = tool.execute({"query": "Ava Lin"})
    assert not out.is_error
    assert out.text.split("\n")[0] == PASSAGES["text"][0]  # text starting with its title: no prefix
    assert tool.retrieved[0] == "Ava Lin" and tool.n_queries == 1
    small = SearchTool(index, top_k=3, max_result_chars=60)
    assert len(small.execute({"query": "Tamo"}).text) <= 60
    assert format_hits(index.search("Ava Lin", 2), 20).endswith("...")  # one passage longer than the cap


@pytest.mark.parametrize(
    "args, message",
    [
        ({"query": ""}, "empty query"),
        ({"query": "   \n\t "}, "empty query"),
        ({"query": "x" * 5000}, "query too long"),
        ({"query": 42}, "must be a string, got int"),
        ({"query": None}, "must be a string, got NoneType"),
        ({"query": ["Ava"]}, "must be a string, got list"),
        ({"query": {"a": 1}}, "must be a string, got dict"),
        ({}, "missing argument 'query'"),
        ({"query": "Ava", "k": 3}, "unknown argument"),
        ("Ava Lin", "arguments must be an object"),
    ],
)
def test_hostile_arguments_are_errors(index, args, message):
    out = SearchTool(index).execute(args)
    assert out.is_error and out.text.startswith("error:") and message in out.text
    assert len(out.text) < 300


def test_query_matching_nothing_is_not_an_error(index):
    out = SearchTool(index).execute({"query": "the and of"})
    assert not out.is_error and out.text.startswith("no results for")


def test_hostile_tool_calls_through_the_env_are_feedback(index):
    env = make_env(index=index)
    row = {"id": "q", "question": "Where was Ava Lin born?", "answer": "Tamo", "gold_titles": '["Ava Lin"]'}
    bodies = [
        "",
        "{not json",
        "[1, 2]",
        '{"name": "search"}',
        '{"name": "search", "arguments": {}}',
        '{"name": "search", "arguments": {"query": 7}}',
        '{"name": "search", "arguments": {"query": "Ava", "extra": 1}}',
        '{"name": "search", "arguments": "not an object"}',
        '{"name": "google", "arguments": {"query": "Ava"}}',
        '{"name": "search", "arguments": {"query": "' + "y" * 100_000 + '"}}',
        '{"name": "search", "arguments": {"query": "\\ud800 Ava"}}',
        '{"name": "search", "arguments": {"query": "' + "[" * 5000 + '"}}',
    ]
    env.reset(row)
    for body in bodies:
        out = env.step(f"<tool_call>\n{body}\n</tool_call>")
        assert not out.done and len(out.messages) == 1
        (message,) = out.messages
        assert message["role"] == "tool" and len(message["content"]) <= 600, body[:40]
    out = env.step("<tool_call>" * 50_000)  # huge, unclosed
    assert not out.done and out.messages[0]["content"].startswith("error:")
    # after all of that the episode still works
    out = env.step(format_tool_call("search", {"query": "Ava Lin"}))
    assert "born in Tamo" in out.messages[0]["content"]
    out = env.step("<answer>tamo.</answer>")
    assert out.done and out.reward == 1.0
    metrics = json.loads(out.info["task_metrics"])
    assert metrics == {"em": 1.0, "f1": 1.0, "n_queries": 2.0, "gold_hit": 1.0}  # "\ud800 Ava", "Ava Lin"


def test_the_index_never_loads_numba():
    """numba's llvmlite objects in sys.modules break vLLM's engine start-up (its triton kernel scan);
    bm25s would import numba when installed. Checked in a fresh interpreter."""
    import subprocess
    import sys

    code = (
        "import sys, polars as pl\n"
        "from components.tasks.search.index import SearchIndex\n"
        "ix = SearchIndex.build(pl.DataFrame({'id': ['a'], 'title': ['Ava'], 'text': ['Ava is a baker.']}))\n"
        "assert ix.search('Ava', 1)[0].id == 'a'\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('numba', 'llvmlite')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
