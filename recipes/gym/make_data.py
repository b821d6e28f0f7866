"""Writes gym's data (``python -m recipes.gym.make_data``; the files ship, this remakes them):

- ``tools_{train,test}.jsonl``: "What is A * B?" with A of four digits and B of three, which a
  small model cannot multiply in its head but can with the calculator or Python tools
  (``env: tools``); held-out pairs {A, B} never occur in training, in either order;
- ``mix_{train,test}.jsonl``: math problems (``env: math``, the math recipe's arith2-12d rows)
  and tool tasks, alternating, for a run that trains on two environments at once.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
MATH = HERE.parent / "math_solver_verifier" / "data"  # read as files: a recipe imports no recipe


def products(n: int, rng: random.Random, taken: set) -> list[dict]:
    rows = []
    while len(rows) < n:
        a, b = rng.randint(1000, 9999), rng.randint(100, 999)
        if frozenset((a, b)) in taken:
            continue
        taken.add(frozenset((a, b)))
        rows.append({"prompt": f"What is {a} * {b}?", "label": str(a * b), "env": "tools"})
    return rows


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{path.relative_to(HERE.parent.parent)}: {len(rows)} rows")


def main() -> None:
    rng, taken = random.Random(20261127), set()
    test = products(128, rng, taken)
    train = products(1024, rng, taken)
    write(HERE / "data" / "tools_train.jsonl", train)
    write(HERE / "data" / "tools_test.jsonl", test)
    for split, n in (("train", 512), ("test", 64)):
        math = [json.loads(line) for line in (MATH / f"arith2-12d_{split}.jsonl").open()][:n]
        tools = (train if split == "train" else test)[:n]
        pairs = zip(math, tools, strict=True)
        mixed = [r for m, t in pairs for r in ({**m, "env": "math"}, t)]
        write(HERE / "data" / f"mix_{split}.jsonl", mixed)


if __name__ == "__main__":
    main()
