"""Generate the small offline corpus and QA set shipped in data/ (seeded, deterministic).

    python -m recipes.deep_research.make_data --seed 0 --out recipes/deep_research/data
    python -m recipes.deep_research.make_data --seed 0 --train 280 --test 140 --prefix learn_

A fictional world -- people, towns and companies with made-up names and attributes -- so that no
model knows the answers and they can only be found by searching the corpus. 200 short
documents (100 people ``pNNN``, 50 towns ``tNNN``, 50 companies ``cNNN``) and questions that
need one document (``hops: 1``: "In which town was X born?") or two (``hops: 2``: "In which
town was the founder of Y born?" needs Y's document to find the founder, then the founder's).
Each question row records the documents that answer it (``support``); train and test share
none (``data.canonical_key``), so no held-out answer is in a training question's documents.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from kernel.buffer import write_jsonl
from recipes.deep_research.data import canonical_key

# fmt: off
SYLLABLES = (
    "ka", "lo", "mi", "ren", "dor", "vel", "sha", "tum", "bri", "zan", "ol", "quo", "fen", "ish",
    "gar", "ny", "pel", "tor", "wex", "ul", "mar", "sel", "vin", "ad", "rho", "bek", "cal", "dun",
    "er", "fio",
)
TOWN_SUFFIXES = ("holm", "ford", "mere", "wick", "stead", "by", "haven", "crest")
COMPANY_SUFFIXES = ("Works", "& Sons", "Company", "Guild", "Trading", "Brothers")
PROFESSIONS = (
    "clockmaker", "glassblower", "cartographer", "beekeeper", "violinist", "astronomer",
    "botanist", "shipwright", "weaver", "poet",
)
PRODUCTS = (
    "blue cheese", "copper bells", "salt honey", "woolen scarves", "river pearls",
    "paper lanterns", "plum brandy", "slate roofs", "wind chimes", "herb tea",
)
REGIONS = ("Ostmark", "Vellan Coast", "High Dorran", "Suldra Valley", "Kessel Plains")
INDUSTRIES = (
    "shipping", "textile", "clock", "brewing", "printing", "lantern", "glass", "mining", "seed",
    "ink",
)
# fmt: on


def _names(rng: random.Random, n: int, syllables: tuple[int, int], used: set[str]) -> list[str]:
    out = []
    while len(out) < n:
        name = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(*syllables))).capitalize()
        if name not in used:
            used.add(name)
            out.append(name)
    return out


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def make_world(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(corpus rows {id, title, text}, every candidate question row)."""
    rng = random.Random(seed)
    used: set[str] = set()
    towns = [
        {
            "id": f"t{i:03d}",
            "name": base + rng.choice(TOWN_SUFFIXES),
            "region": rng.choice(REGIONS),
            "product": rng.choice(PRODUCTS),
            "river": _names(rng, 1, (2, 2), used)[0],
        }
        for i, base in enumerate(_names(rng, 50, (1, 2), used))
    ]
    firsts, lasts = _names(rng, 100, (2, 2), used), _names(rng, 100, (2, 3), used)
    people = [
        {
            "id": f"p{i:03d}",
            "name": f"{first} {last}",
            "profession": rng.choice(PROFESSIONS),
            "year": rng.randint(1780, 1900),
            "town": rng.choice(towns),
        }
        for i, (first, last) in enumerate(zip(firsts, lasts, strict=True))
    ]
    companies = [
        {
            "id": f"c{i:03d}",
            "name": f"{base} {rng.choice(COMPANY_SUFFIXES)}",
            "industry": rng.choice(INDUSTRIES),
            "year": rng.randint(1800, 1950),
            "founder": founder,
            "town": rng.choice(towns),
        }
        for i, (base, founder) in enumerate(
            zip(_names(rng, 50, (2, 3), used), rng.sample(people, 50), strict=True)
        )
    ]
    corpus = [
        {
            "id": p["id"],
            "title": p["name"],
            "text": f"{p['name']} was {_a(p['profession'])} born in {p['year']} in the town of "
            f"{p['town']['name']}.",
        }
        for p in people
    ]
    corpus += [
        {
            "id": t["id"],
            "title": t["name"],
            "text": f"{t['name']} is a town in the {t['region']} region on the river "
            f"{t['river']}. It is known for its {t['product']}.",
        }
        for t in towns
    ]
    corpus += [
        {
            "id": c["id"],
            "title": c["name"],
            "text": f"{c['name']} is {_a(c['industry'])} company founded in {c['year']} by "
            f"{c['founder']['name']}. Its headquarters are in {c['town']['name']}.",
        }
        for c in companies
    ]

    def q(prompt: str, answer, support: list[str]) -> dict:
        return {
            "prompt": prompt,
            "label": [str(answer)],
            "source": "synthetic",
            "hops": len(support),
            "support": support,
        }

    questions = []
    for p in people:
        questions += [
            q(f"In which town was {p['name']} born?", p["town"]["name"], [p["id"]]),
            q(f"What was the profession of {p['name']}?", p["profession"], [p["id"]]),
            q(f"In what year was {p['name']} born?", p["year"], [p["id"]]),
        ]
    for t in towns:
        questions += [
            q(f"What is {t['name']} known for?", t["product"], [t["id"]]),
            q(f"In which region is {t['name']}?", t["region"], [t["id"]]),
        ]
    for c in companies:
        f, hq = c["founder"], c["town"]
        questions += [
            q(f"Who founded {c['name']}?", f["name"], [c["id"]]),
            q(f"In what year was {c['name']} founded?", c["year"], [c["id"]]),
            q(
                f"In which town was the founder of {c['name']} born?",
                f["town"]["name"],
                [c["id"], f["id"]],
            ),
            q(
                f"What was the profession of the founder of {c['name']}?",
                f["profession"],
                [c["id"], f["id"]],
            ),
            q(
                f"In which region are the headquarters of {c['name']}?",
                hq["region"],
                [c["id"], hq["id"]],
            ),
        ]
    return corpus, questions


def split_questions(
    questions: list[dict], seed: int, n_train: int, n_test: int, two_hop_share: float = 0.35
) -> tuple[list[dict], list[dict]]:
    """Train and test sets that share no source documents (``data.canonical_key``: no test
    question is about the documents of a training question), each with about
    ``two_hop_share`` 2-hop questions.

    Per number of hops, the questions are grouped by key and the groups shuffled; each set
    takes whole groups while they fit, and the last one it needs only in part (the rest of that
    group is left out of both sets), so the sizes are exact."""
    rng = random.Random(seed + 1)
    pools = {}
    for hops in (1, 2):
        groups: dict[str, list[dict]] = {}
        for x in questions:
            if x["hops"] == hops:
                groups.setdefault(canonical_key(x), []).append(x)
        pools[hops] = list(groups.values())
        rng.shuffle(pools[hops])
    sets = []
    for n in (n_train, n_test):
        k = round(n * two_hop_share)
        rows = _take(pools[2], k, "2-hop") + _take(pools[1], n - k, "1-hop")
        rng.shuffle(rows)
        sets.append(rows)
    return sets[0], sets[1]


def _take(groups: list[list[dict]], n: int, what: str) -> list[dict]:
    """``n`` questions from whole groups (removed from ``groups``), the last one possibly cut."""
    out: list[dict] = []
    while len(out) < n:
        if not groups:
            raise ValueError(f"not enough {what} questions with unused source documents")
        fits = next((i for i, g in enumerate(groups) if len(g) <= n - len(out)), 0)
        out += groups.pop(fits)[: n - len(out)]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m recipes.deep_research.make_data",
        description="Write the fictional corpus.jsonl, train.jsonl and test.jsonl (the "
        "two question sets share no source documents).",
    )
    p.add_argument("--seed", type=int, default=0, help="generation seed")
    p.add_argument("--out", default="recipes/deep_research/data", help="output folder")
    p.add_argument("--train", type=int, default=60, help="train questions")
    p.add_argument("--test", type=int, default=20, help="test questions")
    p.add_argument(
        "--prefix",
        default="",
        help="prefix of the question files: 'learn_' writes learn_train.jsonl and "
        "learn_test.jsonl (the corpus is the same for every split of one seed)",
    )
    args = p.parse_args(argv)
    corpus, questions = make_world(args.seed)
    train, test = split_questions(questions, args.seed, args.train, args.test)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(corpus, out / "corpus.jsonl")
    write_jsonl(train, out / f"{args.prefix}train.jsonl")
    write_jsonl(test, out / f"{args.prefix}test.jsonl")
    print(f"wrote {len(corpus)} documents, {len(train)} train and {len(test)} test questions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
