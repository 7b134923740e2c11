"""A generated knowledge base: people, cities, companies and countries, one short passage each.

Every entity has a kind, a short unique name and one target per relation of its kind (all relations
are functions, so every question has one answer):

- person: ``born_in`` a city, ``works_for`` a company (and a job, a distractor attribute)
- company: ``founded_by`` a person, ``based_in`` a city (and an industry)
- city: ``country`` (a country), ``mayor`` (a person)
- country: ``capital`` (one of its own cities)

Its passage is one sentence that states all of them ("Ava Lin is a baker born in Tamo who works for
Bolt Co."), titled by the entity's name. Names are built from short syllables and words so that a
1024-token BPE vocabulary covers them in a few tokens. The same ``seed`` and ``n_entities`` always give
the same knowledge base (a private ``random.Random``).

It does not generate questions (``generator.py``) and does not index anything (``index.py``).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

import polars as pl

__all__ = ["RELATIONS", "Entity", "KnowledgeBase", "Relation", "generate_kb"]

_FIRST = [
    "Ava",
    "Ben",
    "Cal",
    "Dax",
    "Eli",
    "Fay",
    "Gus",
    "Hal",
    "Ida",
    "Jon",
    "Kai",
    "Lea",
    "Max",
    "Ned",
    "Oli",
    "Pam",
    "Quin",
    "Rex",
    "Sam",
    "Tia",
    "Uma",
    "Val",
    "Wes",
    "Zoe",
]
_LAST = [
    "Lin",
    "Kim",
    "Ross",
    "Park",
    "Hale",
    "Cole",
    "Dunn",
    "Fox",
    "Gray",
    "Hart",
    "Lowe",
    "Moss",
    "Nash",
    "Page",
    "Reed",
    "Shaw",
    "Tate",
    "Vance",
    "West",
    "York",
]
_CITY_A = ["Ta", "Ri", "Mo", "Ve", "Lu", "Ka", "No", "Si", "Be", "Do", "Fa", "Pe", "Zu", "Ha", "Gi", "Ro"]
_CITY_B = ["mo", "vo", "ra", "len", "dor", "ba", "nik", "sa", "lo", "tir", "mek", "pol"]
_COUNTRY = [
    "Ald",
    "Bor",
    "Cas",
    "Del",
    "Esk",
    "Fen",
    "Gal",
    "Hol",
    "Irn",
    "Jor",
    "Kes",
    "Lor",
    "Mar",
    "Nor",
    "Ost",
    "Par",
]
_COUNTRY_END = ("ia", "land", "ar")
_BRAND = [
    "Bolt",
    "Apex",
    "Nova",
    "Pine",
    "Echo",
    "Flux",
    "Iron",
    "Jade",
    "Kite",
    "Lime",
    "Mint",
    "Onyx",
    "Peak",
    "Ruby",
    "Sage",
    "Tide",
    "Vale",
    "Wolf",
    "Zinc",
    "Arc",
    "Bloom",
    "Cliff",
    "Dune",
    "Fern",
    "Glow",
    "Hive",
    "Lark",
    "Moon",
    "Oak",
    "Reef",
]
_BRAND_END = ("Co", "Labs", "Works", "Group")
_JOBS = ["baker", "painter", "doctor", "farmer", "pilot", "singer", "teacher", "writer"]
_INDUSTRIES = ["toy", "food", "steel", "car", "game", "bank", "tea", "ship"]
# Share of each kind in n_entities (countries get at least 2, the rest at least 1 each).
_SHARES = {"person": 0.4, "company": 0.25, "city": 0.25, "country": 0.1}


@dataclass(frozen=True)
class Relation:
    source: str  # kind of the entity it starts from
    target: str  # kind of the entity it points to
    noun: str  # "the {noun} of X" names the target in a longer question
    question: str  # the question asking for the target of {x}


RELATIONS: dict[str, Relation] = {
    "born_in": Relation("person", "city", "birthplace", "Where was {x} born?"),
    "works_for": Relation("person", "company", "employer", "Which company does {x} work for?"),
    "founded_by": Relation("company", "person", "founder", "Who founded {x}?"),
    "based_in": Relation("company", "city", "home city", "In which city is {x} based?"),
    "country": Relation("city", "country", "country", "In which country is {x}?"),
    "mayor": Relation("city", "person", "mayor", "Who is the mayor of {x}?"),
    "capital": Relation("country", "city", "capital", "What is the capital of {x}?"),
}


@dataclass(frozen=True)
class Entity:
    name: str
    kind: str
    relations: dict[str, str] = field(default_factory=dict)  # relation -> target entity name
    attribute: str = ""  # job (person) or industry (company)

    def passage(self) -> str:
        r, n = self.relations, self.name
        if self.kind == "person":
            return f"{n} is a {self.attribute} born in {r['born_in']} who works for {r['works_for']}."
        if self.kind == "company":
            return f"{n} is a {self.attribute} company in {r['based_in']} founded by {r['founded_by']}."
        if self.kind == "city":
            return f"{n} is a city in {r['country']} whose mayor is {r['mayor']}."
        return f"{n} is a country whose capital is {r['capital']}."


@dataclass(frozen=True)
class KnowledgeBase:
    entities: dict[str, Entity]  # by name, in generation order

    def passages(self) -> pl.DataFrame:
        """One passage per entity: ``id`` (``kb-<n>``), ``title`` (the name), ``text``."""
        rows = [
            {"id": f"kb-{i:05d}", "title": e.name, "text": e.passage()}
            for i, e in enumerate(self.entities.values())
        ]
        return pl.DataFrame(rows, schema={"id": pl.String, "title": pl.String, "text": pl.String})

    def of_kind(self, kind: str) -> list[Entity]:
        return [e for e in self.entities.values() if e.kind == kind]


def _counts(n_entities: int) -> dict[str, int]:
    counts = {k: max(int(n_entities * s), 1) for k, s in _SHARES.items()}
    counts["country"] = max(counts["country"], 2)
    counts["person"] += n_entities - sum(counts.values())  # the rounding remainder goes to people
    return counts


def _names(rng: random.Random, pool: list[str], n: int, kind: str, n_entities: int) -> list[str]:
    if n > len(pool):
        raise ValueError(
            f"n_entities={n_entities} needs {n} {kind} names but only {len(pool)} exist; lower n_entities"
        )
    return rng.sample(pool, n)


def generate_kb(seed: int, n_entities: int) -> KnowledgeBase:
    """A knowledge base of ``n_entities`` entities (at least 8), deterministic in ``seed``."""
    if n_entities < 8:
        raise ValueError(f"n_entities must be >= 8, got {n_entities}")
    rng = random.Random(f"search-kb/{seed}")
    counts = _counts(n_entities)
    people = _names(
        rng, [f"{a} {b}" for a, b in itertools.product(_FIRST, _LAST)], counts["person"], "person", n_entities
    )
    cities = _names(
        rng, [a + b for a, b in itertools.product(_CITY_A, _CITY_B)], counts["city"], "city", n_entities
    )
    companies = _names(
        rng,
        [f"{a} {b}" for a, b in itertools.product(_BRAND, _BRAND_END)],
        counts["company"],
        "company",
        n_entities,
    )
    countries = _names(
        rng,
        [a + b for a, b in itertools.product(_COUNTRY, _COUNTRY_END)],
        counts["country"],
        "country",
        n_entities,
    )
    # Every country gets at least one city (its capital is drawn from its own cities).
    city_country = {
        c: countries[i] if i < len(countries) else rng.choice(countries) for i, c in enumerate(cities)
    }
    entities: dict[str, Entity] = {}
    for name in people:
        entities[name] = Entity(
            name,
            "person",
            {"born_in": rng.choice(cities), "works_for": rng.choice(companies)},
            rng.choice(_JOBS),
        )
    for name in companies:
        entities[name] = Entity(
            name,
            "company",
            {"founded_by": rng.choice(people), "based_in": rng.choice(cities)},
            rng.choice(_INDUSTRIES),
        )
    for name in cities:
        entities[name] = Entity(name, "city", {"country": city_country[name], "mayor": rng.choice(people)})
    for name in countries:
        own = sorted(c for c, k in city_country.items() if k == name)
        entities[name] = Entity(name, "country", {"capital": rng.choice(own)})
    return KnowledgeBase(entities)
