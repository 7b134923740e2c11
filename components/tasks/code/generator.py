"""Seeded, checkable problems where running a short program is the way to the answer: reasoning-gym's.

Eight of reasoning-gym's generators (``reasoning_gym.create_dataset``): basic_arithmetic, gcd, lcm,
prime_factorization, base_conversion, count_primes, letter_counting, word_sorting. A problem is
reasoning-gym's own item (its question, answer and metadata) and is graded by the generator's own
``score_answer`` (:func:`score_answer`), counted right only at its full score: the task is exact, so
reasoning-gym's partial credits (0.5 for factors whose product is right, the share of words in their
place, at least 0.2, for a list sorted wrong, a fraction for an answer that contains the right one)
are 0 here. Each generator's config is set from ``max_number`` (:data:`CONFIGS`): operands up
to ``max_number``, a counted range up to 2x it, a factorised or converted number up to 4x it. What is written here: the program that solves each problem, from
the item's metadata (printing exactly the answer: the expert's demonstration), and a first attempt
with a mistake (``prnt``, or a missing ``import math``) for the weaker demonstrations.

:func:`generate_splits` draws the generator of each problem from one ``random.Random(seed)`` stream
by the params' mix weights and takes that generator's next item (its dataset seeded by
:func:`dataset_seed`), keeps a question only once across the three splits, and shuffles the problems
before cutting the splits, so each split has the same share of each generator.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import polars as pl

from components.tasks.demonstrations import answer_message, encode, tool_call_message, tool_message

__all__ = ["CONFIGS", "GENERATORS", "Problem", "dataset_seed", "generate_splits", "score_answer"]


@dataclass(frozen=True)
class Problem:
    generator: str
    index: int  # the item's index in the generator's dataset
    question: str
    answer: str
    metadata: dict[str, Any]  # reasoning-gym's metadata of the item (its score_answer may read it)
    code: str  # prints exactly the answer
    wrong_code: str  # a first attempt that fails with a NameError


# reasoning-gym's config of each generator from max_number (its other settings: reasoning-gym's
# defaults). basic_arithmetic: 3-4 terms of up to max_number's digits, + - * only (no division), with
# reasoning-gym's parentheses (its generator without them computes left to right, not as written).
CONFIGS: dict[str, Callable[[int], dict[str, Any]]] = {
    "basic_arithmetic": lambda n: dict(
        min_terms=3, max_terms=4, min_digits=1, max_digits=len(str(n)), operators=("+", "-", "*"),
        allow_negation=False,
    ),
    "gcd": lambda n: dict(min_numbers=2, max_numbers=2, min_value=2, max_value=n),
    "lcm": lambda n: dict(min_numbers=2, max_numbers=2, min_value=2, max_value=n // 2),
    "prime_factorization": lambda n: dict(min_value=4, max_value=4 * n),
    "base_conversion": lambda n: dict(min_value=2, max_value=4 * n),
    "count_primes": lambda n: dict(min_n=2, max_n=2 * n),
    "letter_counting": lambda n: dict(min_words=1, max_words=3),
    "word_sorting": lambda n: dict(min_words=3, max_words=5),
}  # fmt: skip


def _gcd(m: Mapping[str, Any]) -> str:
    return f"import math\nprint(math.gcd({', '.join(map(str, m['numbers']))}))"


def _lcm(m: Mapping[str, Any]) -> str:
    return f"import math\nprint(math.lcm({', '.join(map(str, m['numbers']))}))"


def _prime_factorization(m: Mapping[str, Any]) -> str:
    return (
        f"n, d = {int(m['number'])}, 2\nf = []\nwhile n > 1:\n    while n % d == 0:\n        f.append(d)\n"
        "        n //= d\n    d += 1\nprint(' × '.join(map(str, f)))"
    )


def _base_conversion(m: Mapping[str, Any]) -> str:
    return (
        f"n, b = int({m['source_repr']!r}, {int(m['source_base'])}), {int(m['target_base'])}\n"
        "digits = ''\nwhile n:\n    digits = '0123456789abcdefghijklmnopqrstuvwxyz'[n % b] + digits\n"
        "    n //= b\nprint(digits or '0')"
    )


def _count_primes(m: Mapping[str, Any]) -> str:
    lo, hi = int(m["start"]), int(m["end"])
    return f"print(sum(k > 1 and all(k % d for d in range(2, k)) for k in range({lo}, {hi + 1})))"


def _letter_counting(m: Mapping[str, Any]) -> str:
    return f"print({' '.join(m['span'])!r}.lower().count({m['target_letter']!r}))"


def _word_sorting(m: Mapping[str, Any]) -> str:
    reverse = m["direction"] == "descending"
    return f"print(', '.join(sorted({list(m['transformed_words'])!r}, reverse={reverse})))"


# The program that solves an item of each generator, from its metadata (reasoning-gym has none).
PROGRAMS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "basic_arithmetic": lambda m: f"print({m['expression']})",
    "gcd": _gcd,
    "lcm": _lcm,
    "prime_factorization": _prime_factorization,
    "base_conversion": _base_conversion,
    "count_primes": _count_primes,
    "letter_counting": _letter_counting,
    "word_sorting": _word_sorting,
}

GENERATORS: tuple[str, ...] = tuple(CONFIGS)


def dataset_seed(seed: int, generator: str) -> int:
    """The seed of ``generator``'s reasoning-gym dataset for the task seed ``seed``. reasoning-gym seeds
    item ``i`` with ``seed + i``, so the two are hashed together: seeds 0 and 1 share no items."""
    return random.Random(f"code|{seed}|{generator}").getrandbits(31)


def _known(generator: str) -> None:
    if generator not in CONFIGS:
        raise ValueError(f"unknown generator {generator!r}; known: {sorted(CONFIGS)}")


def make_dataset(generator: str, *, seed: int, size: int, max_number: int):
    """reasoning-gym's dataset of ``generator`` with the task's config for ``max_number``."""
    _known(generator)
    # imported here: reasoning-gym imports all its generators (seconds), and loading params imports
    # every task's params model, which reads GENERATORS
    import reasoning_gym

    return reasoning_gym.create_dataset(generator, seed=seed, size=size, **CONFIGS[generator](max_number))


@cache
def _scorer(generator: str):
    # score_answer reads the item (its answer and metadata), not the dataset's config
    return make_dataset(generator, seed=0, size=1, max_number=60)


def score_answer(generator: str, answer: str | None, entry: Mapping[str, Any]) -> float:
    """1.0 when reasoning-gym's ``score_answer`` of ``generator`` gives ``answer`` its full score on
    ``entry`` (the item: ``question``, ``answer``, ``metadata``), else 0.0 (partial credit is 0: the
    task is exact)."""
    _known(generator)
    if answer is None:
        return 0.0
    item = {"question": entry.get("question", ""), "answer": entry["answer"], "metadata": entry["metadata"]}
    return float(_scorer(generator).score_answer(answer.strip(), item) >= 1.0)


def _problem(generator: str, index: int, item: Mapping[str, Any]) -> Problem:
    code = PROGRAMS[generator](item["metadata"])
    if code.startswith("import math\n"):  # the mistake: the import forgotten
        wrong = code.removeprefix("import math\n")
    else:  # the mistake: a typo in the last print
        i = code.rindex("print(")
        wrong = code[:i] + "prnt(" + code[i + len("print(") :]
    metadata = json.loads(json.dumps(item["metadata"], default=str))  # JSON-safe (tuples as lists)
    return Problem(generator, index, str(item["question"]), str(item["answer"]), metadata, code, wrong)


def problem(generator: str, index: int, *, seed: int, max_number: int) -> Problem:
    """Item ``index`` of ``generator``'s dataset for the task seed ``seed``, as a problem."""
    data = make_dataset(generator, seed=dataset_seed(seed, generator), size=index + 1, max_number=max_number)
    return _problem(generator, index, data[index])


def expert_conversation(p: Problem) -> list[dict]:
    """The expert: one program that prints the answer, then the answer."""
    return [
        tool_call_message("python", {"code": p.code}),
        tool_message("python", p.answer),
        answer_message(p.answer),
    ]


def weak_conversation(p: Problem) -> list[dict]:
    """The weaker demonstrator: a first program with a mistake, its error (the last traceback line, as
    the python tool returns it), the fixed program, the answer."""
    name = "math" if "import math" not in p.wrong_code and "math." in p.wrong_code else "prnt"
    return [
        tool_call_message("python", {"code": p.wrong_code}),
        tool_message("python", f"NameError: name '{name}' is not defined"),
        *expert_conversation(p),
    ]


def generate_splits(
    *,
    seed: int,
    n_train: int,
    n_val: int,
    n_test: int,
    mix: dict[str, float],
    max_number: int,
    weak_per_question: float,
) -> dict[str, pl.DataFrame]:
    """The three splits; a question appears in one split only. ``weak_per_question``: weaker
    demonstrations per train question on average (stored as a count per row)."""
    unknown = sorted(set(mix) - set(CONFIGS))
    if unknown:
        raise ValueError(f"tasks.code.mix: unknown generators {unknown}; known: {sorted(CONFIGS)}")
    names = [k for k, w in mix.items() if w > 0]
    if not names:
        raise ValueError("tasks.code.mix: every weight is 0; give at least one generator a weight > 0")
    rng = random.Random(seed)
    need = n_train + n_val + n_test
    limit = 50 * need + 1000
    datasets = {
        k: make_dataset(k, seed=dataset_seed(seed, k), size=limit, max_number=max_number) for k in names
    }
    taken = dict.fromkeys(names, 0)  # items drawn from each dataset
    problems: list[Problem] = []
    seen: set[str] = set()
    attempts = 0
    while len(problems) < need:
        attempts += 1
        if attempts > limit:
            raise ValueError(
                f"tasks.code: only {len(problems)} distinct problems of {need} found; raise max_number "
                f"({max_number}) or lower prepare.n_train/n_val/n_test"
            )
        name = rng.choices(names, weights=[mix[k] for k in names])[0]
        index = taken[name]
        taken[name] += 1
        p = _problem(name, index, datasets[name][index])
        if p.question not in seen:
            seen.add(p.question)
            problems.append(p)
    # A generator with few distinct questions runs out early in the stream; shuffled, every split
    # gets the same share of each generator (drawn in order, the test split got almost none of them).
    rng.shuffle(problems)
    out, start = {}, 0
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        chunk = problems[start : start + n]
        start += n
        weak = [
            int(weak_per_question) + (rng.random() < weak_per_question % 1) if split == "train" else 0
            for _ in chunk
        ]  # weaker demonstrations of each row
        out[split] = pl.DataFrame(
            {
                "id": [f"{split}-{i}" for i in range(n)],
                "question": [p.question for p in chunk],
                "answer": [p.answer for p in chunk],
                "expert": [encode(expert_conversation(p)) for p in chunk],
                "split": [split] * n,
                "n_calls": [1] * n,
                "generator": [p.generator for p in chunk],
                # reasoning-gym's metadata of the item (JSON; its source_index is the item's index)
                "metadata": [encode(p.metadata) for p in chunk],
                "weak": [encode([weak_conversation(p)] * k) for p, k in zip(chunk, weak)],
            },
            schema_overrides={"n_calls": pl.Int64, "metadata": pl.String},
        )
    return out
