"""What a held-out score needs no skill for: the controls every skill figure stands beside
(docs/design.md, "Every skill figure stands beside its controls"), and a majority vote over one
agent's sampled answers.

A **control** is, per held-out item, the expected score of a strategy that reads nothing of the
item but what any guess could use:

- ``most common answer``: the most common training answer of the item's group (math, debate
  and gym: the row's task or environment; takes_two: the complaint, i.e. the set of candidate
  conditions its opening lists; deep_research: the question's form, its names blanked: "In
  which town was * * born?"). A tie among answers scores the share of the tied that are right
  (a random pick among them).
- ``chance among candidates`` and ``first candidate`` (takes_two): one of the case's listed
  candidate conditions at random, or always the first one listed.
- ``chance among offered``: where the headline agent picks among what the others wrote (the
  selector among rewrites or solutions; a debate's verdict among the debaters' final answers),
  a random pick among them, read per episode from the run's own evaluation file (the metric
  that says how many of the offered were right). It is per seed, as the run is.

``controls(recipe, preset, config, finals)`` gives each control's per-item scores (one map
per seed for a per-episode control, one map for the rest); bench_learning.py reports the run's
final scores against each and against the best (``above_control``), with the same two-level
interval as every other comparison.

``leak_free_rows`` names the held-out items that are no training problem by the recipe's
``canonical_key`` where some are (the math splits made before the key saw through moved
signs): reports give the headline on them beside the whole set.

A **vote** (``vote_scores``) reads an evaluation file of k sampled episodes per item: the item
scores 1 when the plurality of the episodes' final answers is right (a tie: the share of the
tied answers that are right). It is the control a workflow of several agents must beat at equal
inference tokens: one agent sampled k times, its answers counted.

From the command line, a case set rather than a run (``case_set_controls``)::

    python scripts/controls.py --held-out recipes/takes_two/data/test_balanced.jsonl \
        --train recipes/takes_two/data/train_balanced.jsonl

prints each control's mean over a held-out file: with candidates (takes_two) ``1/k`` (one over
the number of candidates: what the candidate controls come to where neither the list's order
nor the class balance gives the answer away), ``chance among candidates`` and ``first
candidate``; ``most common answer`` (from the training file); and, for takes_two rows (with
``facts`` and ``candidates``), the ``facts oracle`` (``recipes.takes_two.data.facts_oracle``:
every fact of the case read, the candidate whose table facts they are named; 1.0 where the
facts decide every case).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a file: python scripts/controls.py
from kernel.run.results import read_jsonl  # noqa: E402

Map = dict[int, float]  # held-out row -> score


@dataclass(frozen=True)
class Guessing:
    """How a recipe's rows are guessed without skill: a training row's answer as a guess, the
    group a row belongs to, and whether a guess is right for a held-out row."""

    answer: Callable[[dict], str]
    group: Callable[[dict], object]
    right: Callable[[str, dict], bool]
    candidates: Callable[[dict], list[str]] | None = None


def _label(row: dict) -> str:
    return str(row["label"]).strip()


def _golds(row: dict) -> list[str]:
    from recipes.deep_research.reward import gold_answers, normalize

    return [normalize(g) for g in gold_answers(row["label"])]


# every capitalised word after the first: the names a question is about
_NAME = re.compile(r"(?<=\s)[A-Z][\w'&.-]*")


def question_form(row: dict) -> str:
    """A question with its names blanked ("In which town was Dorbek Garul born?" -> "In which
    town was * * born?"): questions of one form ask the same relation of different things."""
    return _NAME.sub("*", str(row["prompt"]).strip())


GUESSING = {
    "math_solver_verifier": Guessing(_label, lambda r: r.get("task"), lambda g, r: g == _label(r)),
    "debate": Guessing(_label, lambda r: r.get("task"), lambda g, r: g == _label(r)),
    "gym": Guessing(_label, lambda r: r.get("env"), lambda g, r: g == _label(r)),
    "takes_two": Guessing(
        answer=lambda r: r["label"]["diagnosis"],
        group=lambda r: tuple(sorted(r.get("candidates") or ())),
        right=lambda g, r: g == r["label"]["diagnosis"],
        candidates=lambda r: list(r.get("candidates") or ()),
    ),
    "deep_research": Guessing(
        answer=lambda r: _golds(r)[0],
        group=question_form,
        right=lambda g, r: g in _golds(r),
    ),
}

# (recipe, preset) -> (agent, episode metric): the share of what the headline agent picked
# among that was right, per episode (a random pick's expected score)
OFFERED = {
    ("math_solver_verifier", "learn_three_role"): ("selector", "rewrite_accuracy"),
    ("math_solver_verifier", "learn_select"): ("selector", "solver_accuracy"),
    ("debate", "learn"): ("alice", "final_accuracy"),
}


def _rows(path: str, limit: int | None = None) -> list[dict]:
    p = Path(path)
    rows = read_jsonl(p if p.is_absolute() else ROOT / p)
    return rows[:limit] if limit else rows


def _tied_share(counts: Counter, right: Callable[[str], bool]) -> float:
    """The expected score of a random pick among ``counts``' most common answers."""
    if not counts:
        return 0.0
    top = max(counts.values())
    tied = [a for a, c in counts.items() if c == top]
    return sum(map(right, tied)) / len(tied)


def most_common_answer(held_out: list[dict], train: list[dict], how: Guessing) -> Map:
    """Each held-out row: a random pick among its group's most common training answers, scored.
    A group no training row has gets the most common answer over all of training."""
    by_group: dict[object, Counter] = defaultdict(Counter)
    overall: Counter = Counter()
    for row in train:
        by_group[how.group(row)][how.answer(row)] += 1
        overall[how.answer(row)] += 1
    return {
        i: _tied_share(by_group.get(how.group(row)) or overall, lambda g, r=row: how.right(g, r))
        for i, row in enumerate(held_out)
    }


def candidate_controls(held_out: list[dict], how: Guessing) -> dict[str, Map]:
    """A random candidate and the first listed candidate, per held-out row."""
    chance, first = {}, {}
    for i, row in enumerate(held_out):
        listed = how.candidates(row)
        chance[i] = sum(how.right(c, row) for c in listed) / len(listed) if listed else 0.0
        first[i] = float(bool(listed) and how.right(listed[0], row))
    return {"chance among candidates": chance, "first candidate": first}


def case_set_controls(
    held_out: list[dict], train: list[dict], recipe: str = "takes_two"
) -> dict[str, float]:
    """Each control's mean over the ``held_out`` rows (the command line's table): with
    candidates on every row, ``1/k`` and ``candidate_controls``; ``most_common_answer`` of the
    ``train`` rows; for takes_two rows with ``facts`` and ``candidates``, the ``facts oracle``
    (module docstring). The candidate controls above ``1/k`` say the list's order or the class
    balance gives the answer away; the facts oracle below 1.0, that some case's facts do not
    decide it."""
    if not held_out:
        raise ValueError("controls: the held-out file has no rows")
    how = GUESSING[recipe]
    per_row: dict[str, list[float]] = {}
    listed = [how.candidates(r) for r in held_out] if how.candidates is not None else []
    if listed and all(listed):
        per_row["1/k"] = [1 / len(c) for c in listed]
        per_row |= {k: list(v.values()) for k, v in candidate_controls(held_out, how).items()}
    per_row["most common answer"] = list(most_common_answer(held_out, train, how).values())
    if recipe == "takes_two" and all("facts" in r and r.get("candidates") for r in held_out):
        from recipes.takes_two.data import facts_oracle

        per_row["facts oracle"] = [facts_oracle(r) for r in held_out]
    return {name: sum(scores) / len(scores) for name, scores in per_row.items()}


def offered(finals: Iterable[list[dict]], agent: str, metric: str) -> list[Map]:
    """Per final evaluation (a seed's, its lines as read and rescored), each row's mean of
    ``metric`` over its episodes on ``agent``'s line: a random pick among what was offered."""
    maps = []
    for lines in finals:
        scores: Map = {}
        for item in lines:
            values = [m[metric] for m in item.get("metrics") or [] if m.get(metric) is not None]
            if item["agent"] == agent and values:
                scores[item["row"]] = sum(values) / len(values)
        maps.append(scores)
    return maps


def controls(recipe: str, preset: str, config: dict, finals: list[list[dict]]) -> dict[str, list]:
    """name -> the control's per-item scores, as a list of maps (one per seed, or one): every
    control the recipe and preset have (module docstring); {} for a recipe with none. ``finals``:
    each seed's last evaluation, its lines as read and rescored (scripts/rescore.py), for the
    per-episode controls."""
    out: dict[str, list[Map]] = {}
    how = GUESSING.get(recipe)
    if how is not None and config.get("data", {}).get("path"):
        held = _rows(config["eval"]["path"], config["eval"].get("max_prompts"))
        train = _rows(config["data"]["path"])
        out["most common answer"] = [most_common_answer(held, train, how)]
        if how.candidates is not None:
            out |= {k: [v] for k, v in candidate_controls(held, how).items()}
    if (recipe, preset) in OFFERED:
        out["chance among offered"] = offered(finals, *OFFERED[(recipe, preset)])
    return out


# ---- leaks -------------------------------------------------------------------------------------


def _key(recipe: str) -> Callable[[dict], str] | None:
    """The recipe's ``canonical_key`` (what makes two items the same problem); debate's and
    gym's rows are math's arithmetic, as tests/recipes/test_data_leaks.py reads them."""
    module = {"debate": "math_solver_verifier", "gym": "math_solver_verifier"}.get(recipe, recipe)
    if module not in ("math_solver_verifier", "takes_two", "deep_research"):
        return None
    from importlib import import_module

    return import_module(f"recipes.{module}.data").canonical_key


def leak_free_rows(recipe: str, config: dict) -> list[int] | None:
    """The held-out rows of the run's evaluation that are no training problem by the recipe's
    ``canonical_key``; None when every row is (or the recipe has no key): a figure on these
    rows is the one no memorised training item can reach."""
    key = _key(recipe)
    if key is None or not config.get("data", {}).get("path"):
        return None
    held = _rows(config["eval"]["path"], config["eval"].get("max_prompts"))
    trained = {key(r) for r in _rows(config["data"]["path"])}
    clean = [i for i, r in enumerate(held) if key(r) not in trained]
    return None if len(clean) == len(held) else clean


# ---- the vote ---------------------------------------------------------------------------------


def _deep_research_answer(text: str) -> str | None:
    from recipes.deep_research.reward import normalize
    from scripts.rescore import research_answer

    answer = normalize(research_answer(text) or "")
    return answer or None


# recipe -> the final answer of one episode, from the headline agent's decoded reply text,
# normalised as the recipe compares answers (None: no answer)
ANSWERS: dict[str, Callable[[str], str | None]] = {"deep_research": _deep_research_answer}


def vote_scores(path: Path, agent: str, answer: Callable[[str], str | None]) -> Map:
    """Each row of an evaluation file: the plurality answer of ``agent``'s episodes scored
    (an answer is right when an episode that gave it passed), a tie scoring the share of the
    tied answers that are right; an item none of whose episodes answered scores 0."""
    scores: Map = {}
    for item in read_jsonl(path):
        if item["agent"] != agent:
            continue
        counts: Counter = Counter()
        right: set[str] = set()
        for text, passed, reward in zip(
            item["texts"], item["passed"], item["rewards"], strict=True
        ):
            said = answer(text)
            if said is None or reward is None:
                continue
            counts[said] += 1
            if passed:
                right.add(said)
        scores[item["row"]] = _tied_share(counts, right.__contains__)
    return scores


# ---- the command line -------------------------------------------------------------------------


def _infer_recipe(rows: list[dict]) -> str:
    if rows and all(r.get("candidates") and "facts" in r for r in rows):
        return "takes_two"
    raise SystemExit(
        f"controls.py: which recipe's rows are these? name it with --recipe ({', '.join(GUESSING)})"
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python scripts/controls.py",
        description=(
            "What a held-out case file scores without skill: each control's mean over its "
            "rows (a random candidate, the first listed one and 1/k where rows list "
            "candidates; each group's most common training answer; takes_two's facts oracle)."
        ),
        epilog=(
            "example: python scripts/controls.py --held-out "
            "recipes/takes_two/data/test_balanced.jsonl --train "
            "recipes/takes_two/data/train_balanced.jsonl"
        ),
    )
    p.add_argument(
        "--held-out", type=Path, required=True, help="held-out .jsonl file (.gz read too)"
    )
    p.add_argument(
        "--train",
        type=Path,
        required=True,
        help="its training .jsonl file (for each group's most common training answer)",
    )
    p.add_argument(
        "--recipe",
        choices=sorted(GUESSING),
        help="whose rows they are (default: takes_two where every held-out row has "
        "'candidates' and 'facts'; otherwise required)",
    )
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    held_out, train = read_jsonl(args.held_out), read_jsonl(args.train)
    recipe = args.recipe or _infer_recipe(held_out)
    figures = case_set_controls(held_out, train, recipe)
    print(f"{args.held_out}: {len(held_out)} cases (training: {args.train}, {len(train)} cases)")
    for name, score in figures.items():
        print(f"  {name:<32} {score:.3f}")


if __name__ == "__main__":
    main()
