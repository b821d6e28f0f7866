"""PRO/CON debate (``style: procon``, MRLM's debate): two debaters are assigned opposite sides
of a motion and argue them for ``rounds`` rounds (an opening, then rebuttals that answer the
other's last speech); a judge scores each side's speeches on argument quality, evidence and
consistency with its assigned side.

Sides alternate with the episode (``sample.index``): the first debater argues PRO in even
episodes and CON in odd ones, so one model cannot learn a side instead of arguing.

The rule judge (``judge: rules``) scores one speech, each part in [0, 1]:

- consistency: 1 when its last ``Position: PRO|CON`` line is its side; 0 without one; and
  ``-1`` when it states the other side or concedes ("I agree with my opponent"): arguing the
  wrong side costs more than saying nothing;
- evidence: distinct sentences of at least ``min_sentence_words`` words that bring evidence --
  a number or percentage, "for example", "according to", "studies"/"research"/"data" -- counted
  once per sentence, up to 3 (so 3 such sentences give 1.0);
- quality: distinct sentences of that length that give a reason ("because", "since",
  "therefore", "as a result", "which means", "leads to"), up to 3, times the share of its
  sentences that are its own (not copied from the other's speeches) and times a length factor
  (1 within ``min_words``..``max_words``, falling linearly to 0 at half and double).

Stuffing one marker many times, repeating a sentence, quoting the opponent or writing short
fragments earns nothing more (tests/recipes/test_debate_procon.py pins each); what a rule cannot
see -- whether a reason is true or relevant -- it does not score, which is what ``judge: model``
is for: agent ``judge`` reads the motion and both sides' last speeches and replies with
``PRO: quality=Q evidence=E consistency=C`` and the same for CON, each 0-10; a reply that does
not parse scores both sides by the rules instead and costs the judge ``format_penalty``.

A debater's reward is the mean over its speeches of ``quality_weight * quality +
evidence_weight * evidence + consistency_weight * consistency`` (the model judge scores its
last speech). Metrics per debate: each part per side, ``pro_score``, ``con_score``,
``judge_parsed``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

from kernel.dialogue import Dialogue
from kernel.hooks import RolloutContext
from kernel.sample import Sample
from recipes.debate import prompts
from recipes.debate.config import JUDGE, RecipeConfig

SIDES = ("PRO", "CON")
_POSITION = re.compile(r"position\s*:\s*\**\s*(pro|con)\b", re.I)
_CONCEDE = re.compile(r"\bi (?:now )?agree with (?:my opponent|you|the other side)\b", re.I)
_EVIDENCE = re.compile(
    r"\d|\bper ?cent\b|\bfor (?:example|instance)\b|\baccording to\b|\b(?:studies|study|research|"
    r"data|survey|surveys|statistics)\b",
    re.I,
)
_REASON = re.compile(
    r"\b(?:because|since|therefore|as a result|which means|leads? to|so that|thus)\b", re.I
)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_JUDGED = re.compile(
    r"\b(PRO|CON)\s*:\s*quality\s*=\s*(\d+(?:\.\d+)?)\s*,?\s*evidence\s*=\s*(\d+(?:\.\d+)?)"
    r"\s*,?\s*consistency\s*=\s*(\d+(?:\.\d+)?)",
    re.I,
)
PARTS = ("quality", "evidence", "consistency")


def side_of(cfg: RecipeConfig, name: str, index: int) -> str:
    """The side ``name`` argues in episode ``index``: the first debater PRO in even episodes."""
    first = cfg.debaters.index(name) == 0
    return SIDES[0] if first == (index % 2 == 0) else SIDES[1]


def _sentences(text: str, min_words: int) -> list[str]:
    """The text's distinct sentences of at least ``min_words`` words, normalised."""
    out: list[str] = []
    for raw in _SENTENCE.split(_POSITION.sub("", text)):
        words = re.findall(r"[a-z0-9%']+", raw.lower())
        norm = " ".join(words)
        if len(words) >= min_words and norm not in out:
            out.append(norm)
    return out


def stated_position(text: str) -> str | None:
    found = _POSITION.findall(text)
    return found[-1].upper() if found else None


def rule_scores(text: str, side: str, others: Sequence[str], cfg: RecipeConfig) -> dict[str, float]:
    """quality, evidence and consistency of one speech arguing ``side`` (module docstring);
    ``others``: the other debater's speeches (sentences copied from them are not its own)."""
    stated = stated_position(text)
    if _CONCEDE.search(text) or (stated is not None and stated != side):
        consistency = -1.0
    else:
        consistency = float(stated == side)
    sentences = _sentences(text, cfg.min_sentence_words)
    theirs = {s for o in others for s in _sentences(o, cfg.min_sentence_words)}
    own = [s for s in sentences if s not in theirs]
    evidence = min(sum(bool(_EVIDENCE.search(s)) for s in own), 3) / 3
    reasons = min(sum(bool(_REASON.search(s)) for s in own), 3) / 3
    words = len(text.split())
    if words < cfg.min_words:
        length = max(0.0, 2 * words / cfg.min_words - 1)
    elif words > cfg.max_words:
        length = max(0.0, 2 - words / cfg.max_words)
    else:
        length = 1.0
    originality = len(own) / len(sentences) if sentences else 0.0
    return {
        "quality": reasons * originality * length,
        "evidence": evidence,
        "consistency": consistency,
    }


def parse_judge(text: str | None) -> dict[str, dict[str, float]] | None:
    """``{PRO: {quality, evidence, consistency}, CON: {...}}`` in [0, 1] from a judge's reply
    (the last line of each side; scores 0-10), or None unless both sides parse in range."""
    if text is None:
        return None
    found: dict[str, dict[str, float]] = {}
    for side, *values in _JUDGED.findall(text):
        scores = [float(v) for v in values]
        if any(v > 10 for v in scores):
            return None
        found[side.upper()] = {p: v / 10 for p, v in zip(PARTS, scores, strict=True)}
    return found if set(found) == set(SIDES) else None


def total(scores: dict[str, float], cfg: RecipeConfig) -> float:
    return (
        cfg.quality_weight * scores["quality"]
        + cfg.evidence_weight * scores["evidence"]
        + cfg.consistency_weight * scores["consistency"]
    )


async def generate(ctx: RolloutContext, sample: Sample, cfg: RecipeConfig) -> list[Sample | None]:
    """One PRO/CON debate about ``sample``'s motion (the recipe's generate hook, procon)."""
    motion = str(sample.prompt)
    sides = {name: side_of(cfg, name, sample.index) for name in cfg.debaters}
    dialogues = {
        name: Dialogue(
            ctx.agents[name], prompts.procon_system(name, sides[name], cfg.rounds), motion
        )
        for name in cfg.debaters
    }
    if not all(d.fits for d in dialogues.values()):
        raise ValueError(f"sample {sample.key}: the motion does not fit a debater's context")
    speeches: dict[str, list[str]] = {name: [] for name in cfg.debaters}
    for round_ in range(cfg.rounds):
        said = await asyncio.gather(*(d.speak() for d in dialogues.values()))
        if any(text is None for text in said):
            break
        for name, text in zip(cfg.debaters, said, strict=True):
            speeches[name].append(text)
        if round_ + 1 == cfg.rounds:
            break
        (a, b) = cfg.debaters
        rebut = [
            dialogues[a].say("user", prompts.procon_rebut(speeches[b][-1], cfg.max_quote_chars)),
            dialogues[b].say("user", prompts.procon_rebut(speeches[a][-1], cfg.max_quote_chars)),
        ]
        if not all(rebut):
            break
    if not all(speeches.values()):
        raise ValueError(f"sample {sample.key}: a debater could not speak within its context")
    record = {"debate": speeches, "sides": sides}
    judge_sample = None
    if cfg.judge == "model":
        last = {sides[n]: speeches[n][-1] for n in cfg.debaters}
        view = prompts.procon_judge_view(motion, last, cfg.max_quote_chars)
        judge = Dialogue(ctx.agents[JUDGE], prompts.procon_judge_system(), view)
        record["verdict"] = await judge.speak() if judge.fits else None
        judge_sample = judge.sample(sample, **record)
    return [*(dialogues[n].sample(sample, **record) for n in cfg.debaters), judge_sample]


def reward(samples: list[Sample], cfg: RecipeConfig) -> dict[str, float]:
    """Each debater's score (module docstring), the model judge's format reward, the metrics."""
    first = samples[0]
    speeches: dict[str, list[str]] = first.metadata["debate"]
    sides: dict[str, str] = first.metadata["sides"]
    judged = parse_judge(first.metadata.get("verdict")) if cfg.judge == "model" else None
    parts: dict[str, dict[str, float]] = {}
    rewards: dict[str, float] = {}
    for name in cfg.debaters:
        (other,) = [o for o in cfg.debaters if o != name]
        if judged is not None:
            parts[name] = judged[sides[name]]
            rewards[name] = total(parts[name], cfg)
            continue
        each = [rule_scores(t, sides[name], speeches[other], cfg) for t in speeches[name]]
        parts[name] = {p: sum(s[p] for s in each) / len(each) for p in PARTS}
        rewards[name] = sum(total(s, cfg) for s in each) / len(each)
    if cfg.judge == "model":
        rewards[JUDGE] = -cfg.format_penalty * (judged is None)
    metrics = {f"{sides[n].lower()}_{p}": parts[n][p] for n in cfg.debaters for p in PARTS}
    metrics |= {f"{sides[n].lower()}_score": rewards[n] for n in cfg.debaters}
    metrics["judge_parsed"] = float(judged is not None) if cfg.judge == "model" else 1.0
    first.metadata.setdefault("metrics", {}).update(metrics)
    return rewards
