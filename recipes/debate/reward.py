"""debate's reward: every debater's final answer against the label, and the debate's verdict.

Per debater (``RecipeConfig`` holds the weights)::

    R = correct_weight * [its final answer is right]
      + verdict_weight * [the verdict is right and is its final answer]
      - format_penalty * [its final turn states no answer at all]

With ``credit: turn`` each round's turn is a sample of its own: the last round's earns R, an
earlier round's ``correct_weight * [its answer that round is right] - format_penalty * [none]``.

The verdict is the strict plurality of the final answers (``judge: majority``): the answer
more debaters stated than any other; a tie between different answers (two debaters who
disagree) or no valid answer at all: no verdict. Or it is the judge agent's stated answer
(``judge: model``), whose own reward is ``correct_weight * [verdict right] - format_penalty *
[no answer]``. A turn is credited only for the ONE final answer it states (``read_answer``):
once a marker occurs ("Answer: X", "answer is X") the LAST marked answer is the answer and no
other number counts; negated ("not 5"), hedged ("maybe 5", "5?"), naming several ("4 or 5",
"4, 5", "between 4 and 5") or not a number, it is a stated but invalid answer: never equal to
the label, never a vote, no format penalty (it answered, wrongly). A turn with no marker
answers with the one number of its last sentence, or its equation's result ("So 3 + 4 = 7."
-> 7; "= 7 or 8": none). Answers
compare as numbers when both parse as numbers, else as stripped text. The attacks this stops
are pinned by tests/recipes/test_debate_reward_adversarial.py; ``verdict_of`` rescores a
stored debate from its final turns.
``metadata["correct"]`` (eval's pass@k, the headline) is the verdict being right; the first
debater's ``metadata["metrics"]`` carry the debate's shape: first-round and final accuracy,
agreement, how many changed their answer, whether the verdict was right. ``style: procon``
scores arguments instead (procon.py).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from kernel.answers import (
    WRAP,
    clause_after_marker,
    doubt,
    last_sentence_number,
    right_side,
    strip_end_token,
)
from kernel.hooks import RolloutContext
from kernel.sample import Sample
from recipes.debate import procon
from recipes.debate.config import JUDGE, RecipeConfig, as_config

# An answer marker: "Answer: X", "answer is X", "answer = X" (any case, bold allowed:
# "**Answer:** X"). "answer is" also matches "answer isn't", whose answer then reads "n't X".
_MARKER = re.compile(r"\banswer\**\s*(?:is|:|=)", re.I)
# A marked answer must be one number: signed, thousands separators, decimals, a fraction a/b
# or \frac{a}{b}, maybe with "%" or one unit word ("12 apples").
_ONE_NUMBER = re.compile(
    r"(?P<n>[-+]?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?)\s*(?:%|[A-Za-z]+)?"
    r"|(?P<s>[-+]?)\\[dt]?frac\s*\{\s*(?P<a>\d+)\s*\}\s*\{\s*(?P<b>\d+)\s*\}"
)


class Reading(NamedTuple):
    """What ``read_answer`` read from a turn: ``answer``, the one valid number it states (None
    if it has none), and ``stated``: whether it stated an answer at all. A marked answer that
    does not stand (negated, hedged, several, not a number) is stated but invalid: answer
    None, stated True: never equal to the label, never a vote, and no format penalty."""

    answer: str | None
    stated: bool


def _marked(text: str, start: int, end: int) -> Reading | None:
    """The answer after the marker ``text[start:end]``: its line's first clause (the next
    line with text when the line is empty), of an equation the right-hand side; None when
    nothing follows the marker."""
    if (clause := clause_after_marker(text, end)) is None:
        return None
    first, first_end = clause
    answer = re.sub(r"^\\boxed\s*\{(.*)\}$|^\\\((.*)\\\)$", r"\1\2", right_side(first)).strip(WRAP)
    if not answer:
        return None
    number = _ONE_NUMBER.fullmatch(answer)
    if number is None or doubt(text, start, first, first_end, later_not_equal=True):
        return Reading(None, True)
    if number.group("n") is not None:
        return Reading(number.group("n").replace(",", ""), True)
    return Reading(f"{number.group('s')}{number.group('a')}/{number.group('b')}", True)


def read_answer(text: str | None) -> Reading:
    """The turn's one final answer (``Reading``). Once a marker occurs ("Answer: X", "answer
    is X", "answer = X"), the LAST marked answer is the answer and no other number counts: it
    stands only as one number (a unit word or % may follow; thousands separators dropped),
    not negated ("not 5", "isn't 5", "It is not true that the answer is 5"), hedged ("maybe
    5", "about 5", "5?", "I think the answer is 5") or one of several ("4 or 5", "5 or 5",
    "4, 5", "4 and 5", "between 4 and 5", "5, or 6"). A negation, approximation or "or" in
    the clause before the marker counts next to it (filler words between), a hedge such as
    "I think" or a condition "if" anywhere in it; a negation after the answer's clause is
    fine ("Answer: 5, not 6"). A marker with nothing
    after it (a truncated "Answer:") is passed over for the one before. A turn without any
    marker answers with the one number of its last sentence (after the last ".!?" before a
    space, or line break; a trailing end-of-turn token and period ignored) when it has
    exactly one, or the result it states as an equation ("So 3 + 4 = 7." -> 7), that its
    clause does not negate or hedge ("= 7 or 8", "= 6 = 7": no answer). The clause around
    an answer is read by ``kernel.answers``."""
    if not isinstance(text, str):
        return Reading(None, False)
    text = strip_end_token(text.replace("−", "-").replace("–", "-"))
    markers = [(m.start(), m.end()) for m in _MARKER.finditer(text)]
    for start, end in reversed(markers):
        if (found := _marked(text, start, end)) is not None:
            return found
    if markers:
        return Reading(None, False)
    number = last_sentence_number(text, later_not_equal=True)
    return Reading(None, False) if number is None else Reading(number.replace(",", ""), True)


def extract_answer(text: str | None) -> str | None:
    """The turn's one valid final answer (``read_answer``), or None: none stated, or one
    that does not stand."""
    return read_answer(text).answer


def _number(text: str) -> float | None:
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            return float(num) / float(den)
        return float(text)
    except (ValueError, ZeroDivisionError):
        return None


def same(answer: str | None, label: str) -> bool:
    """Whether ``answer`` equals ``label``: as numbers (within 1e-9) when both are, else as
    stripped text."""
    if answer is None:
        return False
    a, b = _number(answer), _number(str(label).strip())
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return answer.strip() == str(label).strip()


def majority(finals: Mapping[str, str | None], order: Sequence[str]) -> str | None:
    """The answer stated by strictly more debaters than any other (compared as ``same``
    does; its first stated form in ``order``); None on a tie between different answers (with
    two debaters who disagree, no verdict: the first is not favoured) or when nobody stated a
    valid one. Invalid answers (None) are no votes."""
    votes: Counter = Counter()
    first: dict[str, str] = {}  # canonical answer -> the first stated form
    for name in order:
        answer = finals.get(name)
        if answer is None:
            continue
        key = next((k for k in first if same(answer, k)), answer)
        first.setdefault(key, answer)
        votes[key] += 1
    if not votes:
        return None
    (top, n), *rest = votes.most_common(2)
    return None if rest and rest[0][1] == n else first[top]


def verdict_of(final_texts: Mapping[str, str], order: Sequence[str]) -> str | None:
    """The majority verdict of the debaters' final turns (their texts): for rescoring stored
    debates."""
    return majority({name: extract_answer(final_texts.get(name)) for name in order}, order)


def debater_reward(
    final: str | None,
    verdict: str | None,
    label: str,
    cfg: RecipeConfig,
    stated: bool | None = None,
) -> float:
    """A debater's R (module docstring); ``stated`` (default: ``final`` is not None) is
    whether its final turn stated an answer at all, valid or not: only none costs the format
    penalty."""
    right = same(final, label)
    won = (
        verdict is not None and same(verdict, label) and final is not None and same(final, verdict)
    )
    missing = final is None if stated is None else not stated
    return cfg.correct_weight * right + cfg.verdict_weight * won - cfg.format_penalty * missing


def reward(ctx: RolloutContext, samples: list[Sample]) -> dict[str, float]:
    """The recipe's reward hook (module docstring). Reads the debate generate stored in
    ``metadata["debate"]`` (each debater's turns, in order) and the judge's verdict text."""
    cfg = as_config(ctx.config)
    if cfg.style == "procon":
        return procon.reward(samples, cfg)
    first = samples[0]
    label = str(first.label)
    turns: dict[str, list[str]] = first.metadata["debate"]
    read = {name: read_answer(turns[name][-1]) for name in cfg.debaters}
    finals = {name: read[name].answer for name in cfg.debaters}
    if cfg.judge == "model":
        judged = read_answer(first.metadata.get("verdict"))
        verdict = judged.answer
    else:
        verdict = majority(finals, cfg.debaters)
    rewards = {
        name: debater_reward(finals[name], verdict, label, cfg, read[name].stated)
        for name in cfg.debaters
    }
    correct = verdict is not None and same(verdict, label)
    if cfg.judge == "model":
        rewards[JUDGE] = cfg.correct_weight * correct - cfg.format_penalty * (not judged.stated)
    opening = {name: extract_answer(turns[name][0]) for name in cfg.debaters}
    n = len(cfg.debaters)
    first.metadata.setdefault("metrics", {}).update(
        {
            "first_round_accuracy": sum(same(opening[d], label) for d in cfg.debaters) / n,
            "final_accuracy": sum(same(finals[d], label) for d in cfg.debaters) / n,
            "agreement": float(
                all(f is not None for f in finals.values())
                and all(same(f, finals[cfg.debaters[0]]) for f in finals.values())
            ),
            "changed_answer": sum(
                (opening[d] is None) != (finals[d] is None)
                or (finals[d] is not None and not same(finals[d], opening[d]))
                for d in cfg.debaters
            )
            / n,
            "verdict_correct": float(correct),
            "no_verdict": float(verdict is None),
        }
    )
    for s in samples:
        s.metadata["correct"] = correct
    if cfg.credit == "episode":
        return rewards
    return [
        rewards[s.agent] if s.agent == JUDGE else _turn_reward(s, turns, rewards, cfg)
        for s in samples
    ]


def _turn_reward(
    s: Sample, turns: dict[str, list[str]], final: dict[str, float], cfg: RecipeConfig
) -> float:
    """``credit: turn``: a debater's last turn earns its final reward; an earlier one is paid
    for its own answer."""
    said = turns[s.agent]
    if s.turn == len(said) - 1:
        return final[s.agent]
    answer, stated = read_answer(said[s.turn])
    label = str(s.label)
    return cfg.correct_weight * same(answer, label) - cfg.format_penalty * (not stated)
