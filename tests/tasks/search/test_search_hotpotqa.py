"""Local HotpotQA-format questions and passage corpora, on fixtures written here (no download)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.tasks.search import demonstrations, make_env
from components.tasks.search.hotpotqa import load_corpus, load_hotpotqa, load_splits

CONTEXT = {
    "Ava Lin": ["Ava Lin is a Veldian painter.", "She was born in Tamo."],
    "Tamo": ["Tamo is a port city.", "It lies in Veldia."],
    "Bolt Co": ["Bolt Co makes toys.", "It was founded by Ava Lin in 1990."],
    "Rivo": ["Rivo is a mountain town in Kesia."],
}


def record(i: int, question: str, answer: str, facts: list[list], context_titles: list[str]) -> dict:
    return {
        "_id": f"hp{i}",
        "question": question,
        "answer": answer,
        "supporting_facts": facts,
        "context": [[t, CONTEXT[t]] for t in context_titles],
        "type": "bridge",
        "level": "easy",
    }


RECORDS = [
    record(0, "Who founded Bolt Co?", "Ava Lin", [["Bolt Co", 1]], ["Bolt Co", "Rivo"]),
    record(
        1,
        "In which city was the founder of Bolt Co born?",
        "Tamo",
        [["Bolt Co", 1], ["Ava Lin", 1]],
        ["Bolt Co", "Ava Lin", "Rivo"],
    ),
    record(2, "In which country is Tamo?", "Veldia", [["Tamo", 1]], ["Tamo", "Rivo"]),
    record(3, "Where is Rivo?", "Kesia", [["Rivo", 0]], ["Rivo", "Tamo"]),
    record(4, "What does Bolt Co make?", "toys", [["Bolt Co", 0]], ["Bolt Co"]),
    record(5, "Who founded Bolt Co?", "Ava Lin", [["Bolt Co", 1]], ["Bolt Co"]),  # a duplicate question
]


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_json_and_jsonl_load_the_same(tmp_path):
    a = load_hotpotqa(write_json(tmp_path / "dev.json", RECORDS))
    b = load_hotpotqa(write_jsonl(tmp_path / "dev.jsonl", RECORDS))
    assert a[0] == b[0] and a[1].equals(b[1])
    questions, passages = a
    assert questions[1]["gold_titles"] == ["Bolt Co", "Ava Lin"] and questions[1]["id"] == "hp1"
    assert sorted(passages["title"]) == sorted(CONTEXT)  # one passage per distinct title
    assert (
        passages.filter(passages["title"] == "Tamo")["text"][0] == "Tamo is a port city. It lies in Veldia."
    )


def test_corpus_in_both_forms(tmp_path):
    plain = write_jsonl(
        tmp_path / "c.jsonl",
        [{"id": str(i), "title": t, "text": " ".join(s)} for i, (t, s) in enumerate(CONTEXT.items())],
    )
    wiki = write_jsonl(
        tmp_path / "w.jsonl",
        [{"id": str(i), "contents": f'"{t}"\n' + " ".join(s)} for i, (t, s) in enumerate(CONTEXT.items())],
    )
    assert load_corpus(plain).equals(load_corpus(wiki))


def test_splits_with_corpus_and_expert_replay(tmp_path):
    questions = write_jsonl(tmp_path / "dev.jsonl", RECORDS)
    corpus = write_jsonl(
        tmp_path / "c.jsonl",
        [{"id": str(i), "title": t, "text": " ".join(s)} for i, (t, s) in enumerate(CONTEXT.items())],
    )
    splits, index = load_splits(
        questions, corpus, seed=0, n_train=10, n_val=1, n_test=2, top_k=2, max_result_chars=400
    )
    assert {k: v.height for k, v in splits.items()} == {"train": 2, "val": 1, "test": 2}  # 5 unique questions
    all_q = [q for df in splits.values() for q in df["question"]]
    assert len(all_q) == len(set(all_q)) == 5
    again, _ = load_splits(
        questions, corpus, seed=0, n_train=10, n_val=1, n_test=2, top_k=2, max_result_chars=400
    )
    assert all(splits[s].equals(again[s]) for s in splits)
    env = make_env(index=index)
    for df in splits.values():
        for row in df.iter_rows(named=True):
            env.reset(row)
            expert = demonstrations(row)[0]
            for call, result in zip(expert[:-1:2], expert[1:-1:2]):
                out = env.step(f"<tool_call>\n{json.dumps(call['tool_calls'][0]['function'])}\n</tool_call>")
                assert out.messages == [result]
            out = env.step(expert[-1]["content"])
            assert out.reward == 1.0 and json.loads(out.info["task_metrics"])["gold_hit"] == 1.0


def test_without_corpus_the_context_is_indexed(tmp_path):
    splits, index = load_splits(
        write_json(tmp_path / "dev.json", RECORDS),
        None,
        seed=1,
        n_train=10,
        n_val=1,
        n_test=1,
        top_k=2,
        max_result_chars=400,
    )
    assert len(index) == len(CONTEXT) and splits["train"].height == 3


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"answer": "x", "supporting_facts": [["A", 0]]}, "row 2: column 'question' is missing"),
        (
            {"question": "q?", "answer": 3, "supporting_facts": [["A", 0]]},
            "row 2: column 'answer' is not a non-empty string",
        ),
        ({"question": "q?", "answer": "x"}, "row 2: column 'supporting_facts'"),
        (
            {"question": "q?", "answer": "x", "supporting_facts": [[1, 0]]},
            "row 2: column 'supporting_facts' has an entry",
        ),
        (
            {"question": "q?", "answer": "x", "supporting_facts": [["A", 0]], "context": [["A", "text"]]},
            "row 2: column 'context'",
        ),
        ("[1, 2]", "row 2: expected a JSON object"),
        ("{broken", "row 2: not valid JSON"),
    ],
)
def test_bad_question_rows_name_file_row_column(tmp_path, bad, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [RECORDS[0], bad])
    with pytest.raises(ValueError, match=message.replace("[", r"\[")) as err:
        load_hotpotqa(path)
    assert "bad.jsonl" in str(err.value)


def test_bad_files(tmp_path):
    with pytest.raises(ValueError, match="expected a JSON list"):
        load_hotpotqa(write_json(tmp_path / "d.json", {"question": "q"}))
    with pytest.raises(ValueError, match="unsupported file type"):
        load_hotpotqa(write_json(tmp_path / "d.csv", []))
    with pytest.raises(FileNotFoundError):
        load_hotpotqa(tmp_path / "none.json")
    with pytest.raises(ValueError, match="row 2: column 'text'"):
        load_corpus(
            write_jsonl(
                tmp_path / "c.jsonl", [{"id": "1", "title": "A", "text": "a"}, {"id": "2", "title": "B"}]
            )
        )
    with pytest.raises(ValueError, match="duplicate passage id '1'"):
        load_corpus(
            write_jsonl(
                tmp_path / "c.jsonl",
                [{"id": "1", "title": "A", "text": "a"}, {"id": "1", "title": "B", "text": "b"}],
            )
        )
    with pytest.raises(ValueError, match="need n_val \\+ n_test \\+ 1"):
        load_splits(
            write_json(tmp_path / "d.json", RECORDS),
            None,
            seed=0,
            n_train=1,
            n_val=3,
            n_test=3,
            top_k=2,
            max_result_chars=400,
        )


def test_recipe_prepare_from_local_files(tmp_path):
    from components.envs import get_task
    from components.schemas import TaskSchema, validate_table

    write_jsonl(tmp_path / "dev.jsonl", RECORDS)
    write_jsonl(
        tmp_path / "corpus.jsonl",
        [{"id": str(i), "title": t, "text": " ".join(s)} for i, (t, s) in enumerate(CONTEXT.items())],
    )
    recipe = get_task("search")
    section = {"questions_path": "dev.jsonl", "corpus_path": "corpus.jsonl"}  # relative to root
    assert not recipe.params(section).generates_train_rows()
    out = tmp_path / "data"
    splits = recipe.prepare(section, seed=0, n_train=10, n_val=1, n_test=1, root=tmp_path, data_dir=out)
    for name, df in splits.items():
        validate_table(df, TaskSchema, name)
    assert splits["train"].height == 3 and (out / "index" / "passages.parquet").is_file()
    row = splits["test"].row(0, named=True)
    env = recipe.make_env(row, data_dir=out)
    env.reset(row)
    for m in recipe.expert_messages(row):
        if m.get("tool_calls"):
            env.step(f"<tool_call>\n{json.dumps(m['tool_calls'][0]['function'])}\n</tool_call>")
    assert env.step(recipe.expert_messages(row)[-1]["content"]).reward == 1.0
