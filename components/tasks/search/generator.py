"""Multi-hop questions over a generated knowledge base, with expert and weaker demonstrations.

A question follows a chain of relations from a named entity ("In which country is the birthplace of
the founder of Bolt Co?": Bolt Co -founded_by-> Ava Lin -born_in-> Tamo -country-> Veldia), 1 to 3
hops. Every chain of ``min_hops``..``max_hops`` relations whose answer is not an entity already on the
chain is a question; a hop's gold passage is the passage of the entity it starts from (the supporting
facts), so a question of h hops has h gold passages and the expert makes h searches, each for the name
of that entity (taken from the question, then from the previous result), with the real search tool
on the real index, so its tool messages are exactly what the environment returns.

Weaker demonstrations (``weak_max_hops``, ``weak_per_question``): a second demonstrator answers every
question of at most ``weak_max_hops`` hops from memory, in one turn: it writes the gold passages it
recalls, then the answer, with no search (its recall is always right). A model imitating it must have
memorised the knowledge base, which the embedded model has not, so RL has to learn from the outcome
reward when to search. A question gets ``weak_per_question`` copies on average (the fractional part is
drawn per question from its own random stream), in the train split only.

Splits: all questions are enumerated and shuffled per hop count (seed). How many questions of each
hop count the three splits take together is as even as the pools allow (:func:`hop_counts`: equal
shares, a hop count with fewer questions gives all it has and the others share the rest), and every
split gets the same mix (its share of each count), in random order. So no question is in two splits,
and every part of the train split (the SFT rows and the RL rows after them) has the hop mix of the
test split: the 1-hop questions, where the weaker demonstrations answer without searching, are
where RL has to learn to search. Asking for more questions than exist raises, naming ``n_entities``.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass

import polars as pl

from components.schemas import TASK_COLUMNS, validate_table
from components.tasks.recipe import split_sizes
from components.tasks.search.expert import answer_message, call_message, encode, memory_message, tool_message
from components.tasks.search.index import SearchIndex
from components.tasks.search.kb import RELATIONS, KnowledgeBase, generate_kb
from components.tasks.search.schemas import SearchTaskSchema
from components.tasks.search.tool import SearchTool

__all__ = ["SPLITS", "TASK_DTYPES", "GeneratedData", "Question", "enumerate_questions", "generate"]

SPLITS = ("train", "val", "test")
TASK_DTYPES = {
    **TASK_COLUMNS,
    "n_hops": pl.Int64,
    "gold_titles": pl.String,
    "weak": pl.String,
}


@dataclass(frozen=True)
class Question:
    question: str
    answer: str
    chain: tuple[str, ...]  # the entities each hop starts from (their passages are the gold ones)


@dataclass(frozen=True)
class GeneratedData:
    splits: dict[str, pl.DataFrame]
    index: SearchIndex
    kb: KnowledgeBase


def _phrase(name: str, relations: tuple[str, ...]) -> str:
    text = name
    for rel in relations[:-1]:
        text = f"the {RELATIONS[rel].noun} of {text}"
    return RELATIONS[relations[-1]].question.format(x=text)


def enumerate_questions(kb: KnowledgeBase, hops: int) -> list[Question]:
    """Every question of exactly ``hops`` hops whose answer is not on its own chain (KB order)."""
    out = []
    for start in kb.entities.values():
        for relations in itertools.product(RELATIONS, repeat=hops):
            chain, entity = [start.name], start
            for rel in relations:
                if RELATIONS[rel].source != entity.kind:
                    break
                entity = kb.entities[entity.relations[rel]]
                chain.append(entity.name)
            else:
                if chain[-1] not in chain[:-1]:
                    out.append(Question(_phrase(start.name, relations), chain[-1], tuple(chain[:-1])))
    return out


def _demos(q: Question, kb: KnowledgeBase, tool: SearchTool) -> list[dict]:
    messages: list[dict] = []
    for name in q.chain:
        result = tool.execute({"query": name})
        messages += [call_message(name), tool_message(result.text)]
    return [*messages, answer_message(q.answer)]


def _weak(
    q: Question, kb: KnowledgeBase, rng: random.Random, max_hops: int, per_question: float
) -> str | None:
    copies = int(per_question) + (rng.random() < per_question - int(per_question))
    if len(q.chain) > max_hops or copies == 0:
        return None
    demo = [memory_message([kb.entities[name].passage() for name in q.chain], q.answer)]
    return json.dumps([demo] * copies, ensure_ascii=False)


def hop_counts(available: dict[int, int], total: int) -> dict[int, int]:
    """Questions to take of each hop count, ``total`` in all (at most their sum), as equal as
    ``available`` allows: smallest pool first, each takes its equal share of what is left or all it
    has, so what a small pool cannot give goes to the larger ones (water-filling)."""
    counts, left = {}, total
    order = sorted(available, key=lambda h: available[h])
    for i, h in enumerate(order):
        counts[h] = min(available[h], left // (len(order) - i))
        left -= counts[h]
    return counts


def _shares(counts: dict[int, int], size: int) -> dict[int, int]:
    """``size`` of the ``counts`` questions in their proportions (largest remainder; never more than
    ``counts`` of a hop count, as ``size <= sum(counts)``)."""
    total = sum(counts.values())
    if total == 0:
        return {h: 0 for h in counts}
    exact = {h: n * size / total for h, n in counts.items()}
    out = {h: int(x) for h, x in exact.items()}
    for h in sorted(exact, key=lambda h: out[h] - exact[h])[: size - sum(out.values())]:
        out[h] += 1
    return out


def generate(
    *,
    seed: int,
    n_train: int,
    n_val: int,
    n_test: int,
    n_entities: int,
    min_hops: int,
    max_hops: int,
    weak_max_hops: int = 0,
    weak_per_question: float = 0.0,
    top_k: int = 2,
    max_result_chars: int = 400,
) -> GeneratedData:
    """The knowledge base, its index and the ``{"train", "val", "test"}`` tables (SearchTaskSchema)."""
    sizes = split_sizes(n_train, n_val, n_test)
    if not 1 <= min_hops <= max_hops <= 3:
        raise ValueError(f"need 1 <= min_hops <= max_hops <= 3, got min_hops={min_hops}, max_hops={max_hops}")
    if weak_max_hops < 0 or weak_per_question < 0:
        raise ValueError(
            f"weak_max_hops and weak_per_question must be >= 0, got {weak_max_hops}, {weak_per_question}"
        )
    kb = generate_kb(seed, n_entities)
    index = SearchIndex.build(kb.passages(), "generated knowledge base")
    tool = SearchTool(index, top_k=top_k, max_result_chars=max_result_chars)
    rng = random.Random(f"search/{seed}/questions")
    pools = {}
    for h in range(min_hops, max_hops + 1):
        pools[h] = enumerate_questions(kb, h)
        rng.shuffle(pools[h])
    total = sum(len(p) for p in pools.values())
    if sum(sizes.values()) > total:
        raise ValueError(
            f"n_entities={n_entities} gives {total} questions of {min_hops}..{max_hops} hops, fewer than "
            f"n_train + n_val + n_test = {sum(sizes.values())}; raise n_entities or max_hops"
        )
    left = hop_counts({h: len(p) for h, p in pools.items()}, sum(sizes.values()))
    out = {}
    for split in ("test", "val", "train"):  # train, the last, takes exactly what is left
        split_rng = random.Random(f"search/{seed}/{split}")
        weak_rng = random.Random(f"search/{seed}/{split}/weak")
        share = left if split == "train" else _shares(left, sizes[split])
        left = {h: left[h] - share[h] for h in left}
        hops = [h for h, n in share.items() for _ in range(n)]
        split_rng.shuffle(hops)
        rows = []
        for i, h in enumerate(hops):
            q = pools[h].pop()
            weak = _weak(q, kb, weak_rng, weak_max_hops, weak_per_question) if split == "train" else None
            rows.append(
                {
                    "id": f"search-{split}-{i:06d}",
                    "question": q.question,
                    "answer": q.answer,
                    "expert": encode(_demos(q, kb, tool)),
                    "split": split,
                    "n_hops": len(q.chain),
                    "gold_titles": encode(list(q.chain)),
                    "weak": weak,
                }
            )
        df = pl.DataFrame(rows, schema=TASK_DTYPES)
        out[split] = validate_table(df, SearchTaskSchema, f"generated search split {split!r}")
    return GeneratedData({s: out[s] for s in SPLITS}, index, kb)
