"""Generate the small offline corpus and QA set shipped in data/ (seeded, deterministic).

    python -m recipes.deep_research.make_data --seed 0 --out recipes/deep_research/data

A fictional world -- people, towns and companies with made-up names and attributes -- so that no
model knows the answers and they can only be found by searching the corpus. 200 short
documents (100 people ``pNNN``, 50 towns ``tNNN``, 50 companies ``cNNN``) and questions that
need one document (``hops: 1``: "In which town was X born?") or two (``hops: 2``: "In which
town was the founder of Y born?" needs Y's document to find the founder, then the founder's).
Each question row records the documents that answer it (``support``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

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
    """Disjoint train and test sets, each with about ``two_hop_share`` 2-hop questions."""
    rng = random.Random(seed + 1)
    one = [x for x in questions if x["hops"] == 1]
    two = [x for x in questions if x["hops"] == 2]
    rng.shuffle(one)
    rng.shuffle(two)
    sets = []
    for n in (n_train, n_test):
        k = round(n * two_hop_share)
        rows = [two.pop() for _ in range(k)] + [one.pop() for _ in range(n - k)]
        rng.shuffle(rows)
        sets.append(rows)
    return sets[0], sets[1]


def write_jsonl(rows: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m recipes.deep_research.make_data",
        description="Write the fictional corpus.jsonl, train.jsonl and test.jsonl.",
    )
    p.add_argument("--seed", type=int, default=0, help="generation seed")
    p.add_argument("--out", default="recipes/deep_research/data", help="output folder")
    p.add_argument("--train", type=int, default=60, help="train questions")
    p.add_argument("--test", type=int, default=20, help="test questions")
    args = p.parse_args(argv)
    corpus, questions = make_world(args.seed)
    train, test = split_questions(questions, args.seed, args.train, args.test)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(corpus, out / "corpus.jsonl")
    write_jsonl(train, out / "train.jsonl")
    write_jsonl(test, out / "test.jsonl")
    print(f"wrote {len(corpus)} documents, {len(train)} train and {len(test)} test questions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
