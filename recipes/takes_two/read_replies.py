"""Read a takes_two run's held-out replies before believing its score.

``python -m recipes.takes_two.read_replies RUN [RUN ...]`` takes ``scripts/bench_learning.py``
run folders (``runs/learning/takes_two``, ``docs/results/takes_two_frozen``) and prints, per
seed and held-out evaluation (the first and the last), from the replies themselves:

- ``correct``: correct single diagnoses (``reward.diagnosis_correct``), and how many of them
  agree with the ``diagnosis_correct`` the run logged (they should be all);
- ``named``: the diagnoses that name exactly one of the case's candidate conditions
  (``reward.candidate_named``), right or wrong, and ``correct | named``, the share of those
  that are right;
- ``chance``: what naming one candidate at random scores on these cases (a condition's
  synonyms may make two candidates count);
- ``facts``: the mean share of the case's facts the patient's answers revealed, as logged;
- the doctor's most common first turns, and how many different ones it used.

A doctor whose ``correct`` rises only because ``named`` rises, with ``correct | named`` near
``chance``, learned to pick from the list, not to tell the conditions apart.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import Counter
from pathlib import Path

from kernel.hooks import package_file
from recipes.takes_two.data import Case, diagnosis_matches
from recipes.takes_two.reward import candidate_named, diagnosis_correct, parse_final

_TURN_END = re.compile(r"<\|im_end\|>|<\|eot_id\|>|</s>|\n")


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _eval_file(seed: Path, name: str) -> Path:
    plain = seed / "eval" / name
    return plain if plain.exists() else plain.with_suffix(".jsonl.gz")


def _short(text: str, chars: int = 60) -> str:
    return text if len(text) <= chars else text[: chars - 3] + "..."


def case_of(row: dict) -> Case:
    label = row["label"]
    return Case(
        chief_complaint=row["prompt"],
        facts=list(row.get("facts", [])),
        diagnosis=label["diagnosis"],
        recommendation=label.get("recommendation", ""),
        synonyms=tuple(label.get("synonyms", ())),
        candidates=tuple(row.get("candidates", ())),
    )


def chance(case: Case) -> float:
    """What naming one of the case's candidates at random scores."""
    right = [c for c in case.candidates if diagnosis_matches(c, case.diagnosis, case.synonyms)]
    return len(right) / len(case.candidates) if case.candidates else 0.0


def read(path: Path, cases: list[Case]) -> dict:
    """The figures of one held-out evaluation file (the doctor's entries)."""
    n = correct = agree = named = named_right = 0
    odds, facts, firsts = 0.0, 0.0, Counter()
    for item in _read_jsonl(path):
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
        "chance": odds / n,
        "facts": facts / n,
        "first_turns": firsts,
    }


def seeds(run: Path) -> list[Path]:
    found = {p.parent for p in run.glob("seed*/config.json")}
    if not found:
        raise SystemExit(f"read_replies: no seed<S>/config.json under {run}")
    return sorted(found, key=lambda p: int(p.name[4:]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", type=Path, help="bench_learning run folders")
    parser.add_argument("--turns", type=int, default=3, help="first turns to show per seed")
    args = parser.parse_args(argv)
    head = f"{'run':<20} {'seed':<6} {'eval':<9} {'n':>4} {'correct':>8} {'named':>6}"
    print(head + f" {'correct|named':>13} {'chance':>6} {'facts':>6}  first turns")
    for run in args.runs:
        for seed in seeds(run):
            config = json.loads((seed / "config.json").read_text())
            cases = [case_of(r) for r in _read_jsonl(Path(package_file(config["eval"]["path"])))]
            names = sorted(
                (p.name.split(".")[0] for p in (seed / "eval").glob("step_*.jsonl*")),
                key=lambda s: int(s[5:]),
            )
            for name in dict.fromkeys([names[0], names[-1]]):
                f = read(_eval_file(seed, name + ".jsonl"), cases)
                if f["agree"] != f["n"]:
                    print(f"  warning: {f['n'] - f['agree']} diagnoses differ from the logged ones")
                common = "; ".join(
                    f"{_short(t)!r} x{k}" for t, k in f["first_turns"].most_common(args.turns)
                )
                print(
                    f"{run.name:<20} {seed.name:<6} {name:<9} {f['n']:>4} {f['correct']:>8.3f} "
                    f"{f['named']:>6.3f} {f['correct_if_named']:>13.3f} {f['chance']:>6.3f} "
                    f"{f['facts']:>6.3f}  {len(f['first_turns'])} different: {common}"
                )


if __name__ == "__main__":
    main()
