"""A seeded fictional world whose questions can only be answered by searching its corpus.

The demo trains a small model to search: the facts of this world are made up (names built from
syllables, never real ones), so no pretrained model knows them and the answer has to come from
the retrieved paragraph. The world holds entities of four kinds:

- person:  born_in -> city, birth_year, occupation, employer -> company
- city:    country (a made-up name), population, founded
- company: industry, headquartered_in -> city, founded, founder -> person
- river:   length_km, flows_through -> city

The corpus has one encyclopedia-style paragraph per entity (Search-R1 format, '"Name"\\ntext')
stating every attribute, phrased by templates chosen with the seeded RNG; optional distractor
paragraphs mention entities without stating their facts. Questions (`Task`s, source
"synthetic") are of three kinds, like HotpotQA / 2Wiki:

- 1hop:       "In which city was Vorlen Masu born?"                       (one paragraph)
- 2hop:       "In which year was the city where Vorlen Masu was born founded?"  (bridge)
- comparison: "Who was born earlier, Vorlen Masu or Teska Dorin?"        (two paragraphs)

`Task.meta` = {"kind", "gold_titles", "hops"}; the answer is a list of aliases (numbers as
strings). Except for comparisons (whose answer is one of the two names asked about), the
answer never appears in the question. Same seed, same world.

    world = make_world(seed=0)
    world.save("data/synthetic")   # corpus.jsonl, train.jsonl, test.jsonl, entities.jsonl
    load_tasks("data/synthetic/train.jsonl", source="synthetic")  # QA rows -> Tasks
"""

from __future__ import annotations

import json
import os
import random
import re
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from seekrl.data.corpus import Document, read_corpus, write_corpus
from seekrl.types import Task

__all__ = ["Entity", "World", "make_world", "load_world", "KINDS", "ENTITY_KINDS", "STYLES", "WorldStyle", "BLOCKED_WORDS"]

KINDS = ("1hop", "2hop", "comparison")
ENTITY_KINDS = ("person", "city", "company", "river")
_SHARES = {"person": 0.4, "city": 0.25, "company": 0.2, "river": 0.15}

# Generated names must not be English words or real names (checked case-insensitively).
BLOCKED_WORDS = frozenset(
    """the and for are but not you all any can had her was one our out day get has him his how man
    new now old see two way who boy did its let put say she too use dad mom river city town water
    banana tomato potato manure lemon melon salad madam radar level civil rotor tenet kayak sonar
    solar polar lunar tuna pasta pizza sofa piano radio video comma drama llama panda karma lama
    dina dona moral coral total metal petal medal final vital hotel label camel canal fever river
    timber minor major motor tutor baker maker poker joker tiger sugar paper later water ever never
    maria paris sara tokyo lima roma dakota nero milan rita tina lola kobe osaka kara lena nina dana
    tara mona vera lisa anna elena sofia rosa luna mila kira tosa nara doha baku kiev riga sana lagos
    malta cuba peru china india korea kenya nepal samoa tonga benin sudan congo diver rider cider
    router louder souvenir doula reiki pouter mouser louver rouser bouquet toupee mousse coupon
    general mineral federal liberal numeral funeral monitor senator regular popular kimono karate
    bikini safari salami sonata pajama domino tornado token taken woken robot salon talon baron
    lemur humor rumor donor honor valor vapor razor manor tenor model modem novel bagel navel panel
    rebel pedal zebra dozen hazel louise louisa heidi keira reina seine beirut toulon toulouse
    moulin rouge""".split()
)

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "dr", "kr", "tr", "br", "sk")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ei", "ou", "ae")
_MARKS = ("ei", "ou", "ae")  # every name holds one: rare in English words, so names read as foreign
_CODAS = ("", "", "", "", "n", "r", "l", "th", "k", "m")

OCCUPATIONS = ("astronomer", "painter", "engineer", "cartographer", "physician", "composer", "architect",
               "botanist", "sculptor", "merchant", "poet", "historian", "chemist", "weaver", "navigator")
INDUSTRIES = ("shipbuilding", "textile", "mining", "publishing", "brewing", "glassmaking", "railway",
              "pharmaceutical", "clockmaking", "shipping", "timber", "insurance")


@dataclass
class Entity:
    """One thing in the world. Entity-valued attributes hold the target entity's name."""

    name: str
    kind: str  # person | city | company | river
    attrs: dict = field(default_factory=dict)

    @property
    def short(self) -> str:
        """The last name of a person, else the name (used for varied phrasing)."""
        return self.name.split()[-1]


@dataclass
class World:
    entities: list[Entity]
    documents: list[Document]
    train: list[Task]
    test: list[Task]

    def entity(self, name: str) -> Entity:
        return next(e for e in self.entities if e.name == name)

    def save(self, path: str | os.PathLike) -> Path:
        """corpus.jsonl (Search-R1), train.jsonl / test.jsonl (QA rows), entities.jsonl."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        write_corpus(self.documents, path / "corpus.jsonl")
        for split, tasks in (("train", self.train), ("test", self.test)):
            with open(path / f"{split}.jsonl", "w", encoding="utf-8") as f:
                for t in tasks:
                    f.write(json.dumps(_task_row(t), ensure_ascii=False) + "\n")
        with open(path / "entities.jsonl", "w", encoding="utf-8") as f:
            for e in self.entities:
                f.write(json.dumps(asdict(e), ensure_ascii=False) + "\n")
        return path


def _task_row(t: Task) -> dict:
    """A QA row that `load_tasks` (converter "qa") turns back into this Task (with its source)."""
    return {"id": t.id, "question": t.prompt[-1]["content"], "answer": list(t.answer), **t.meta}


def _row_task(row: dict) -> Task:
    meta = {k: row[k] for k in ("kind", "gold_titles", "hops")}
    return Task(id=row["id"], prompt=[{"role": "user", "content": row["question"]}], answer=list(row["answer"]),
                source="synthetic", meta=meta)


def load_world(path: str | os.PathLike) -> World:
    """Read back a folder written by `World.save`."""
    path = Path(path)

    def rows(name: str) -> list[dict]:
        with open(path / name, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    return World(
        entities=[Entity(**r) for r in rows("entities.jsonl")],
        documents=read_corpus(path / "corpus.jsonl"),
        train=[_row_task(r) for r in rows("train.jsonl")],
        test=[_row_task(r) for r in rows("test.jsonl")],
    )


# ----------------------------------------------------------------------------- names


class _Namer:
    """Unique pronounceable words from syllables; no English word, no real name, no repeats."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def word(self, syllables: tuple[int, int] = (2, 3)) -> str:
        while True:
            n = self.rng.randint(*syllables)
            parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(n)]
            w = "".join(parts) + self.rng.choice(_CODAS)
            # at least 5 letters; no final "s"-like endings the stemmer would strip
            if (len(w) < 5 or w in self.used or w in BLOCKED_WORDS or not any(m in w for m in _MARKS)
                    or w.endswith(("ing", "ed", "ly", "s"))):
                continue
            self.used.add(w)
            return w.capitalize()


def _article(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _fmt(attr: str, value) -> str:
    return f"{value:,}" if attr in ("population", "length_km") else str(value)


def _aliases(attr: str, value) -> list[str]:
    return list(dict.fromkeys([_fmt(attr, value), str(value)]))


# ----------------------------------------------------------------------------- entities


def _make_entities(rng: random.Random, namer: _Namer, n_entities: int) -> list[Entity]:
    counts = {k: max(2, round(n_entities * s)) for k, s in _SHARES.items()}
    counts["person"] += n_entities - sum(counts.values())  # exact total
    countries = [namer.word() for _ in range(max(3, counts["city"] // 5))]
    cities = []
    for _ in range(counts["city"]):
        attrs = {"country": rng.choice(countries), "population": rng.randrange(2_000, 900_000, 10),
                 "founded": rng.randint(800, 1650)}  # cities are older than anyone born in them
        cities.append(Entity(namer.word(), "city", attrs))
    people = []
    for _ in range(counts["person"]):
        attrs = {"born_in": rng.choice(cities).name, "birth_year": rng.randint(1750, 1990),
                 "occupation": rng.choice(OCCUPATIONS)}
        people.append(Entity(f"{namer.word((2, 2))} {namer.word((2, 2))}", "person", attrs))
    companies = []
    for _ in range(counts["company"]):
        founder = rng.choice(people)  # founds the company as an adult
        attrs = {"industry": rng.choice(INDUSTRIES), "headquartered_in": rng.choice(cities).name,
                 "founded": min(2015, founder.attrs["birth_year"] + rng.randint(25, 55)), "founder": founder.name}
        companies.append(Entity(namer.word(), "company", attrs))
    for p in people:
        p.attrs["employer"] = rng.choice(companies).name
    rivers = []
    for _ in range(counts["river"]):
        attrs = {"length_km": rng.randint(40, 3000), "flows_through": rng.choice(cities).name}
        rivers.append(Entity(namer.word(), "river", attrs))
    return people + cities + companies + rivers


# ----------------------------------------------------------------------------- paragraphs

# One list of templates per fact; {n} name, {s} short name, {v} value (or {c}/{y} for combined).
_SENTENCES = {
    ("person", "occupation"): ["{n} was {v}.", "{n} worked as {v}.", "{n} was {v} by profession."],
    ("person", "born_in"): [
        "{n} was born in {v}.",
        "{s} was a native of {v}.",
        "{n}'s birthplace was the city of {v}.",
    ],
    ("person", "birth_year"): [
        "{s} was born in {v}.",
        "{n} was born in the year {v}.",
        "The year of {s}'s birth was {v}.",
    ],
    ("person", "birth"): ["{n} was born in {c} in {y}.", "Born in {y} in {c}, {s} grew up there."],
    ("person", "employer"): [
        "{s} worked for {v}.",
        "{n} was employed by {v}.",
        "For most of a long career, {s} worked at {v}.",
    ],
    ("city", "country"): [
        "{n} is a city in {v}.",
        "{n} is a town in the country of {v}.",
        "The city of {n} lies in {v}.",
    ],
    ("city", "population"): [
        "{n} has a population of {v}.",
        "About {v} people live in {n}.",
        "The population of {n} is {v}.",
    ],
    ("city", "founded"): [
        "{n} was founded in {v}.",
        "The city was founded in {v}.",
        "{n} dates back to its founding in {v}.",
    ],
    ("company", "industry"): [
        "{n} is {v} company.",
        "{n} is a company in the {w} industry.",
        "{n} is a firm in the {w} trade.",
    ],
    ("company", "headquartered_in"): [
        "{n} is headquartered in {v}.",
        "The company's headquarters are in {v}.",
        "{n} has its head office in {v}.",
    ],
    ("company", "founded"): [
        "{n} was founded in {v}.",
        "The company was established in {v}.",
        "{n} has been in business since {v}.",
    ],
    ("company", "founder"): ["It was founded by {v}.", "{v} founded {n}.", "The founder of {n} was {v}."],
    ("company", "origin"): ["{n} was founded by {p} in {y}.", "In {y}, {p} founded {n}."],
    ("river", "length_km"): [
        "The {n} is a river {v} kilometres long.",
        "The {n} river has a length of {v} kilometres.",
        "{n} is a river that runs for {v} kilometres.",
    ],
    ("river", "flows_through"): [
        "It flows through the city of {v}.",
        "The {n} passes through {v}.",
        "{v} lies on the banks of the {n}.",
    ],
}
_INTRO = {"person": "occupation", "city": "country", "company": "industry", "river": "length_km"}

# style="plain": one sentence per fact, always the same, in a fixed order, with the full name and
# the words the questions ask with ("born in the city of", "founded in the year"). Reading the
# answer out of such a paragraph is within reach of a tiny model trained from scratch (the demo).
_PLAIN = {
    ("person", "occupation"): "{n} was {v}.",
    ("person", "born_in"): "{n} was born in the city of {v}.",
    ("person", "birth_year"): "{n} was born in the year {v}.",
    ("person", "employer"): "{n} worked for the company {v}.",
    ("city", "country"): "{n} is a city in the country of {v}.",
    ("city", "population"): "The population of {n} is {v}.",
    ("city", "founded"): "{n} was founded in the year {v}.",
    ("company", "industry"): "{n} is a company in the {v} industry.",
    ("company", "headquartered_in"): "{n} is headquartered in the city of {v}.",
    ("company", "founded"): "{n} was founded in the year {v}.",
    ("company", "founder"): "{n} was founded by {v}.",
    ("river", "length_km"): "The {n} is a river {v} kilometres long.",
    ("river", "flows_through"): "The {n} flows through the city of {v}.",
}
WorldStyle = Literal["varied", "plain"]  # the `demo.world_style` values
STYLES: tuple[str, ...] = typing.get_args(WorldStyle)


def _say(rng: random.Random, e: Entity, fact: str, **kw) -> str:
    return rng.choice(_SENTENCES[(e.kind, fact)]).format(n=e.name, s=e.short, **kw)


def _paragraph(rng: random.Random, e: Entity, style: str = "varied") -> str:
    a, facts = e.attrs, []
    if style == "plain":
        return " ".join(_PLAIN[(e.kind, k)].format(n=e.name, v=_article(v) if k == "occupation" else _fmt(k, v))
                        for k, v in a.items())
    intro = _INTRO[e.kind]
    v = _fmt(intro, a[intro])
    first = _say(rng, e, intro, v=_article(v) if e.kind in ("person", "company") else v, w=v)
    rest = [k for k in a if k != intro]
    if e.kind == "person" and rng.random() < 0.5:
        facts.append(_say(rng, e, "birth", c=a["born_in"], y=a["birth_year"]))
        rest = [k for k in rest if k not in ("born_in", "birth_year")]
    if e.kind == "company" and rng.random() < 0.5:
        facts.append(_say(rng, e, "origin", p=a["founder"], y=a["founded"]))
        rest = [k for k in rest if k not in ("founder", "founded")]
    facts += [_say(rng, e, k, v=_fmt(k, a[k])) for k in rest]
    rng.shuffle(facts)
    return " ".join([first] + facts)


def _distractor(rng: random.Random, namer: _Namer, entities: list[Entity]) -> tuple[str, str]:
    """A paragraph that names two entities but states none of their facts."""
    a, b = rng.sample(entities, 2)
    title = f"Treaty of {namer.word()}"
    year = rng.randint(1500, 1950)
    text = (f"The {title} was signed in {year}. Chroniclers mention {a.name} and {b.name} among those "
            f"who heard of it, though neither took part in the negotiations.")
    return title, text


# ----------------------------------------------------------------------------- questions

# How to ask for a fact about a subject phrase {x} (a name, or a description of a bridge entity)
_ASK = {
    ("person", "born_in"): ["In which city was {x} born?", "What is the birthplace of {x}?"],
    ("person", "birth_year"): ["In which year was {x} born?", "When was {x} born?"],
    ("person", "occupation"): ["What was the occupation of {x}?", "What did {x} work as?"],
    ("person", "employer"): ["Which company did {x} work for?", "Who employed {x}?"],
    ("city", "country"): ["In which country is {x}?", "Which country is {x} located in?"],
    ("city", "population"): ["What is the population of {x}?", "How many people live in {x}?"],
    ("city", "founded"): ["In which year was {x} founded?", "When was {x} founded?"],
    ("company", "industry"): ["In which industry is {x}?", "What industry does {x} work in?"],
    ("company", "headquartered_in"): ["In which city is {x} headquartered?", "Where are the headquarters of {x}?"],
    ("company", "founded"): ["In which year was {x} founded?", "When was {x} established?"],
    ("company", "founder"): ["Who founded {x}?", "Who was the founder of {x}?"],
    ("river", "length_km"): ["How long, in kilometres, is {x}?", "What is the length in kilometres of {x}?"],
    ("river", "flows_through"): ["Through which city does {x} flow?", "Which city lies on {x}?"],
}
# Subject phrase for an entity asked about directly (1-hop) ...
_NAMED = {"person": "{n}", "city": "the city of {n}", "company": "the company {n}", "river": "the {n} river"}
# ... and for the entity that a relation of an anchor points to (the bridge of a 2-hop question).
_VIA = {
    ("person", "born_in"): "the city where {n} was born",
    ("person", "employer"): "the company {n} worked for",
    ("company", "headquartered_in"): "the city where {n} is headquartered",
    ("company", "founder"): "the founder of {n}",
    ("river", "flows_through"): "the city the {n} river flows through",
}
# Comparisons: (kind, attr, question, pick smaller value?)
_COMPARE = [
    ("person", "birth_year", "Who was born earlier, {a} or {b}?", True),
    ("person", "birth_year", "Who was born later, {a} or {b}?", False),
    ("city", "founded", "Which city was founded earlier, {a} or {b}?", True),
    ("city", "population", "Which city has more inhabitants, {a} or {b}?", False),
    ("company", "founded", "Which company is older, {a} or {b}?", True),
    ("river", "length_km", "Which river is longer, {a} or {b}?", False),
]


def _hop(e: Entity, attr: str) -> dict:
    return {"entity": e.name, "relation": attr, "value": str(e.attrs[attr])}


def _one_hop(rng, by_name, e: Entity):
    for attr in e.attrs:
        q = rng.choice(_ASK[(e.kind, attr)]).format(x=_NAMED[e.kind].format(n=e.name))
        yield q, _aliases(attr, e.attrs[attr]), [e.name], [_hop(e, attr)]


def _two_hop(rng, by_name, e: Entity):
    for (kind, rel), phrase in _VIA.items():
        if kind != e.kind:
            continue
        bridge = by_name[e.attrs[rel]]
        for attr in bridge.attrs:
            if bridge.attrs[attr] == e.name:  # "who founded the company X worked for?" -> X
                continue
            q = rng.choice(_ASK[(bridge.kind, attr)]).format(x=phrase.format(n=e.name))
            yield q, _aliases(attr, bridge.attrs[attr]), [e.name, bridge.name], [_hop(e, rel), _hop(bridge, attr)]


def _comparisons(rng, entities: list[Entity], n: int):
    out, tries = [], 0
    while len(out) < n and tries < 20 * n:
        tries += 1
        kind, attr, template, smaller = rng.choice(_COMPARE)
        pool = [e for e in entities if e.kind == kind]
        a, b = rng.sample(pool, 2)
        if a.attrs[attr] == b.attrs[attr]:
            continue
        win = min((a, b), key=lambda e: e.attrs[attr]) if smaller else max((a, b), key=lambda e: e.attrs[attr])
        out.append((template.format(a=a.name, b=b.name), [win.name], [a.name, b.name], [_hop(a, attr), _hop(b, attr)]))
    return out


def _leaks(question: str, answer: list[str]) -> bool:
    return any(re.search(rf"(?<!\w){re.escape(a)}(?!\w)", question, re.IGNORECASE) for a in answer)


def make_world(
    seed: int = 0,
    n_entities: int = 120,
    n_questions: int = 600,
    test_fraction: float = 0.2,
    kinds: tuple[str, ...] = KINDS,
    n_distractors: int = 0,
    style: str = "varied",
) -> World:
    """A world of `n_entities` entities, their paragraphs (+ `n_distractors`), and about
    `n_questions` questions split evenly over `kinds` (fewer when a kind runs out of distinct
    questions), split into train/test by question. Deterministic for a seed. `style` "varied"
    phrases each fact with one of several templates in a shuffled order; "plain" states the
    facts in one fixed sentence each, in a fixed order (the same entities and facts)."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown question kinds {unknown}; choose from {', '.join(KINDS)}")
    if style not in STYLES:
        raise ValueError(f"unknown world style {style!r}; choose from {', '.join(STYLES)}")
    if n_entities < 12:
        raise ValueError(f"n_entities must be at least 12, got {n_entities}")
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    rng = random.Random(f"synthetic-world-{seed}")
    namer = _Namer(rng)
    entities = _make_entities(rng, namer, n_entities)
    by_name = {e.name: e for e in entities}
    texts = [(e.name, _paragraph(rng, e, style)) for e in entities]
    texts += [_distractor(rng, namer, entities) for _ in range(n_distractors)]
    documents = [Document.from_title_text(str(i), t, x) for i, (t, x) in enumerate(texts)]

    per_kind = [n_questions // len(kinds) + (i < n_questions % len(kinds)) for i in range(len(kinds))]
    seen: set[str] = set()
    questions: list[tuple[str, str, list, list, list]] = []
    for kind, n in zip(kinds, per_kind):
        if kind == "comparison":
            pool = _comparisons(rng, entities, 3 * n)
        else:
            gen = _one_hop if kind == "1hop" else _two_hop
            pool = [x for e in entities for x in gen(rng, by_name, e)]
        rng.shuffle(pool)
        taken = 0
        for q, answer, gold, hops in pool:
            if taken == n:
                break
            if q in seen or (kind != "comparison" and _leaks(q, answer)):
                continue
            seen.add(q)
            questions.append((kind, q, answer, gold, hops))
            taken += 1
    rng.shuffle(questions)
    tasks = [
        Task(id=f"synthetic-{seed}-{i}", prompt=[{"role": "user", "content": q}], answer=answer,
             source="synthetic", meta={"kind": kind, "gold_titles": gold, "hops": hops})
        for i, (kind, q, answer, gold, hops) in enumerate(questions)
    ]
    n_test = round(len(tasks) * test_fraction)
    return World(entities=entities, documents=documents, train=tasks[n_test:], test=tasks[:n_test])
