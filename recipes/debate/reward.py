"""debate's reward: every debater's final answer against the label, and the debate's verdict.

Per debater (``RecipeConfig`` holds the weights)::

    R = correct_weight * [its final answer is right]
      + verdict_weight * [the verdict is right and is its final answer]
      - format_penalty * [its final turn states no answer]

With ``credit: turn`` each round's turn is a sample of its own: the last round's earns R, an
earlier round's ``correct_weight * [its answer that round is right] - format_penalty * [none]``.

The verdict is the majority of the final answers (``judge: majority``; a tie goes to the
earliest debater among the tied; no answer at all: no verdict) or the judge agent's stated
answer (``judge: model``), whose own reward is ``correct_weight * [verdict right] -
format_penalty * [no answer]``. An answer is the last ``Answer: X`` of a turn, else its last
number; answers compare as numbers when both parse as numbers, else as stripped text.
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

from kernel.hooks import RolloutContext
from kernel.sample import Sample
from recipes.debate import procon
from recipes.debate.config import JUDGE, RecipeConfig, as_config

_ANSWER = re.compile(r"answer\s*(?:is)?\s*[:=]?\s*\**\s*(-?\d[\d,]*(?:\.\d+)?(?:/\d+)?)", re.I)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def extract_answer(text: str) -> str | None:
    """The turn's answer: the last ``Answer: X`` (or "answer is X"), else its last number;
    None when it has neither. Thousands separators are dropped."""
    found = _ANSWER.findall(text) or _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


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
    """The most common stated answer (compared as ``same`` does); a tie goes to the answer of
    the earliest debater in ``order`` among the tied; None when nobody stated one."""
    stated = [(name, finals.get(name)) for name in order if finals.get(name) is not None]
    if not stated:
        return None
    votes = Counter()
    first: dict[str, str] = {}  # canonical answer -> the first stated form
    for _, answer in stated:
        key = next((k for k in first if same(answer, k)), answer)
        first.setdefault(key, answer)
        votes[key] += 1
    top = max(votes.values())
    return next(first[k] for k in first if votes[k] == top)


def debater_reward(final: str | None, verdict: str | None, label: str, cfg: RecipeConfig) -> float:
    right = same(final, label)
    won = (
        verdict is not None and same(verdict, label) and final is not None and same(final, verdict)
    )
    missing = final is None
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
    finals = {name: extract_answer(turns[name][-1]) for name in cfg.debaters}
    if cfg.judge == "model":
        verdict_text = first.metadata.get("verdict")
        verdict = extract_answer(verdict_text) if verdict_text is not None else None
    else:
        verdict = majority(finals, cfg.debaters)
    rewards = {name: debater_reward(finals[name], verdict, label, cfg) for name in cfg.debaters}
    correct = verdict is not None and same(verdict, label)
    if cfg.judge == "model":
        rewards[JUDGE] = cfg.correct_weight * correct - cfg.format_penalty * (verdict is None)
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
    answer = extract_answer(said[s.turn])
    label = str(s.label)
    return cfg.correct_weight * same(answer, label) - cfg.format_penalty * (answer is None)
