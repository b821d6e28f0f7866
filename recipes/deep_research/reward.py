"""deep_research reward: exact match and token F1 of the final answer (SQuAD normalisation,
several gold answers), a format term, and the searcher rewarded by the main agent's outcome;
None for every sample of an episode in which a retriever call failed.

With gold answers G and the agent's final answer a (None when it never answered):

    EM(a)     = max over g in G of [normalize(a) == normalize(g)]
    F1(a)     = max over g in G of token F1(normalize(a), normalize(g))
    score(a)  = em_weight * EM(a) + f1_weight * F1(a)            (0 when a is None)
    agent     = score(a) + format_weight * format_ok               format_ok = answered and no
                                                                   malformed turn
    searcher  = outcome:           score(a)
                outcome_format:    score(a) + format_weight * its own format_ok (it wrote a
                                   <summary> and no malformed turn)
                answer_in_summary: 1 if some normalize(g) occurs, token-aligned, in
                                   normalize(summary), else 0
                none:              None (not trained on)
    verifier, answerer (workflow routed): as the agent; the verifier's format_ok = no malformed
                routing turn, the answerer's = it answered
    all       + evidence_weight * |support retrieved| / |support|  (if evidence_weight; support
                = the row's supporting document ids, retrieved = by all the episode's searches
                for the agent, by its own queries for a searcher; 0 without support ids)
    masked:   None for every sample of an episode in which a retriever call failed after its
              retries (``metadata["retriever_failed"]``): the search engine, not the agents,
              decided that episode, so it is not trained on (a None reward has no advantage
              and no loss, as takes_two's failed judge) nor counted in evaluation

An answer that is empty after normalisation scores 0 (EM, F1 and ``answer_in`` alike), whatever
the gold answers. So does an answer that takes itself back, hedges or names several
(``answer_doubt``, against each gold answer in turn): a negation ("not Oslo", "Oslo is wrong"),
a hedge ("maybe Oslo", "about 1842", "Oslo?", "~1842") or an alternative ("Oslo or Rome",
"Oslo and Rome", "between 1840 and 1850", "1842 – 1850") that the gold answer itself does
not hold (the gold "No" may be answered "no"), wherever it stands in the answer: F1's partial
credit is for extra or missing words, not for an answer the reply does not commit to. (A
comma is not read as a list: "Santa Clara, California" keeps its F1; nor is length: a passage
copied as the answer keeps F1's small share, P = 1/len.) ``answer_metrics`` gives the episode
metrics of the final answer: ``exact_match`` (EM), ``f1`` (F1) and ``gold_in_answer``
(``answer_in`` of the answer: a gold answer occurs in it as whole normalised tokens, e.g.
"Mibek Brier" in "it was Mibek Brier"; 0 when the answer doubts it).

``normalize`` is SQuAD's: lower case, punctuation removed, the articles a/an/the removed,
whitespace collapsed. Token F1 = 2PR/(P+R) with P = common/len(pred), R = common/len(gold),
common counted with multiplicity.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence

from kernel.hooks import RewardResult, RolloutContext
from kernel.sample import Sample
from recipes.deep_research.config import (
    AGENT,
    ANSWERER,
    SEARCHER,
    VERIFIER,
    RecipeConfig,
    as_config,
)

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    """SQuAD answer normalisation."""
    text = str(text).lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


# kernel/answers.py's word lists, read on an answer's words: what takes it back, hedges it,
# or offers others ("and" too: "Oslo and Rome"; not "may", a month, nor "ca", California).
_DOUBT_WORDS = {
    "negated": frozenset(
        """
        not no never none neither nor cannot wrong incorrect false isnt arent wasnt werent dont
        doesnt didnt cant couldnt wouldnt wont aint
        """.split()  # noqa: SIM905 (a word list reads better as text)
    ),
    "hedged": frozenset(
        """
        maybe perhaps probably possibly likely unlikely presumably apparently guess think
        believe suppose assume might could unsure uncertain about approx approximately around
        roughly nearly almost circa
        """.split()  # noqa: SIM905
    ),
    "several answers": frozenset(
        "or either between whether if unless otherwise alternatively and".split()  # noqa: SIM905
    ),
}
# (not "&": this world's company names hold it, "Wexer & Sons", and so do sentence answers)
_DOUBT_SIGNS = {"?": "hedged", "¿": "hedged", "‽": "hedged", "~": "hedged", "∼": "hedged",
                "≈": "hedged", "≠": "negated", "¬": "negated"}  # fmt: skip
_RANGE = re.compile(r"\d\s*(?:[-–—]|\b(?:to|through|until|till)\b)\s*\d", re.IGNORECASE)
_APOSTROPHES = re.compile(r"['’‘`´]")


def _plain(text: str) -> str:
    """``text`` as the doubt check reads it: NFKC (full-width forms folded: "？" is "?"), lower
    case, no apostrophes ("isn't" -> "isnt")."""
    return _APOSTROPHES.sub("", unicodedata.normalize("NFKC", str(text)).lower())


def answer_doubt(answer: str, gold: str) -> str | None:
    """Why ``answer`` does not stand as one answer for ``gold`` ("rejected: negated",
    "rejected: hedged", "rejected: several answers"), or None: it holds a word of
    ``_DOUBT_WORDS``, a sign of ``_DOUBT_SIGNS`` ("?", "~", "≠") or a range between
    numbers ("1842 – 1850", "1842 to 1850") that ``gold`` does not hold itself."""
    said, truth = _plain(answer), _plain(gold)
    words, gold_words = set(re.findall(r"\w+", said)), set(re.findall(r"\w+", truth))
    if "&" in truth:  # "Wexer and Sons" answers "Wexer & Sons"
        gold_words.add("and")
    for kind, listed in _DOUBT_WORDS.items():
        if (words & listed) - gold_words:
            return f"rejected: {kind}"
    for sign, kind in _DOUBT_SIGNS.items():
        if sign in said and sign not in truth:
            return f"rejected: {kind}"
    if _RANGE.search(said) and not _RANGE.search(truth):
        return "rejected: several answers"
    return None


def gold_answers(label) -> list[str]:
    """The label as a list of gold answers (a string is one answer)."""
    if label is None:
        return []
    if isinstance(label, str):
        return [label]
    return [str(g) for g in label]


def exact_match(answer: str | None, golds: Sequence[str]) -> float:
    """1.0 when the normalised answer equals a normalised gold answer it does not doubt
    (``answer_doubt``), else 0.0."""
    a = normalize(answer) if answer is not None else ""
    return float(
        bool(a) and any(a == normalize(g) and answer_doubt(answer, g) is None for g in golds)
    )


def _f1(pred: list[str], gold: list[str]) -> float:
    if not pred or not gold:
        return float(pred == gold)
    same = sum((Counter(pred) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def f1_score(answer: str | None, golds: Sequence[str]) -> float:
    """The best token F1 of the answer against a gold answer it does not doubt
    (``answer_doubt``; 0 against one it does)."""
    pred = normalize(answer).split() if answer is not None else []
    if not pred or not golds:
        return 0.0
    return max(
        _f1(pred, normalize(g).split()) if answer_doubt(answer, g) is None else 0.0 for g in golds
    )


def answer_in(text: str | None, golds: Sequence[str]) -> float:
    """1.0 if some gold answer occurs in ``text`` as whole normalised tokens."""
    if not text:
        return 0.0
    padded = f" {normalize(text)} "
    return float(any(n and f" {n} " in padded for n in map(normalize, golds)))


def answer_metrics(answer: str | None, label) -> dict[str, float]:
    """The episode metrics of a final answer (None: never answered): ``exact_match``, ``f1``
    and ``gold_in_answer`` (module docstring)."""
    golds = gold_answers(label)
    standing = [g for g in golds if answer is not None and answer_doubt(answer, g) is None]
    return {
        "exact_match": exact_match(answer, golds),
        "f1": f1_score(answer, golds),
        "gold_in_answer": answer_in(answer, standing),
    }


def answer_score(answer: str | None, label, cfg: RecipeConfig) -> float:
    """``em_weight * EM + f1_weight * F1`` of the answer (0 when None)."""
    golds = gold_answers(label)
    return cfg.em_weight * exact_match(answer, golds) + cfg.f1_weight * f1_score(answer, golds)


def evidence(sample: Sample) -> float:
    """The share of the row's supporting documents among those the sample's searches
    retrieved (0 when the row names none)."""
    support = set(sample.metadata.get("support") or ())
    retrieved = set(sample.metadata.get("retrieved") or ())
    return len(support & retrieved) / len(support) if support else 0.0


def score_sample(sample: Sample, cfg: RecipeConfig) -> float | None:
    """The reward of one sample of an episode (formulas in the module docstring)."""
    meta = sample.metadata
    if meta.get("retriever_failed"):
        return None
    outcome = answer_score(meta.get("final_answer"), sample.label, cfg)
    if sample.agent in (AGENT, VERIFIER, ANSWERER):  # the routed workflow's roles score alike
        score = outcome + cfg.format_weight * float(meta["format_ok"])
    elif sample.agent != SEARCHER:
        raise ValueError(f"sample {sample.key}: unknown agent {sample.agent!r}")
    elif cfg.searcher_reward == "none":
        return None
    elif cfg.searcher_reward == "outcome":
        score = outcome
    elif cfg.searcher_reward == "outcome_format":
        score = outcome + cfg.format_weight * float(meta["format_ok"])
    else:
        score = answer_in(meta.get("summary"), gold_answers(sample.label))
    return score + cfg.evidence_weight * evidence(sample) if cfg.evidence_weight else score


def reward(ctx: RolloutContext, samples: list[Sample]) -> RewardResult:
    """One reward per sample, in order (the main agent's, then one per searcher call)."""
    cfg = as_config(ctx.config)
    return [score_sample(s, cfg) for s in samples]
