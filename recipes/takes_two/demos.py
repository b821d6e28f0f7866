"""Rule-written consultations for a supervised warm start of each role (``kernel sft``).

The base doctor almost never reads a diagnosis off the facts it is told (right 10 of 22 named
candidates against a perfect informant, half of them the first listed), and the base patient
answers with its age and "I'm not sure" (7-10% of facts revealed): sampling them yields too few
good consultations to keep (``kernel collect``: 7 of 704). These turns are written from the
training cases instead, each as the role sees it in the recipe (its own system prompt and
messages, from ``prompts``), as ``messages`` rows (every assistant turn trained on):

- ``--role doctor``: the opening with the candidates in a new order (so the list's order says
  nothing), one of ``QUESTIONS``, an answer holding one to all of the case's facts with the
  last-turn notice, and the two lines naming the case's condition and recommendation;
- ``--role patient``: its hidden case, one of ``QUESTIONS``, and an answer of two of its facts.

``--per_case`` variants of each case. Only training rows go in; the held-out file stays held
out::

    python -m recipes.takes_two.demos --role doctor --per_case 8 \\
        --train recipes/takes_two/data/train_balanced.jsonl --out runs/tt_warm/doctor.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Mapping
from typing import Any

from kernel.buffer import write_jsonl
from recipes.takes_two import prompts
from recipes.takes_two.config import RecipeConfig

QUESTIONS = (
    "What other symptoms do you have?",
    "Can you tell me more about your symptoms?",
    "What else have you noticed?",
    "How does it feel, and what makes it worse?",
)


def doctor_demo(row: Mapping[str, Any], rng: random.Random, cfg: RecipeConfig) -> dict:
    """The doctor's side of one consultation of ``row`` (a case row with ``facts`` and
    ``candidates``): told one to all of the case's facts (each tells its condition apart from
    the rest of its group), in a new order."""
    facts = rng.sample(row["facts"], rng.randint(1, len(row["facts"])))
    candidates = rng.sample(row["candidates"], len(row["candidates"]))
    label = row["label"]
    opening = prompts.doctor_opening(row["prompt"], candidates if cfg.show_candidates else ())
    answer = prompts.to_doctor(" ".join(facts), cfg.max_quote_chars, cfg.last_turn_notice)
    final = f"Diagnosis: {label['diagnosis']}\nRecommendation: {label['recommendation']}"
    return {
        "messages": [
            {"role": "system", "content": prompts.doctor_system(cfg.max_turns, cfg.min_questions)},
            {"role": "user", "content": opening},
            {"role": "assistant", "content": rng.choice(QUESTIONS)},
            {"role": "user", "content": answer},
            {"role": "assistant", "content": final},
        ],
        "case": row.get("case"),
    }


def patient_demo(row: Mapping[str, Any], rng: random.Random, cfg: RecipeConfig) -> dict:
    """The patient's side: asked one of ``QUESTIONS``, it answers with two of its facts (its
    prompt asks for one or two short sentences), never the diagnosis."""
    system = prompts.patient_system(row["prompt"], row["facts"], cfg.unknown_reply)
    question = prompts.to_patient(rng.choice(QUESTIONS), cfg.max_quote_chars)
    answer = " ".join(rng.sample(row["facts"], min(2, len(row["facts"]))))
    return {
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ],
        "case": row.get("case"),
    }


ROLES = {"doctor": doctor_demo, "patient": patient_demo}


def demos(
    rows: list[Mapping[str, Any]], per_case: int, seed: int, cfg: RecipeConfig, role: str
) -> list[dict]:
    rng = random.Random(seed)
    return [ROLES[role](row, rng, cfg) for row in rows for _ in range(per_case)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--role", choices=sorted(ROLES), default="doctor", help="whose turns")
    p.add_argument("--train", required=True, help="training case rows (JSONL)")
    p.add_argument("--out", required=True, help="where the messages rows go (JSONL)")
    p.add_argument("--per_case", type=int, default=8, help="variants per case (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max_turns", type=int, default=2, help="as recipe_args.max_turns")
    p.add_argument("--min_questions", type=int, default=1, help="as recipe_args.min_questions")
    a = p.parse_args(argv)
    if a.per_case < 1:
        p.error(f"--per_case must be >= 1, got {a.per_case}")
    cfg = RecipeConfig(max_turns=a.max_turns, min_questions=a.min_questions, show_candidates=True)
    rows = []
    with open(a.train, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            missing = [k for k in ("prompt", "label", "facts", "candidates") if not row.get(k)]
            if missing or not isinstance(row["label"], Mapping):
                p.error(f"{a.train}:{n}: a case row needs prompt, label{{diagnosis, "
                        f"recommendation}}, facts and candidates; missing {missing}")  # fmt: skip
            rows.append(row)
    out = demos(rows, a.per_case, a.seed, cfg, a.role)
    write_jsonl(out, a.out)
    print(f"{len(out)} {a.role} turns of {len(rows)} cases -> {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
