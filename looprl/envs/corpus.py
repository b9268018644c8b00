"""A deterministic synthetic encyclopedia (fictional people, places, organisations) with QA pairs.

The world is invented from a seed, so no model can answer from pre-training: it has to search.
Facts are linked across documents (a person was born in a city, a city lies in a country, an
organisation was founded by a person and sits in a city), which gives 1-hop questions (one
document holds the answer) and 2-hop questions (the answer needs two documents). A document
never repeats a fact of another entity that would let a 2-hop question be answered from one
page: a person's page does not list what they founded, a city's page lists no people.

Questions are split by the entity they start from: all questions about an entity belong to the
eval split exactly when a hash of that entity's id falls in the eval bucket, so the splits never
share a question and never ask about the same subject.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

from looprl import split_of as hash_split

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "th", "vh"]  # fmt: skip
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "rk", "nd", "sk"]
_PROFESSIONS = ["cartographer", "composer", "botanist", "engineer", "astronomer", "sculptor", "physician", "linguist", "architect", "chemist", "poet", "navigator"]  # fmt: skip
_ORG_KINDS = ["Institute", "Guild", "Society", "Company", "Observatory", "Academy", "Foundation", "Orchestra"]  # fmt: skip
_REGIONS = ["northern", "southern", "eastern", "western", "central", "coastal"]
_WORKS = [
    "a survey of the salt marshes",
    "the Lantern Cycle of songs",
    "a treatise on river tides",
    "a catalogue of night flowers",
    "the first map of the inland lakes",
    "a theory of bell resonance",
    "a bridge of woven iron",
    "a dictionary of mountain dialects",
]
_CITY_TRAITS = [
    "its covered markets",
    "a bell tower older than the city walls",
    "its glass workshops",
    "a harbour of painted boats",
    "terraced vineyards",
    "an annual lantern festival",
]


@dataclass(frozen=True)
class Document:
    """One encyclopedia page: a stable `id`, a `title` and the page `text`."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Question:
    """A question with its reference answer.

    `gold_doc_ids` are the pages that hold the facts needed (in hop order); `split` is `train`
    or `eval`; `hops` is 1 or 2; `kind` names the question template.
    """

    id: str
    question: str
    answer: str
    gold_doc_ids: tuple[str, ...] = ()
    split: str = "train"
    hops: int = 1
    kind: str = ""


@dataclass
class World:
    """The generated corpus and its questions."""

    documents: list[Document] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)


def split_of(key: str) -> str:
    """`eval` when a hash of `key` falls in the eval bucket, else `train` (stable across runs)."""
    return hash_split(f"search_qa:{key}")


class _Names:
    """Draws unique pronounceable invented names from a seeded generator."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: int, suffix: str = "") -> str:
        while True:
            parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(syllables)]
            name = ("".join(parts) + self.rng.choice(_CODAS) + suffix).capitalize()
            if name not in self.used and len(name) >= 4:
                self.used.add(name)
                return name


@dataclass(eq=False)
class _Entity:
    """One thing in the world; the links a kind does not use stay None."""

    key: str
    name: str
    doc: str = ""
    country: _Entity | None = None  # city: the country it lies in
    capital: _Entity | None = None  # country: its capital city
    city: _Entity | None = None  # person: birthplace; organisation: headquarters
    founder: _Entity | None = None  # organisation: the person who founded it
    year: int = 0  # person: birth year; organisation: founding year
    job: str = ""
    work: str = ""


def generate_world(
    seed: int = 0, *, countries: int = 8, cities: int = 40, people: int = 120, orgs: int = 50
) -> World:
    """Build the encyclopedia and its 1- and 2-hop questions; the same arguments give the same world."""
    if min(countries, cities, people, orgs) < 1 or cities < countries:
        raise ValueError(
            "generate_world needs >= 1 of each entity and at least as many cities as countries"
        )
    rng = random.Random(f"search_qa-world-{seed}")
    names = _Names(rng)
    suffixes = ["ia", "and", "ora", "esh"]
    country = [
        _Entity(f"country{i}", names.word(2, rng.choice(suffixes))) for i in range(countries)
    ]
    city = [
        _Entity(
            f"city{i}", names.word(2), country=country[i] if i < countries else rng.choice(country)
        )
        for i in range(cities)
    ]
    for i, c in enumerate(country):
        c.capital = city[i]
    person = [
        _Entity(
            f"person{i}",
            f"{names.word(2)} {names.word(rng.choice([2, 3]))}",
            city=rng.choice(city),
            year=rng.randint(1820, 1975),
            job=rng.choice(_PROFESSIONS),
            work=rng.choice(_WORKS),
        )
        for i in range(people)
    ]
    org = []
    for i in range(orgs):
        founder = rng.choice(person)
        name = f"{names.word(2)} {rng.choice(_ORG_KINDS)}"
        year = founder.year + rng.randint(22, 60)
        org.append(_Entity(f"org{i}", name, founder=founder, year=year, city=rng.choice(city)))
    entities = country + city + person + org
    order = list(range(len(entities)))
    rng.shuffle(order)  # doc ids say nothing about the entity type
    for doc_number, index in enumerate(order):
        entities[index].doc = f"doc{doc_number:04d}"
    docs = [_country_doc(c, rng) for c in country] + [_city_doc(c, rng) for c in city]
    docs += [_person_doc(p, rng) for p in person] + [_org_doc(o, rng) for o in org]
    docs.sort(key=lambda d: d.id)
    return World(documents=docs, questions=_questions(country, city, person, org))


def _link(entity: _Entity | None) -> _Entity:
    if entity is None:  # generate_world sets every link a kind uses
        raise ValueError("internal error: a world entity lacks a link")
    return entity


def _country_doc(c: _Entity, rng: random.Random) -> Document:
    text = (
        f"{c.name} is a country in the {rng.choice(_REGIONS)} part of the continent. "
        f"Its capital is {_link(c.capital).name}. It is governed by an elected council of "
        f"{rng.randint(12, 90)} members and is known for {rng.choice(_CITY_TRAITS)}."
    )
    return Document(c.doc, c.name, text)


def _city_doc(c: _Entity, rng: random.Random) -> Document:
    people = rng.randint(8, 900) * 1000
    text = (
        f"{c.name} is a city in {_link(c.country).name} with about {people} inhabitants. "
        f"It stands on the {_river(rng)} river and is known for {rng.choice(_CITY_TRAITS)}."
    )
    return Document(c.doc, c.name, text)


def _river(rng: random.Random) -> str:
    """A short invented river name (not unique; rivers are not entities)."""
    return (
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(["l", "n", "ss", "r"]) + "e"
    ).capitalize()


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _person_doc(p: _Entity, rng: random.Random) -> Document:
    text = (
        f"{p.name} (born {p.year}) is {_article(p.job)} {p.job} born in the city of "
        f"{_link(p.city).name}. {p.name.split()[0]} is best known for {p.work}, completed after "
        f"{rng.randint(3, 20)} years of work."
    )
    return Document(p.doc, p.name, text)


def _org_doc(o: _Entity, rng: random.Random) -> Document:
    text = (
        f"The {o.name} was founded in {o.year} by {_link(o.founder).name}. Its headquarters are "
        f"in {_link(o.city).name}, and it has about {rng.randint(20, 3000)} members today."
    )
    return Document(o.doc, o.name, text)


def _questions(
    country: list[_Entity], city: list[_Entity], person: list[_Entity], org: list[_Entity]
) -> list[Question]:
    """Every 1- and 2-hop question of the world, split by the entity each one asks about."""
    rows: list[tuple[_Entity, str, str, str, tuple[_Entity, ...]]] = []  # subject, kind, q, a, gold
    for p in person:
        born = _link(p.city)
        rows.append((p, "birth_city", f"In which city was {p.name} born?", born.name, (p,)))
        rows.append((p, "birth_year", f"In what year was {p.name} born?", str(p.year), (p,)))
        rows.append((p, "profession", f"What is the profession of {p.name}?", p.job, (p,)))
        q = f"In which country was {p.name} born?"
        rows.append((p, "birth_country", q, _link(born.country).name, (p, born)))
    for c in city:
        q = f"In which country is the city of {c.name}?"
        rows.append((c, "city_country", q, _link(c.country).name, (c,)))
    for k in country:
        rows.append(
            (k, "capital", f"What is the capital of {k.name}?", _link(k.capital).name, (k,))
        )
    for o in org:
        f, hq = _link(o.founder), _link(o.city)
        rows.append((o, "founder", f"Who founded the {o.name}?", f.name, (o,)))
        rows.append(
            (o, "founding_year", f"In what year was the {o.name} founded?", str(o.year), (o,))
        )
        q = f"In which city was the founder of the {o.name} born?"
        rows.append((o, "founder_birth_city", q, _link(f.city).name, (o, f)))
        q = f"In what year was the founder of the {o.name} born?"
        rows.append((o, "founder_birth_year", q, str(f.year), (o, f)))
        q = f"In which country are the headquarters of the {o.name}?"
        rows.append((o, "hq_country", q, _link(hq.country).name, (o, hq)))
    out = []
    for subject, kind, question, answer, gold in rows:
        qid = f"sqa-{hashlib.sha256(question.encode()).hexdigest()[:12]}"
        docs = tuple(g.doc for g in gold)
        out.append(Question(qid, question, answer, docs, split_of(subject.key), len(gold), kind))
    return out
