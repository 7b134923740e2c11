"""Questions that need a search and then arithmetic over what it found, computed from the facts.

Each kind of question names the entities whose passages hold its numbers (``searches``, in the order
the expert searches them: a second name may only be known from the first result, as the founder of a
company is) and the calculator expression over those numbers (``expression``); its answer is the
expression's value. With one search per name, a calculator call and the answer, a question takes
``len(searches) + 2`` agent turns.

| kind | searches | example | expression |
|---|---|---|---|
| age_in | 1 | How old was Ava Lin in 2021? | 2021 - born |
| company_age | 1 | How old was Bolt Co in 2021? | 2021 - founded |
| population_growth | 1 | How many people will live in Tamo after 3000 more move there? | people + 3000 |
| founder_age | 2 | How old was the founder of Bolt Co when it was founded? | founded - born(founder) |
| mayor_age_in | 2 | How old was the mayor of Tamo in 2021? | 2021 - born(mayor) |
| age_gap | 2 | How many years older is Ava Lin than Ben Kim? | born(Ben) - born(Ava) |
| population_sum | 2 | How many people live in Tamo and Rivo together? | people(Tamo) + people(Rivo) |

:func:`recompute` computes a question's answer again from passage texts alone (the test of the
knowledge base's consistency uses it).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from components.tasks.search_calc.facts import NumericKB, read_fact

__all__ = ["KINDS", "Question", "candidates", "recompute"]

LAST_ASKED_YEAR = 2030
_YEARS_PER_ENTITY = 6
_PAIRS = 1200


@dataclass(frozen=True)
class Question:
    kind: str
    question: str
    answer: int
    searches: tuple[str, ...]  # names searched, in order; their passages are the gold ones
    expression: str  # the calculator expression over the passages' numbers


def _years(rng: random.Random, first: int, n: int = _YEARS_PER_ENTITY) -> list[int]:
    pool = list(range(first, LAST_ASKED_YEAR + 1))
    return sorted(rng.sample(pool, min(n, len(pool))))


def _age_in(nkb: NumericKB, rng: random.Random) -> list[Question]:
    out = []
    for p in nkb.kb.of_kind("person"):
        born = nkb.number[p.name]
        for y in _years(rng, born + 5):
            out.append(
                Question("age_in", f"How old was {p.name} in {y}?", y - born, (p.name,), f"{y} - {born}")
            )
    return out


def _company_age(nkb: NumericKB, rng: random.Random) -> list[Question]:
    out = []
    for c in nkb.kb.of_kind("company"):
        founded = nkb.number[c.name]
        for y in _years(rng, founded + 1):
            q = f"How old was {c.name} in {y}?"
            out.append(Question("company_age", q, y - founded, (c.name,), f"{y} - {founded}"))
    return out


def _population_growth(nkb: NumericKB, rng: random.Random) -> list[Question]:
    out = []
    for c in nkb.kb.of_kind("city"):
        people = nkb.number[c.name]
        for n in sorted(rng.sample(range(1000, 10000, 1000), _YEARS_PER_ENTITY)):
            q = f"How many people will live in {c.name} after {n} more move there?"
            out.append(Question("population_growth", q, people + n, (c.name,), f"{people} + {n}"))
    return out


def _founder_age(nkb: NumericKB, rng: random.Random) -> list[Question]:
    out = []
    for c in nkb.kb.of_kind("company"):
        founder = c.relations["founded_by"]
        founded, born = nkb.number[c.name], nkb.number[founder]
        q = f"How old was the founder of {c.name} when it was founded?"
        out.append(Question("founder_age", q, founded - born, (c.name, founder), f"{founded} - {born}"))
    return out


def _mayor_age_in(nkb: NumericKB, rng: random.Random) -> list[Question]:
    out = []
    for c in nkb.kb.of_kind("city"):
        mayor = c.relations["mayor"]
        born = nkb.number[mayor]
        for y in _years(rng, born + 5):
            q = f"How old was the mayor of {c.name} in {y}?"
            out.append(Question("mayor_age_in", q, y - born, (c.name, mayor), f"{y} - {born}"))
    return out


def _pairs(rng: random.Random, names: list[str], ok: Callable[[str, str], bool]) -> list[tuple[str, str]]:
    seen: set[tuple[str, str]] = set()
    for _ in range(_PAIRS * 4):
        a, b = rng.sample(names, 2)
        if ok(a, b) and (a, b) not in seen and (b, a) not in seen:
            seen.add((a, b))
        if len(seen) >= _PAIRS:
            break
    return sorted(seen)


def _age_gap(nkb: NumericKB, rng: random.Random) -> list[Question]:
    people = [p.name for p in nkb.kb.of_kind("person")]
    out = []
    for a, b in _pairs(rng, people, lambda a, b: nkb.number[a] < nkb.number[b]):
        ya, yb = nkb.number[a], nkb.number[b]
        q = f"How many years older is {a} than {b}?"
        out.append(Question("age_gap", q, yb - ya, (a, b), f"{yb} - {ya}"))
    return out


def _population_sum(nkb: NumericKB, rng: random.Random) -> list[Question]:
    cities = [c.name for c in nkb.kb.of_kind("city")]
    out = []
    for a, b in _pairs(rng, cities, lambda a, b: True):
        pa, pb = nkb.number[a], nkb.number[b]
        q = f"How many people live in {a} and {b} together?"
        out.append(Question("population_sum", q, pa + pb, (a, b), f"{pa} + {pb}"))
    return out


# kind -> (searches it needs, generator of every candidate question of that kind)
KINDS: dict[str, tuple[int, Callable[[NumericKB, random.Random], list[Question]]]] = {
    "age_in": (1, _age_in),
    "company_age": (1, _company_age),
    "population_growth": (1, _population_growth),
    "founder_age": (2, _founder_age),
    "mayor_age_in": (2, _mayor_age_in),
    "age_gap": (2, _age_gap),
    "population_sum": (2, _population_sum),
}


def candidates(nkb: NumericKB, seed: int, max_searches: int) -> dict[str, list[Question]]:
    """Every candidate question of each kind needing at most ``max_searches`` searches (kind order;
    deterministic in ``seed``)."""
    out = {}
    for kind, (searches, make) in KINDS.items():
        if searches <= max_searches:
            out[kind] = make(nkb, random.Random(f"search-calc/{seed}/{kind}"))
    return out


def _year(question: str) -> int:
    return int(question.rstrip("?").rsplit(" ", 1)[1])


def recompute(kind: str, question: str, searches: list[str], passage: Callable[[str], str]) -> int:
    """The answer of a question computed again from the passages of its searched names alone
    (``passage(name)`` gives a name's passage text): the facts read back with the passage patterns."""

    def fact(name: str, what: str) -> int:
        value = read_fact(passage(name), name, what)
        if value is None:
            raise ValueError(f"the passage of {name!r} states no {what} fact")
        return value

    if kind == "age_in":
        return _year(question) - fact(searches[0], "person")
    if kind == "company_age":
        return _year(question) - fact(searches[0], "company")
    if kind == "population_growth":
        return fact(searches[0], "city") + int(question.split(" after ")[1].split(" ")[0])
    if kind == "founder_age":
        return fact(searches[0], "company") - fact(searches[1], "person")
    if kind == "mayor_age_in":
        return _year(question) - fact(searches[1], "person")
    if kind == "age_gap":
        return fact(searches[1], "person") - fact(searches[0], "person")
    if kind == "population_sum":
        return fact(searches[0], "city") + fact(searches[1], "city")
    raise ValueError(f"unknown question kind {kind!r}")
