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
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from kernel.run.results import read_jsonl

ROOT = Path(__file__).resolve().parent.parent

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
