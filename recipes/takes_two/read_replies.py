"""Read a takes_two run's held-out replies before believing its score.

``python -m recipes.takes_two.read_replies RUN [RUN ...]`` takes ``scripts/bench_learning.py``
run folders (``runs/learning/takes_two``, ``docs/results/takes_two_frozen``), read through the
kernel's ``SeedRun`` (``kernel.run.results``), and prints, per seed and held-out
evaluation (the first and the last), from the replies themselves:

- ``correct``: correct single diagnoses (``reward.diagnosis_correct``), and how many of them
  agree with the ``diagnosis_correct`` the run logged (they should be all);
- ``named``: the diagnoses that name exactly one of the case's candidate conditions
  (``reward.candidate_named``), right or wrong, and ``correct | named``, the share of those
  that are right;
- ``first|named``: the share of named candidates that are the first one listed (a doctor that
  reads the list's order, not the facts, names it always; the balanced files put the true
  condition first in a quarter of cases);
- ``chance``: what naming one candidate at random scores on these cases (a condition's
  synonyms may make two candidates count);
- ``facts``: the mean share of the case's facts the patient's answers revealed, as logged;
- the doctor's most common first turns, and how many different ones it used.

A doctor whose ``correct`` rises only because ``named`` rises, with ``correct | named`` near
``chance``, learned to pick from the list, not to tell the conditions apart.

What a case set scores with no consultation at all (a random candidate, the first listed one,
each group's most common training condition, and the facts oracle) is ``scripts/controls.py``'s
(``python scripts/controls.py --held-out HELD_OUT --train TRAIN``).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from kernel.run.results import SeedRun, each_seed, read_jsonl, replies_parser
from recipes.takes_two.data import Case, diagnosis_matches
from recipes.takes_two.reward import (
    candidate_named,
    diagnosis_correct,
    parse_final,
    stated_diagnosis,
)

_TURN_END = re.compile(r"<\|im_end\|>|<\|eot_id\|>|</s>|\n")


def _short(text: str, chars: int = 60) -> str:
    return text if len(text) <= chars else text[: chars - 3] + "..."


def held_out_cases(seed: SeedRun) -> list[Case]:
    """The held-out cases of a run's seed, by row, read as its evaluation read them."""
    return [Case.from_sample(sample) for sample in seed.held_out()]


def chance(case: Case) -> float:
    """What naming one of the case's candidates at random scores."""
    right = [c for c in case.candidates if diagnosis_matches(c, case.diagnosis, case.synonyms)]
    return len(right) / len(case.candidates) if case.candidates else 0.0


def read(path: Path, cases: list[Case]) -> dict:
    """The figures of one held-out evaluation file (the doctor's entries)."""
    n = correct = agree = named = named_right = named_first = 0
    odds, facts, firsts = 0.0, 0.0, Counter()
    for item in read_jsonl(path):
        if item["agent"] != "doctor":
            continue
        case = cases[item["row"]]
        for text, logged in zip(item["texts"], item["metrics"], strict=True):
            final = parse_final(text)  # from the last 'Diagnosis:', the doctor's closing turn
            right = diagnosis_correct(final, case)
            is_named = candidate_named(final, case) or 0.0
            n += 1
            correct += right
            agree += right == logged.get("diagnosis_correct")
            named += is_named
            named_right += right * is_named
            stated = stated_diagnosis(final)
            named_first += is_named and diagnosis_matches(stated, case.candidates[0])
            odds += chance(case)
            facts += logged.get("facts_revealed", 0.0)
            firsts[_TURN_END.split(text, 1)[0].strip()] += 1
    if not n:
        raise SystemExit(f"read_replies: {path} holds no doctor entry")
    return {
        "n": n,
        "correct": correct / n,
        "agree": agree,
        "named": named / n,
        "correct_if_named": named_right / named if named else 0.0,
        "first_if_named": named_first / named if named else 0.0,
        "chance": odds / n,
        "facts": facts / n,
        "first_turns": firsts,
    }


def _line(where: str, f: dict, turns: int) -> str:
    """One evaluation's figures as a table line (and a warning line first if the rescored
    diagnoses differ from the logged ones)."""
    common = "; ".join(f"{_short(t)!r} x{k}" for t, k in f["first_turns"].most_common(turns))
    line = (
        f"{where} {f['n']:>4} {f['correct']:>8.3f} {f['named']:>6.3f} "
        f"{f['correct_if_named']:>13.3f} {f['first_if_named']:>11.3f} {f['chance']:>6.3f} "
        f"{f['facts']:>6.3f}  "
        f"{len(f['first_turns'])} different: {common}"
    )
    if f["agree"] != f["n"]:
        line = f"  warning: {f['n'] - f['agree']} diagnoses differ from the logged ones\n{line}"
    return line


def main(argv: list[str] | None = None) -> None:
    parser = replies_parser(__doc__)
    parser.add_argument("--turns", type=int, default=3, help="first turns to show per seed")
    args = parser.parse_args(argv)
    head = f"{'run':<20} {'seed':<6} {'eval':<9} {'n':>4} {'correct':>8} {'named':>6}"
    print(
        head + f" {'correct|named':>13} {'first|named':>11} {'chance':>6} {'facts':>6}  first turns"
    )
    for seed, evaluations in each_seed(args.runs, 20):
        cases = held_out_cases(seed)
        for where, path in evaluations:
            print(_line(where, read(path, cases), args.turns))


if __name__ == "__main__":
    main()
