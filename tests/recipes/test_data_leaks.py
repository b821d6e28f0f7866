"""No held-out item is a training item in disguise.

Every shipped held-out file (a ``*test*.jsonl`` beside its ``*train*.jsonl``) and every
preset's ``eval.path`` against its ``data.path`` is compared by its recipe's ``canonical_key``,
which says what makes two items the same problem: math (and debate, whose problems math's
generator writes) the arithmetic in a value-preserving normal form, so "( 2 + -1 )", "-1 + 2"
and "2 - 1" are one problem; takes_two the condition and the set of facts, whatever the age,
sex or order of facts; deep_research the question's source documents. Exact-text comparison
missed 230 of 256 held-out arith2-1d problems and 66 of 128 takes_two cases.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from recipes.deep_research.data import canonical_key as research_key
from recipes.math_solver_verifier.data import canonical_key as math_key
from recipes.takes_two.data import canonical_key as case_key

ROOT = Path(__file__).resolve().parents[2]
KEYS = {
    "math_solver_verifier": math_key,
    "debate": math_key,
    "takes_two": case_key,
    "deep_research": research_key,
    "gym": math_key,  # its rows are arithmetic: math's problems and "What is A * B?" tool tasks
}


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def shipped_pairs() -> list[tuple[str, Path, Path]]:
    """(recipe, training file, held-out file): each data folder's *test* files with the *train*
    file of the same name, and each preset's data and eval files."""
    pairs = set()
    for recipe in KEYS:
        for test in (ROOT / "recipes" / recipe / "data").glob("*test*.jsonl"):
            pairs.add((recipe, test.with_name(test.name.replace("test", "train")), test))
        for preset in (ROOT / "recipes" / recipe / "presets").glob("*.yaml"):
            cfg = yaml.safe_load(preset.read_text())
            data, held = (cfg.get("data") or {}).get("path"), (cfg.get("eval") or {}).get("path")
            if data and held and not data.startswith("benchmark:"):
                pairs.add((recipe, ROOT / data, ROOT / held))
    return sorted(pairs)


PAIRS = shipped_pairs()


def test_every_recipe_with_shipped_splits_is_checked():
    assert {r for r, _, _ in PAIRS} == set(KEYS)
    names = {(t.parent.parent.name, t.name) for _, _, t in PAIRS}
    assert ("takes_two", "test_shared.jsonl") in names
    assert ("deep_research", "learn_test.jsonl") in names


@pytest.mark.parametrize(
    ("recipe", "train", "held_out"),
    PAIRS,
    ids=[f"{r}:{t.name}" for r, _, t in PAIRS],
)
def test_held_out_items_are_not_training_items_by_canonical_key(recipe, train, held_out):
    assert train.exists(), f"{held_out} has no training file {train.name} beside it"
    key = KEYS[recipe]
    trained = {key(r) for r in rows(train)}
    leaked = [(i, r["prompt"]) for i, r in enumerate(rows(held_out)) if key(r) in trained]
    assert not leaked, f"{held_out.name}: {len(leaked)} held-out items are trained on: {leaked[:5]}"


def test_the_math_key_sees_through_brackets_order_and_signs():
    same = ["Calculate ( 2 + -1 ).", "Calculate -1 + 2.", "Calculate 2 - 1.", "Calculate ((2-1))."]
    assert len({math_key({"prompt": p}) for p in same}) == 1
    assert math_key({"prompt": "Calculate 2 * -1."}) == math_key({"prompt": "Calculate -1 * 2."})
    # ...but not through structure: (2 * 7) + -7 is not 2 * (7 + -7)
    assert math_key({"prompt": "Calculate ( 2 * 7 ) + -7."}) != math_key(
        {"prompt": "Calculate 2 * ( 7 + -7 )."}
    )
    assert math_key({"prompt": "Calculate 8 - 2."}) != math_key({"prompt": "Calculate 2 - 8."})
    # a word problem is its text, not the arithmetic it happens to contain
    word = "Janet has 3 apples and buys 2 - 1 more at the market on a sunny day. How many now?"
    assert math_key({"prompt": word}).startswith("text:")
