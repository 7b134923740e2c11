"""search_calc data: the knowledge base's numbers agree with every generated answer, the expert's
tool messages hold those numbers, the weaker demonstrator skips the calculator, splits are disjoint."""

from __future__ import annotations

import json

from components.envs import get_task
from components.tasks.calc.calculator import calculate
from components.tasks.search_calc.facts import generate_numeric_kb, read_fact
from components.tasks.search_calc.questions import KINDS, recompute
from tests.tasks.search_calc.conftest import SMALL


def _rows(data):
    return [r for df in data.splits.values() for r in df.iter_rows(named=True)]


def test_every_answer_recomputed_from_the_passages(sc_data):
    """The answer of every row of every split, computed again from the passage texts of its gold
    names (the numbers read back with the passage patterns), and from the expert's calculator call."""
    text = {r["title"]: r["text"] for r in sc_data.nkb.passages().iter_rows(named=True)}
    rows = _rows(sc_data)
    assert len(rows) == SMALL["n_train"] + SMALL["n_val"] + SMALL["n_test"]
    for r in rows:
        gold = json.loads(r["gold_titles"])
        assert recompute(r["kind"], r["question"], gold, text.__getitem__) == int(r["answer"]), r["question"]
        calc = [
            m
            for m in json.loads(r["expert"])
            if m.get("tool_calls") and m["tool_calls"][0]["function"]["name"] == "calculator"
        ]
        assert len(calc) == 1
        expression = calc[0]["tool_calls"][0]["function"]["arguments"]["expression"]
        assert calculate(expression).text == r["answer"]


def test_two_search_questions_follow_the_links(sc_data):
    """The second name of founder_age / mayor_age_in questions is the one the first passage names."""
    kb = sc_data.nkb.kb
    for r in _rows(sc_data):
        gold = json.loads(r["gold_titles"])
        if r["kind"] == "founder_age":
            assert kb.entities[gold[0]].relations["founded_by"] == gold[1]
            assert f"founded by {gold[1]}" in sc_data.nkb.passage(gold[0])
        if r["kind"] == "mayor_age_in":
            assert kb.entities[gold[0]].relations["mayor"] == gold[1]


def test_facts_are_plausible_and_stated_once():
    nkb = generate_numeric_kb(3, 120)
    for e in nkb.kb.entities.values():
        if e.kind == "company":
            born = nkb.number[e.relations["founded_by"]]
            assert born + 20 <= nkb.number[e.name] <= min(born + 60, 2024)
        if e.kind in ("person", "company", "city"):
            assert read_fact(nkb.passage(e.name), e.name, e.kind) == nkb.number[e.name]
        else:
            assert e.name not in nkb.number


def test_expert_tool_messages_contain_the_facts(sc_data):
    for r in _rows(sc_data):
        messages = json.loads(r["expert"])
        results = [m["content"] for m in messages if m["role"] == "tool" and m["name"] == "search"]
        gold = json.loads(r["gold_titles"])
        assert len(results) == len(gold) == r["n_searches"]
        for name, result in zip(gold, results):
            assert sc_data.nkb.passage(name) in result.splitlines()
        assert messages[-1]["content"] == f"<answer>{r['answer']}</answer>"


def test_weak_demonstrations_search_but_skip_the_calculator(sc_data):
    train = sc_data.splits["train"].to_dicts()
    assert all(r["weak"] for r in train)  # weak_per_question = 1.0
    assert sc_data.splits["test"]["weak"].null_count() == SMALL["n_test"]
    for r in train[:50]:
        demos = get_task("search_calc").demonstrations(r)
        assert len(demos) == 2
        weak = demos[1]
        tools = [m["tool_calls"][0]["function"]["name"] for m in weak if m.get("tool_calls")]
        assert tools == ["search"] * r["n_searches"]
        assert weak[-1]["content"].endswith(f"= {r['answer']}\n<answer>{r['answer']}</answer>")


def test_splits_disjoint_every_kind_everywhere(sc_data):
    questions = [set(df["question"]) for df in sc_data.splits.values()]
    assert sum(len(q) for q in questions) == len(set.union(*questions))
    for df in sc_data.splits.values():
        assert set(df["kind"]) == set(KINDS)


def test_turns_needed_and_one_search_setting():
    recipe = get_task("search_calc")
    assert recipe.params({}).turns_needed() == 4
    p = recipe.params({"max_searches": 1, "n_entities": 60})
    assert p.turns_needed() == 3
    splits = recipe.prepare(p, seed=1, n_train=30, n_val=5, n_test=5)
    assert {n for df in splits.values() for n in df["n_searches"]} == {1}
