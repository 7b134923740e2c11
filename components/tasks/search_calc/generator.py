"""The search_calc splits: questions over the numeric knowledge base, with expert and weaker demos.

Questions come from ``questions.candidates`` (every kind that needs at most ``max_searches``
searches). How many of each kind the three splits take together is as even as the pools allow (the
search task's ``hop_counts``: founder_age has one question per company, so it gives all it has and
the other kinds share the rest). The chosen questions are interleaved so that every prefix has the
kinds' proportions, then the test split takes the first ``n_test``, val the next ``n_val`` and train
the rest (no question is in two splits), each shuffled. A question is kept only if each of its
expert searches returns its gold passage (BM25 top-``top_k``), so every expert demonstration finds
what it needs.

Demonstrations (messages after the user prompt):

- the **expert** searches each name of the question (the real tool's results as tool messages), calls
  the calculator on the numbers it read (the real calculator's result), then answers;
- a **weaker demonstrator** searches the same way but skips the calculator: one last turn with its
  working as text and the answer ("2021 - 1984 = 37" newline ``<answer>37</answer>``), the way the
  calc task's weaker demonstrator does. Its arithmetic is right, but a model that imitates it must do
  four-digit arithmetic in one forward pass, which the embedded model cannot: RL has to learn from
  the outcome reward (and the process rewards, if weighted) to call the calculator. A question gets
  ``weak_per_question`` of them on average (the fractional part drawn per question), train split only.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import polars as pl

from components.schemas import TASK_COLUMNS, validate_table
from components.tasks.calc.calculator import calculate
from components.tasks.calc.expert import call_message as calc_call
from components.tasks.calc.expert import tool_message as calc_message
from components.tasks.demonstrations import answer_message, encode
from components.tasks.recipe import split_sizes
from components.tasks.search.expert import call_message as search_call
from components.tasks.search.expert import tool_message as search_message
from components.tasks.search.generator import hop_counts
from components.tasks.search.index import SearchIndex
from components.tasks.search.tool import SearchTool
from components.tasks.search_calc.facts import NumericKB, generate_numeric_kb
from components.tasks.search_calc.questions import Question, candidates
from components.tasks.search_calc.schemas import SearchCalcTaskSchema

__all__ = ["SPLITS", "TASK_DTYPES", "GeneratedData", "expert_demo", "generate", "weak_demo"]

SPLITS = ("train", "val", "test")
TASK_DTYPES = {
    **TASK_COLUMNS,
    "kind": pl.String,
    "n_searches": pl.Int64,
    "gold_titles": pl.String,
    "weak": pl.String,
}


@dataclass(frozen=True)
class GeneratedData:
    splits: dict[str, pl.DataFrame]
    index: SearchIndex
    nkb: NumericKB


def _searches(q: Question, tool: SearchTool) -> list[dict] | None:
    """The expert's search turns (call, real result); None if a search misses its gold passage."""
    messages: list[dict] = []
    for name in q.searches:
        tool.clear()
        result = tool.execute({"query": name})
        if name not in tool.retrieved:
            return None
        messages += [search_call(name), search_message(result.text)]
    return messages


def expert_demo(q: Question, searched: list[dict]) -> list[dict]:
    result = calculate(q.expression)
    return [*searched, calc_call(q.expression), calc_message(result.text), answer_message(str(q.answer))]


def weak_demo(q: Question, searched: list[dict]) -> list[dict]:
    working = f"{q.expression} = {q.answer}\n<answer>{q.answer}</answer>"
    return [*searched, {"role": "assistant", "content": working}]


def _interleaved(chosen: dict[str, list[Question]]) -> list[Question]:
    """Every chosen question, ordered so that each prefix has about the kinds' proportions."""
    keyed = [
        ((i + 0.5) / len(qs), k, q) for k, (kind, qs) in enumerate(chosen.items()) for i, q in enumerate(qs)
    ]
    return [q for _, _, q in sorted(keyed, key=lambda x: (x[0], x[1]))]


def generate(
    *,
    seed: int,
    n_train: int,
    n_val: int,
    n_test: int,
    n_entities: int,
    max_searches: int,
    weak_per_question: float = 0.0,
    top_k: int = 2,
    max_result_chars: int = 400,
) -> GeneratedData:
    """The numeric knowledge base, its index and the ``{"train", "val", "test"}`` tables."""
    split_sizes(n_train, n_val, n_test)  # checks them
    if max_searches not in (1, 2):
        raise ValueError(f"max_searches must be 1 or 2, got {max_searches}")
    if weak_per_question < 0:
        raise ValueError(f"weak_per_question must be >= 0, got {weak_per_question}")
    nkb = generate_numeric_kb(seed, n_entities)
    index = SearchIndex.build(nkb.passages(), "search_calc knowledge base")
    tool = SearchTool(index, top_k=top_k, max_result_chars=max_result_chars)
    pools = candidates(nkb, seed, max_searches)
    rng = random.Random(f"search-calc/{seed}/questions")
    searched: dict[str, list[dict]] = {}
    usable: dict[str, list[Question]] = {}
    for kind, pool in pools.items():
        rng.shuffle(pool)
        usable[kind] = []
        for q in pool:
            found = _searches(q, tool)
            if found is not None:
                usable[kind].append(q)
                searched[q.question] = found
    total = n_train + n_val + n_test
    if total > sum(len(p) for p in usable.values()):
        raise ValueError(
            f"n_entities={n_entities} gives {sum(len(p) for p in usable.values())} questions, fewer than "
            f"n_train + n_val + n_test = {total}; raise n_entities"
        )
    counts = hop_counts({k: len(p) for k, p in usable.items()}, total)
    ordered = _interleaved({k: usable[k][: counts[k]] for k in usable})
    bounds = {"test": (0, n_test), "val": (n_test, n_test + n_val), "train": (n_test + n_val, total)}
    out = {}
    for split in SPLITS:
        lo, hi = bounds[split]
        questions = ordered[lo:hi]
        random.Random(f"search-calc/{seed}/{split}").shuffle(questions)
        weak_rng = random.Random(f"search-calc/{seed}/{split}/weak")
        rows = []
        for i, q in enumerate(questions):
            copies = int(weak_per_question) + (weak_rng.random() < weak_per_question - int(weak_per_question))
            weak = weak_demo(q, searched[q.question]) if split == "train" and copies else None
            rows.append(
                {
                    "id": f"search_calc-{split}-{i:06d}",
                    "question": q.question,
                    "answer": str(q.answer),
                    "expert": encode(expert_demo(q, searched[q.question])),
                    "split": split,
                    "kind": q.kind,
                    "n_searches": len(q.searches),
                    "gold_titles": encode(list(q.searches)),
                    "weak": json.dumps([weak] * copies, ensure_ascii=False) if weak else None,
                }
            )
        df = pl.DataFrame(rows, schema=TASK_DTYPES)
        out[split] = validate_table(df, SearchCalcTaskSchema, f"generated search_calc split {split!r}")
    return GeneratedData(out, index, nkb)
