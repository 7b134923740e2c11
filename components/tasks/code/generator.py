"""Seeded, checkable problems where running a short program is the way to the answer.

Eight generators with reasoning-gym's names and shape (a question, a short answer, the generator's
own checker, :func:`score_answer`): basic_arithmetic, gcd, lcm, prime_factorization,
base_conversion, count_primes, letter_counting, word_sorting. reasoning-gym itself is not used: it
pins tabulate==0.9.0 where the lock has 0.10.0 (via DVC), so these are written here. Each problem
also carries the program that solves it (printing exactly the answer) and a first attempt with a
mistake (``prnt``, or a missing ``import math``) for the weaker demonstrations.

:func:`generate_splits` draws problems from one ``random.Random(seed)`` stream, each generator picked
by the params' mix weights, keeps a question only once across the three splits, and shuffles the
problems before cutting the splits, so each split has the same share of each generator.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from components.tasks.calc.calculator import evaluate, format_number
from components.tasks.demonstrations import answer_message, encode, tool_call_message, tool_message

__all__ = ["GENERATORS", "Problem", "generate_splits", "score_answer"]

_WORDS = (
    "apple", "banana", "cherry", "grape", "lemon", "mango", "melon", "olive", "peach", "pear", "plum",
    "strawberry", "kiwi", "papaya", "walnut", "almond", "carrot", "pepper", "tomato", "onion", "garlic",
    "ginger", "radish", "turnip", "rabbit", "parrot", "otter", "zebra", "llama", "tiger",
)  # fmt: skip


@dataclass(frozen=True)
class Problem:
    generator: str
    question: str
    answer: str
    code: str  # prints exactly the answer
    wrong_code: str  # a first attempt that fails with a NameError


def _arithmetic(rng: random.Random, n: int) -> Problem:
    terms = [rng.randint(2, n) for _ in range(rng.randint(3, 4))]
    ops = [rng.choice("+-*") for _ in terms[1:]]
    expr = str(terms[0]) + "".join(f" {op} {t}" for op, t in zip(ops, terms[1:]))
    # the calc task's calculator reads the expression as Python does, without eval
    return _problem("basic_arithmetic", f"Compute {expr}.", format_number(evaluate(expr)), f"print({expr})")


def _gcd(rng: random.Random, n: int) -> Problem:
    k = rng.randint(2, max(2, n // 8))
    a, b = k * rng.randint(1, max(1, n // k)), k * rng.randint(1, max(1, n // k))
    return _problem(
        "gcd",
        f"What is the greatest common divisor of {a} and {b}?",
        str(math.gcd(a, b)),
        f"import math\nprint(math.gcd({a}, {b}))",
    )


def _lcm(rng: random.Random, n: int) -> Problem:
    a, b = rng.randint(2, max(3, n // 2)), rng.randint(2, max(3, n // 2))
    return _problem(
        "lcm",
        f"What is the least common multiple of {a} and {b}?",
        str(math.lcm(a, b)),
        f"import math\nprint(math.lcm({a}, {b}))",
    )


def _factors(x: int) -> list[int]:
    out, d = [], 2
    while x > 1:
        while x % d == 0:
            out.append(d)
            x //= d
        d += 1
    return out


def _prime_factorization(rng: random.Random, n: int) -> Problem:
    x = rng.randint(4, max(5, 4 * n))
    code = (
        f"n, d = {x}, 2\nf = []\nwhile n > 1:\n    while n % d == 0:\n        f.append(d)\n"
        "        n //= d\n    d += 1\nprint(' x '.join(map(str, f)))"
    )
    return _problem(
        "prime_factorization",
        f"Write the prime factorization of {x} as its prime factors in increasing order joined by ' x '.",
        " x ".join(map(str, _factors(x))),
        code,
    )


def _base_conversion(rng: random.Random, n: int) -> Problem:
    x = rng.randint(2, max(3, 4 * n))
    name, spec = rng.choice([("binary", "b"), ("octal", "o"), ("hexadecimal", "x")])
    return _problem(
        "base_conversion",
        f"Convert {x} to {name} (digits only, lowercase, no prefix).",
        format(x, spec),
        f"print(format({x}, '{spec}'))",
    )


def _count_primes(rng: random.Random, n: int) -> Problem:
    lo = rng.randint(2, n)
    hi = lo + rng.randint(5, max(6, n))
    count = sum(all(k % d for d in range(2, math.isqrt(k) + 1)) for k in range(lo, hi + 1))
    code = f"print(sum(all(k % d for d in range(2, k)) for k in range({lo}, {hi + 1})))"
    return _problem(
        "count_primes", f"How many primes are there from {lo} to {hi} inclusive?", str(count), code
    )


def _letter_counting(rng: random.Random, n: int) -> Problem:
    words = rng.sample(_WORDS, rng.randint(1, 3))
    text = " ".join(words)
    letter = rng.choice(sorted(set(text.replace(" ", ""))))
    return _problem(
        "letter_counting",
        f"How many times does the letter '{letter}' appear in '{text}'?",
        str(text.count(letter)),
        f"print('{text}'.count('{letter}'))",
    )


def _word_sorting(rng: random.Random, n: int) -> Problem:
    words = rng.sample(_WORDS, rng.randint(3, 5))
    listed = ", ".join(words)
    return _problem(
        "word_sorting",
        f"Sort these words alphabetically and list them separated by ', ': {listed}",
        ", ".join(sorted(words)),
        f"print(', '.join(sorted({words!r})))",
    )


def _problem(generator: str, question: str, answer: str, code: str) -> Problem:
    if code.startswith("import math\n"):  # the mistake: the import forgotten
        wrong = code.removeprefix("import math\n")
    else:  # the mistake: a typo in print
        i = code.rindex("print(")
        wrong = code[:i] + "prnt(" + code[i + len("print(") :]
    return Problem(generator, question, answer, code, wrong)


GENERATORS: dict[str, Callable[[random.Random, int], Problem]] = {
    "basic_arithmetic": _arithmetic,
    "gcd": _gcd,
    "lcm": _lcm,
    "prime_factorization": _prime_factorization,
    "base_conversion": _base_conversion,
    "count_primes": _count_primes,
    "letter_counting": _letter_counting,
    "word_sorting": _word_sorting,
}


def _tokens(text: str) -> list[str]:
    return [t for t in re.split(r"[\s,]+", text.strip().lower()) if t]


def score_answer(generator: str, answer: str | None, truth: str) -> float:
    """The generator's checker: 1.0 when ``answer`` is right, else 0.0. Numbers compare as integers,
    a base conversion ignores case and a 0b/0o/0x prefix, a factorization compares its factors (any
    order, 'x' or '*' between them), a word list compares the words in order."""
    if answer is None:
        return 0.0
    if generator not in GENERATORS:
        raise ValueError(f"unknown generator {generator!r}; known: {sorted(GENERATORS)}")
    a = answer.strip().lower()
    if generator == "base_conversion":
        return float(re.sub(r"^0[box]", "", a) == truth)
    if generator == "prime_factorization":
        got = sorted(re.split(r"\s*[x*]\s*", a))
        return float(got == sorted(truth.split(" x ")))
    if generator == "word_sorting":
        return float(_tokens(a) == _tokens(truth))
    try:
        return float(int(a.replace(",", "")) == int(truth))
    except ValueError:
        return 0.0


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
    unknown = sorted(set(mix) - set(GENERATORS))
    if unknown:
        raise ValueError(f"tasks.code.mix: unknown generators {unknown}; known: {sorted(GENERATORS)}")
    names = [k for k, w in mix.items() if w > 0]
    if not names:
        raise ValueError("tasks.code.mix: every weight is 0; give at least one generator a weight > 0")
    rng = random.Random(seed)
    need = n_train + n_val + n_test
    problems: list[Problem] = []
    seen: set[str] = set()
    attempts = 0
    while len(problems) < need:
        attempts += 1
        if attempts > 50 * need + 1000:
            raise ValueError(
                f"tasks.code: only {len(problems)} distinct problems of {need} found; raise max_number "
                f"({max_number}) or lower prepare.n_train/n_val/n_test"
            )
        name = rng.choices(names, weights=[mix[k] for k in names])[0]
        p = GENERATORS[name](rng, max_number)
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
                "weak": [encode([weak_conversation(p)] * k) for p, k in zip(chunk, weak)],
            },
            schema_overrides={"n_calls": pl.Int64},
        )
    return out
