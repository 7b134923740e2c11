"""Deterministic generator of short multi-step arithmetic word problems that need a calculator.

A problem is a chain: "Ava has 12 apples. Ava gets 5 more apples. Ava then has 3 times as many apples.
How many apples does Ava have now?" Each sentence after the first is one calculator call that combines
the previous result with one new number (``12 + 5``, then ``17 * 3``), so the number of calls is the
number of operation sentences, drawn uniformly from ``[min_calls, max_calls]``. New numbers are at most
``max_operand``; every result is a whole number >= 1 (subtractions keep it positive, divisions are
exact by a divisor in 2..min(max_operand, 1000) other than the value itself, products stay below
10**12). The expert trajectory writes exactly those calls and the answer.

Weaker demonstrations (``weak_max_calls``, ``weak_per_question``): a second demonstrator solves the
same questions the way GSM8K's human-written solutions do: a problem that looks short (at most
``weak_max_calls`` operations) it works out in its head, writing each step as text and then the answer
("53 - 52 = 1\n1 * 91 = 91\n<answer>91</answer>", one turn, no calculator call); longer ones it leaves
to the expert. Its steps are always right (it does not slip), but a model that imitates it must produce
each result itself, which the embedded model cannot. A question gets ``weak_per_question`` copies of
its weak demonstration on average (a fractional part is drawn per question), from a separate random
stream, so the problems do not depend on them. Two designs were measured and dropped (SFT greedy test
accuracy 3% and 6.5%): skipping single calls mid-chain (calls then hold numbers found nowhere in the
context) and bare answers with no working (a number right after the question); both kept the model
from learning to copy operands.

Splits come from independent random streams (seed, split), generated test first, then val, then
train, each skipping questions already taken, so no question is shared between splits and the test
split does not change when ``n_train`` does.

It does not load files (see ``gsm8k.py``) and does not validate beyond building a TaskSchema table.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import polars as pl

from components.schemas import TASK_COLUMNS, TaskSchema, validate_table
from components.tasks.calc.expert import answer_message, call_message, encode_expert, tool_message
from components.tasks.recipe import split_sizes

__all__ = [
    "SPLITS",
    "TASK_DTYPES",
    "Problem",
    "generate_problem",
    "generate_split",
    "generate_splits",
    "weak_messages",
]

# The calc task table's columns (TaskSchema), generated or loaded (gsm8k.py).
TASK_DTYPES = {**TASK_COLUMNS, "n_calls": pl.Int64}

SPLITS = ("train", "val", "test")
_NAMES = (
    "Ava",
    "Ben",
    "Cara",
    "Dan",
    "Eva",
    "Finn",
    "Gia",
    "Hugo",
    "Ivy",
    "Jack",
    "Kim",
    "Leo",
    "Mia",
    "Noah",
    "Omar",
    "Pia",
)
_ITEMS = ("apples", "books", "coins", "pens", "stickers", "marbles", "cards", "shells", "stamps", "eggs")
_MAX_PRODUCT = 10**12
_MAX_MISSES = 2000  # this many duplicates in a row: the problem space is (nearly) exhausted
_MAX_DIVISOR = 1000  # divisions use divisors up to min(max_operand, this), to bound the search
# op -> (calculator symbol, sentence templates); {who}, {n} (the new number), {items}.
_OPS = {
    "add": ("+", ("{who} gets {n} more {items}.", "{who} finds {n} more {items}.")),
    "sub": ("-", ("{who} gives away {n} {items}.", "{who} loses {n} {items}.")),
    "mul": ("*", ("{who} then has {n} times as many {items}.",)),
    "div": ("/", ("{who} splits the {items} into {n} equal piles and keeps one pile.",)),
}


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str  # an integer, as text
    expert: list[dict]  # messages after the user prompt
    n_calls: int


def weak_messages(problem: Problem, max_calls: int) -> list[dict] | None:
    """The weaker demonstrator's one message for a problem of at most ``max_calls`` operations: each
    calculator call of the expert written as "expression = result" text, then the answer; None for a
    longer problem (it leaves that to the expert)."""
    if problem.n_calls > max_calls:
        return None
    calls = problem.expert[:-1:2]  # assistant tool calls, each followed by its tool message
    results = problem.expert[1:-1:2]
    work = [
        f"{c['tool_calls'][0]['function']['arguments']['expression']} = {r['content']}"
        for c, r in zip(calls, results)
    ]
    return [{"role": "assistant", "content": "\n".join(work + [f"<answer>{problem.answer}</answer>"])}]


def _feasible(value: int, max_operand: int) -> dict[str, tuple[int, int] | list[int]]:
    """For each op that keeps the result a whole number >= 1: its range of new numbers (or the list)."""
    out: dict[str, tuple[int, int] | list[int]] = {"add": (1, max_operand)}
    if value >= 2:
        out["sub"] = (1, min(value - 1, max_operand))
    hi = min(max_operand, _MAX_PRODUCT // value)
    if hi >= 2:
        out["mul"] = (2, hi)
    divisors = [d for d in range(2, min(max_operand, value - 1, _MAX_DIVISOR) + 1) if value % d == 0]
    if divisors:
        out["div"] = divisors
    return out


def generate_problem(rng: random.Random, n_calls: int, max_operand: int) -> Problem:
    """One problem with exactly ``n_calls`` calculator calls, drawn from ``rng``."""
    if n_calls < 1 or max_operand < 2:
        raise ValueError(
            f"need n_calls >= 1 and max_operand >= 2, got n_calls={n_calls}, max_operand={max_operand}"
        )
    who, items = rng.choice(_NAMES), rng.choice(_ITEMS)
    value = rng.randint(1, max_operand)
    sentences = [f"{who} has {value} {items}."]
    expert: list[dict] = []
    for _ in range(n_calls):
        options = _feasible(value, max_operand)
        op = rng.choice(sorted(options))
        choice = options[op]
        n = rng.choice(choice) if isinstance(choice, list) else rng.randint(*choice)
        symbol, templates = _OPS[op]
        sentences.append(rng.choice(templates).format(who=who, n=n, items=items))
        result = {"add": value + n, "sub": value - n, "mul": value * n, "div": value // n}[op]
        expert += [call_message(f"{value} {symbol} {n}"), tool_message(str(result))]
        value = result
    sentences.append(f"How many {items} does {who} have now?")
    expert.append(answer_message(str(value)))
    return Problem(" ".join(sentences), str(value), expert, n_calls)


def _weak_column(problem: Problem, rng: random.Random, max_calls: int, per_question: float) -> str | None:
    demo = weak_messages(problem, max_calls)
    copies = int(per_question) + (rng.random() < per_question - int(per_question))
    if demo is None or copies == 0:
        return None
    return json.dumps([demo] * copies, ensure_ascii=False)


def generate_split(
    split: str,
    n: int,
    *,
    seed: int,
    min_calls: int,
    max_calls: int,
    max_operand: int,
    taken: set[str],
    weak_max_calls: int = 0,
    weak_per_question: float = 0.0,
) -> pl.DataFrame:
    """``n`` problems of one split whose questions are not in ``taken`` (which gains them).

    Column ``weak``: JSON list of the weaker demonstrations of the row (see the module docstring), or
    null."""
    if not 1 <= min_calls <= max_calls:
        raise ValueError(
            f"need 1 <= min_calls <= max_calls, got min_calls={min_calls}, max_calls={max_calls}"
        )
    if weak_max_calls < 0:
        raise ValueError(f"weak_max_calls must be >= 0, got {weak_max_calls}")
    if weak_per_question < 0:
        raise ValueError(f"weak_per_question must be >= 0, got {weak_per_question}")
    rng = random.Random(f"calc/{seed}/{split}")
    weak_rng = random.Random(f"calc/{seed}/{split}/weak")
    rows, misses = [], 0
    while len(rows) < n:
        if misses >= _MAX_MISSES:
            raise ValueError(
                f"could only generate {len(rows)} unique {split} questions of {n} requested with "
                f"max_operand={max_operand}, calls {min_calls}..{max_calls}; raise max_operand or max_calls"
            )
        p = generate_problem(rng, rng.randint(min_calls, max_calls), max_operand)
        if p.question in taken:
            misses += 1
            continue
        misses = 0
        taken.add(p.question)
        rows.append(
            {
                "id": f"calc-{split}-{len(rows):06d}",
                "question": p.question,
                "answer": p.answer,
                "expert": encode_expert(p.expert),
                "split": split,
                "n_calls": p.n_calls,
                "weak": _weak_column(p, weak_rng, weak_max_calls, weak_per_question),
            }
        )
    schema = {**TASK_DTYPES, "weak": pl.String}  # only generated tables have weaker demonstrations
    return pl.DataFrame(rows, schema=schema)


def generate_splits(
    seed: int,
    n_train: int,
    n_val: int,
    n_test: int,
    min_calls: int,
    max_calls: int,
    max_operand: int,
    weak_max_calls: int = 0,
    weak_per_question: float = 0.0,
) -> dict[str, pl.DataFrame]:
    """``{"train", "val", "test"}`` tables (TaskSchema) with no question shared between them.

    Only the train split gets weaker demonstrations (the others are never imitated)."""
    sizes = split_sizes(n_train, n_val, n_test)
    taken: set[str] = set()
    out = {}
    for split in ("test", "val", "train"):
        weak = (
            dict(weak_max_calls=weak_max_calls, weak_per_question=weak_per_question)
            if split == "train"
            else {}
        )
        df = generate_split(
            split,
            sizes[split],
            seed=seed,
            min_calls=min_calls,
            max_calls=max_calls,
            max_operand=max_operand,
            taken=taken,
            **weak,
        )
        out[split] = validate_table(df, TaskSchema, f"generated calc split {split!r}")
    return {split: out[split] for split in SPLITS}
