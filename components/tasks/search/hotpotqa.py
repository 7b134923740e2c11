"""Local real data for the search task: HotpotQA-format questions and a passage corpus (no download).

Questions: a ``.json`` file holding a list of records, or a ``.jsonl`` file of one record a line, in
HotpotQA's format: ``question``, ``answer``, ``supporting_facts`` (``[[title, sentence_index], ...]``),
optionally ``_id``/``id`` and ``context`` (``[[title, [sentence, ...]], ...]``). The gold passages of a
question are the distinct titles of its supporting facts, in order.

Corpus: a ``.jsonl`` file of passages ``{"id", "title", "text"}``, or Search-R1's wiki-dump form
``{"id", "contents"}`` whose first line is the (quoted) title and the rest the text. Without a corpus
file the passages are the questions' own ``context`` paragraphs (one per distinct title, sentences
joined), which is HotpotQA's distractor setting.

The expert searches each gold title in turn with the real tool (its tool messages are what the
environment will return) and answers. Bad input raises ``ValueError`` naming the file, the 1-based row
(a jsonl line, or a json list index + 1) and the column.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import polars as pl

from components.schemas import validate_table
from components.tasks.search.expert import answer_message, call_message, encode, tool_message
from components.tasks.search.generator import TASK_DTYPES
from components.tasks.search.index import SearchIndex
from components.tasks.search.schemas import SearchTaskSchema
from components.tasks.search.tool import SearchTool

__all__ = ["load_corpus", "load_hotpotqa", "load_splits", "read_records"]

_MAX_QUESTIONS = 1_000_000


def read_records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(1-based row number, record) pairs of a .json list or a .jsonl file."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from None
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
        rows = list(enumerate(data, start=1))
    elif suffix in (".jsonl", ".ndjson"):
        rows = []
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    rows.append((number, json.loads(line)))
                except ValueError as err:
                    raise ValueError(f"{path} row {number}: not valid JSON ({err})") from None
    else:
        raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use .json or .jsonl")
    for number, obj in rows:
        if not isinstance(obj, dict):
            raise ValueError(f"{path} row {number}: expected a JSON object, got {type(obj).__name__}")
    return rows


def _text(path: Path, number: int, obj: dict, column: str) -> str:
    value = obj.get(column)
    if not isinstance(value, str) or not value.strip():
        what = "is missing" if value is None else f"is not a non-empty string (got {str(value)[:40]!r})"
        raise ValueError(f"{path} row {number}: column {column!r} {what}")
    return value.strip()


def load_corpus(path: str | Path) -> pl.DataFrame:
    """The passages of a corpus jsonl (``id``, ``title``, ``text``)."""
    path = Path(path)
    rows = []
    for number, obj in read_records(path):
        pid = obj.get("id", number)
        if "contents" in obj and "text" not in obj:
            title, _, text = _text(path, number, obj, "contents").partition("\n")
            title = title.strip().strip('"')
        else:
            title = str(obj.get("title") or "").strip()
            text = _text(path, number, obj, "text")
        if not text.strip():
            raise ValueError(f"{path} row {number}: passage has no text")
        rows.append({"id": str(pid), "title": title, "text": " ".join(text.split())})
    if not rows:
        raise ValueError(f"{path}: no passages")
    df = pl.DataFrame(rows, schema={"id": pl.String, "title": pl.String, "text": pl.String})
    dup = df.filter(df["id"].is_duplicated())
    if dup.height:
        raise ValueError(f"{path}: column 'id' has duplicate passage id {dup['id'][0]!r}")
    return df


def _gold(path: Path, number: int, obj: dict) -> list[str]:
    facts = obj.get("supporting_facts")
    if not isinstance(facts, list) or not facts:
        raise ValueError(
            f"{path} row {number}: column 'supporting_facts' must be a non-empty list of [title, index]"
        )
    titles: list[str] = []
    for fact in facts:
        if not isinstance(fact, (list, tuple)) or not fact or not isinstance(fact[0], str):
            raise ValueError(
                f"{path} row {number}: column 'supporting_facts' has an entry {str(fact)[:60]!r}, not [title, index]"
            )
        if fact[0] not in titles:
            titles.append(fact[0])
    return titles


def _context(path: Path, number: int, obj: dict) -> list[tuple[str, str]]:
    context = obj.get("context")
    if context is None:
        return []
    out = []
    if not isinstance(context, list):
        raise ValueError(f"{path} row {number}: column 'context' must be a list of [title, [sentences]]")
    for entry in context:
        ok = (
            isinstance(entry, (list, tuple))
            and len(entry) == 2
            and isinstance(entry[0], str)
            and isinstance(entry[1], list)
            and all(isinstance(s, str) for s in entry[1])
        )
        if not ok:
            raise ValueError(
                f"{path} row {number}: column 'context' has an entry {str(entry)[:60]!r}, not [title, [sentences]]"
            )
        text = " ".join(" ".join(entry[1]).split())
        if text:
            out.append((entry[0], text))
    return out


def load_hotpotqa(path: str | Path) -> tuple[list[dict[str, Any]], pl.DataFrame]:
    """(question records: id, question, answer, gold_titles; passages of their ``context``)."""
    path = Path(path)
    questions, passages, seen = [], [], set()
    for number, obj in read_records(path)[:_MAX_QUESTIONS]:
        question, answer = _text(path, number, obj, "question"), _text(path, number, obj, "answer")
        gold = _gold(path, number, obj)
        for title, text in _context(path, number, obj):
            if title not in seen:
                seen.add(title)
                passages.append({"id": f"ctx-{len(passages):06d}", "title": title, "text": text})
        qid = str(obj.get("_id", obj.get("id", f"{path.stem}-{number:06d}")))
        questions.append({"id": qid, "question": question, "answer": answer, "gold_titles": gold})
    if not questions:
        raise ValueError(f"{path}: no questions")
    return questions, pl.DataFrame(passages, schema={"id": pl.String, "title": pl.String, "text": pl.String})


def load_splits(
    questions_path: str | Path,
    corpus_path: str | Path | None,
    *,
    seed: int,
    n_train: int,
    n_val: int,
    n_test: int,
    top_k: int,
    max_result_chars: int,
) -> tuple[dict[str, pl.DataFrame], SearchIndex]:
    """Train/val/test tables and the index: unique questions shuffled by ``seed``, test then val then
    train (exactly ``n_test`` and ``n_val`` rows, train up to ``n_train`` of the rest)."""
    questions, context = load_hotpotqa(questions_path)
    if corpus_path is not None:
        passages, source = load_corpus(corpus_path), str(corpus_path)
    else:
        if context.height == 0:
            raise ValueError(
                f"{questions_path}: no 'context' passages and no corpus file (tasks.search.corpus_path)"
            )
        passages, source = context, f"{questions_path} context"
    index = SearchIndex.build(passages, source)
    tool = SearchTool(index, top_k=top_k, max_result_chars=max_result_chars)
    unique, seen = [], set()
    for q in questions:  # the first record of each question
        if q["question"] not in seen:
            seen.add(q["question"])
            unique.append(q)
    need = n_val + n_test + 1
    if len(unique) < need:
        raise ValueError(
            f"{questions_path}: {len(unique)} unique questions, need n_val + n_test + 1 = {need}"
        )
    random.Random(f"search-file/{seed}").shuffle(unique)
    bounds = {
        "test": (0, n_test),
        "val": (n_test, n_test + n_val),
        "train": (n_test + n_val, n_test + n_val + n_train),
    }
    out = {}
    for split in ("train", "val", "test"):
        lo, hi = bounds[split]
        rows = []
        for i, q in enumerate(unique[lo:hi]):
            messages: list[dict] = []
            for title in q["gold_titles"]:
                messages += [call_message(title), tool_message(tool.execute({"query": title}).text)]
            rows.append(
                {
                    "id": f"{q['id']}" if q["id"] else f"search-{split}-{i:06d}",
                    "question": q["question"],
                    "answer": q["answer"],
                    "expert": encode([*messages, answer_message(q["answer"])]),
                    "split": split,
                    "n_hops": len(q["gold_titles"]),
                    "gold_titles": encode(q["gold_titles"]),
                    "weak": None,
                }
            )
        df = pl.DataFrame(rows, schema=TASK_DTYPES)
        out[split] = validate_table(df, SearchTaskSchema, f"{questions_path} ({split} split)")
    return out, index
