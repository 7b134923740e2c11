"""Numeric facts on top of the search task's generated knowledge base.

The search task's knowledge base (``components.tasks.search.kb``) names people, companies, cities and
countries and links them; this module gives three kinds of them a number, drawn from its own random
stream (so the names and links are exactly the search task's for the same seed):

- a person: the year born, 1940..1999 ("Ava Lin was born in 1984.");
- a company: the year founded, 20..60 years after its founder was born and at most 2024 ("Bolt Co
  was founded in 2011.");
- a city: its population, a multiple of 1000 from 10000 to 99000 ("Tamo has 47000 people.").

A passage is the search task's sentence followed by the fact's sentence, titled by the entity's name;
countries keep their passage as it is. Questions (``questions.py``) are computed from these numbers,
and the passages state them, so what a search returns is all a solver needs.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import polars as pl

from components.tasks.search.kb import KnowledgeBase, generate_kb

__all__ = ["FIRST_YEAR", "LAST_YEAR", "NumericKB", "generate_numeric_kb", "read_fact"]

FIRST_YEAR, LAST_YEAR = 1940, 2024
_FACT = {
    "person": ("{name} was born in {value}.", r"(?:^|\. ){name} was born in (\d+)\."),
    "company": ("{name} was founded in {value}.", r"(?:^|\. ){name} was founded in (\d+)\."),
    "city": ("{name} has {value} people.", r"(?:^|\. ){name} has (\d+) people\."),
}


@dataclass(frozen=True)
class NumericKB:
    kb: KnowledgeBase
    number: dict[str, int]  # entity name -> its fact (year born, year founded or population)

    def passage(self, name: str) -> str:
        entity = self.kb.entities[name]
        text = entity.passage()
        if entity.kind in _FACT:
            text += " " + _FACT[entity.kind][0].format(name=name, value=self.number[name])
        return text

    def passages(self) -> pl.DataFrame:
        """One passage per entity: ``id`` (``kb-<n>``), ``title`` (the name), ``text``."""
        rows = [
            {"id": f"kb-{i:05d}", "title": n, "text": self.passage(n)} for i, n in enumerate(self.kb.entities)
        ]
        return pl.DataFrame(rows, schema={"id": pl.String, "title": pl.String, "text": pl.String})


def read_fact(text: str, name: str, kind: str) -> int | None:
    """The number a passage ``text`` states about ``name`` of ``kind`` (None if it states none)."""
    match = re.search(_FACT[kind][1].format(name=re.escape(name)), text)
    return int(match.group(1)) if match else None


def generate_numeric_kb(seed: int, n_entities: int) -> NumericKB:
    """The search task's knowledge base for (``seed``, ``n_entities``) with a number per person,
    company and city (deterministic in ``seed``)."""
    kb = generate_kb(seed, n_entities)
    rng = random.Random(f"search-calc-facts/{seed}")
    number: dict[str, int] = {}
    for e in kb.of_kind("person"):
        number[e.name] = rng.randint(FIRST_YEAR, 1999)
    for e in kb.of_kind("company"):
        born = number[e.relations["founded_by"]]
        number[e.name] = rng.randint(born + 20, min(born + 60, LAST_YEAR))
    for e in kb.of_kind("city"):
        number[e.name] = rng.randint(10, 99) * 1000
    return NumericKB(kb, number)
