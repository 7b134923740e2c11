"""The generated knowledge base and its multi-hop questions: determinism, disjoint splits, chains."""

from __future__ import annotations

import json

import pytest
from conftest import SMALL

from components.tasks.search.generator import enumerate_questions, generate, hop_counts
from components.tasks.search.kb import RELATIONS, generate_kb


def test_kb_is_deterministic_and_seed_dependent():
    a, b, c = generate_kb(0, 60), generate_kb(0, 60), generate_kb(1, 60)
    assert a.passages().equals(b.passages())
    assert not a.passages().equals(c.passages())
    assert a.passages()["title"].n_unique() == 60


def test_kb_relations_are_consistent():
    kb = generate_kb(3, 120)
    for e in kb.entities.values():
        for rel, target in e.relations.items():
            assert RELATIONS[rel].source == e.kind
            assert kb.entities[target].kind == RELATIONS[rel].target
            assert target in e.passage()
        if e.kind == "country":  # the capital is one of the country's own cities
            assert kb.entities[e.relations["capital"]].relations["country"] == e.name


def test_kb_too_many_entities_names_the_param():
    with pytest.raises(ValueError, match="n_entities=2000"):
        generate_kb(0, 2000)
    with pytest.raises(ValueError, match="n_entities must be >= 8"):
        generate_kb(0, 3)


def test_question_chain_by_hand():
    kb = generate_kb(0, 60)
    company = kb.of_kind("company")[0]
    founder = kb.entities[company.relations["founded_by"]]
    city = founder.relations["born_in"]
    qs = {q.question: q for q in enumerate_questions(kb, 2)}
    q = qs[f"Where was the founder of {company.name} born?"]
    assert q.answer == city and q.chain == (company.name, founder.name)
    # no question's answer is an entity already on its chain (e.g. the country of the capital of X)
    for h in (1, 2, 3):
        for q in enumerate_questions(kb, h):
            assert len(q.chain) == h and q.answer not in q.chain


def test_generate_is_deterministic_and_splits_are_disjoint(small_data):
    again = generate(**SMALL)
    for split in ("train", "val", "test"):
        assert small_data.splits[split].equals(again.splits[split])
    questions = [set(small_data.splits[s]["question"]) for s in ("train", "val", "test")]
    assert sum(len(q) for q in questions) == len(set().union(*questions)) == 260
    assert {s: small_data.splits[s].height for s in small_data.splits} == {
        "train": 200,
        "val": 20,
        "test": 40,
    }
    other = generate(**{**SMALL, "seed": 1})
    assert not other.splits["test"].equals(small_data.splits["test"])


def test_test_split_does_not_depend_on_n_train(small_data):
    bigger = generate(**{**SMALL, "n_train": 300})
    assert bigger.splits["test"].equals(small_data.splits["test"])


def test_hops_gold_titles_and_expert_queries(small_data):
    for df in small_data.splits.values():
        assert set(df["n_hops"]) <= {1, 2, 3}
        for row in df.iter_rows(named=True):
            gold = json.loads(row["gold_titles"])
            expert = json.loads(row["expert"])
            queries = [
                m["tool_calls"][0]["function"]["arguments"]["query"] for m in expert if m.get("tool_calls")
            ]
            assert queries == gold and len(gold) == row["n_hops"]
            assert expert[-1] == {"role": "assistant", "content": f"<answer>{row['answer']}</answer>"}
            # every search result holds its gold passage, and the next hop's name (or the answer)
            results = [m["content"] for m in expert if m["role"] == "tool"]
            for result, nxt in zip(results, [*gold[1:], row["answer"]]):
                assert nxt in result
    assert set(small_data.splits["test"]["n_hops"]) == {1, 2, 3}


def test_weak_demos_only_in_train_for_short_questions(small_data):
    for split in ("val", "test"):
        assert small_data.splits[split]["weak"].null_count() == small_data.splits[split].height
    train = small_data.splits["train"]
    assert train.filter(train["weak"].is_not_null())["n_hops"].max() == 1
    row = train.filter(train["weak"].is_not_null()).row(0, named=True)
    (demo,) = json.loads(row["weak"])
    (message,) = demo
    assert "tool_calls" not in message and message["content"].endswith(f"<answer>{row['answer']}</answer>")
    none = generate(**{**SMALL, "weak_per_question": 0.0})
    assert none.splits["train"]["weak"].null_count() == 200


def test_too_many_questions_names_n_entities():
    with pytest.raises(ValueError, match="raise n_entities"):
        generate(**{**SMALL, "n_entities": 8, "n_train": 5000})


@pytest.mark.parametrize("bad", [dict(min_hops=0), dict(max_hops=4), dict(min_hops=3, max_hops=2)])
def test_bad_hops(bad):
    with pytest.raises(ValueError, match="min_hops"):
        generate(**{**SMALL, **bad})


def test_every_split_and_both_parts_of_train_have_the_same_hop_mix():
    """The 1-hop questions (fewest) are spread over the splits and through train, not used up early:
    the RL rows after the SFT rows have them too (they once had none)."""
    data = generate(
        seed=0, n_train=4000, n_val=200, n_test=500, n_entities=450, min_hops=1, max_hops=3,
        weak_max_hops=1, weak_per_question=1.0,
    )  # fmt: skip

    def mix(df):
        return {h: df.filter(df["n_hops"] == h).height / df.height for h in (1, 2, 3)}

    train = data.splits["train"]
    parts = {
        "test": mix(data.splits["test"]),
        "val": mix(data.splits["val"]),
        "sft rows": mix(train.head(2000)),
        "rl rows": mix(train.slice(2000)),
    }
    for name, m in parts.items():
        for h in (1, 2, 3):
            assert abs(m[h] - parts["test"][h]) < 0.04, (name, parts)
    assert parts["rl rows"][1] > 0.1


@pytest.mark.parametrize(
    "available, total, expected",
    [
        ({1: 855, 2: 3000, 3: 20000}, 4700, {1: 855, 2: 1922, 3: 1923}),
        ({1: 855, 2: 1600, 3: 20000}, 4700, {1: 855, 2: 1600, 3: 2245}),
        ({1: 5000, 2: 5000, 3: 5000}, 4700, {1: 1566, 2: 1567, 3: 1567}),
        ({2: 10, 3: 10}, 20, {2: 10, 3: 10}),
        ({1: 5, 2: 5, 3: 7}, 17, {1: 5, 2: 5, 3: 7}),  # the remainder only fits the largest pool
    ],
)
def test_hop_counts_are_as_even_as_the_pools_allow(available, total, expected):
    assert hop_counts(available, total) == expected
