"""Bilateral rewards of takes_two: one for the doctor, one for the patient, per episode.

Every term is its own small function, golden-tested in tests/recipes/test_takes_two_reward.py.
Text is compared on its *content words* (``content_words``: rapidfuzz's ``default_process``
lower-casing and punctuation stripping, minus a short stop-word list), and two words match when
rapidfuzz's ``fuzz.ratio`` of them reaches ``word_cutoff`` (so "day" matches "days").

Doctor (``doctor_reward``)::

    R_doctor = diagnosis_weight      * correct(diagnosis)                  * asked
             + recommendation_weight * sim(recommendation, true recommendation) * asked
             + information_weight    * mean_k gain_k
             - multi_question_penalty * (# question turns with 2+ '?')
             - no_diagnosis_penalty   * [no 'Diagnosis:' turn]
             - malformed_penalty      * [final turn lacks a non-empty Diagnosis or Recommendation]
             - early_diagnosis_penalty * [diagnosed after fewer than min_questions questions]

``correct`` is 1 when the diagnosis names exactly one condition and that condition is the truth
by the synonym table (``data.diagnosis_matches``: a list, a hedge, a broader name, a question
mark, negation or approximation sign in any script scores 0), and the words before its
'Diagnosis:' marker do not take it back (``marker_doubt``: "Not the diagnosis:", "Possible
diagnosis:", "I think the diagnosis:"), else 0. A *question* is a doctor turn that is not the
diagnosis and holds a '?' and a word (``asks_question``); ``asked`` is 1 when the doctor asked
at least ``min_questions`` of them before its closing turn, else 0: a diagnosis before the
required questions is not accepted.
``sim`` is the configured rapidfuzz scorer / 100, for the free-text recommendation (the
metric ``diagnosis_similarity`` still compares diagnoses so, only to compare with older runs).
``gain_k`` is the share of the self-report's facts that answer k reveals for the first time (a
fact is revealed when ``reveal_threshold`` of its content words occur in the answer; facts the
chief complaint already states are known from the start); the mean runs over the answered
questions (0 when none), so a question that reveals nothing new costs the doctor.

Skill apart from format: the episode metrics ``diagnosis_correct`` (``correct`` above, whatever
the format, from here) and ``questions_asked`` (the number of questions, from generate.py) say
what the doctor did; the reward mixes them with format. Where the doctor is shown the case's
candidate conditions, ``named_candidate`` (the diagnosis names exactly one of them, right or
wrong) tells picking from the list apart from telling the candidates apart: a doctor naming a
candidate at random is right one time in ``len(candidates)``.

Patient (``patient_rule_score``, plus the optional judge)::

    R_patient = faithfulness_weight * (share of the patient's content words found in the case)
              - leak_penalty        * [some answer leaks the diagnosis]
              + helpfulness_weight  * (share of the facts its answers revealed: facts_revealed)
              + outcome_weight      * correct(diagnosis) * asked      (the doctor's outcome)
              + judge.weight        * judge score (0..1, only when TANDEM_JUDGE_URL is set)

The case is the chief complaint, the self-report facts and the ``unknown_reply`` phrase; a word
found nowhere in it is an invented detail. An answer leaks when it holds ``leak_threshold`` of
the diagnosis words that the case itself does not contain, or all such words of one of its
synonyms (``leaks``). The two team terms (``team_score``,
0 by default) tie the patient to what the doctor achieves: the facts it gave the doctor and the
doctor's accepted diagnosis (the patient never sees the diagnosis). A judge call that fails
(after its retries) masks the patient's reward (None) and is counted in
``episode/judge_failed``; it never fails the step.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx
from rapidfuzz import fuzz, process, utils
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from kernel.answers import doubt
from kernel.hooks import RolloutContext
from kernel.redact import redact_url
from kernel.sample import Sample
from recipes.takes_two import prompts
from recipes.takes_two.config import DOCTOR, PATIENT, JudgeConfig, RecipeConfig, as_config
from recipes.takes_two.data import Case, diagnosis_matches, synonyms_for

log = logging.getLogger(__name__)

JUDGE_URL_ENV = "TANDEM_JUDGE_URL"
JUDGE_MODEL_ENV = "TANDEM_JUDGE_MODEL"
JUDGE_KEY_ENV = "TANDEM_JUDGE_API_KEY"

# Function words and conversational fillers: they say nothing about symptoms, so they neither
# reveal a fact nor count as invented. Contractions arrive split ("i've" -> "i", "ve").
STOPWORDS = frozenset(
    """
    a about after all also am an and any are as at be been before but by can could did didn do
    does doesn don doctor during feel feels felt for from get got had has hasn have haven having
    he her here him his how i if in into is isn it its just ll me my no not now of off ok okay on
    or our out over re really she should since so some sure than that the their them then there
    these they this those to too um up us ve very was wasn we well were what when where which
    while who why will with would yeah yes you your
    """.split()  # noqa: SIM905 (a word list reads better as text)
)

_DIAGNOSIS = re.compile(r"diagnosis\s*[:：]", re.IGNORECASE)
_RECOMMENDATION = re.compile(r"recommendation\s*[:：]", re.IGNORECASE)
# Words that make the name a 'Diagnosis:' marker gives one of several or a guess when they
# stand in the marker's clause ("Possible diagnosis: X", "Differential diagnosis: X"); the
# general hedges and negations ("Probably the diagnosis:", "Not the diagnosis:") are
# kernel.answers.doubt's.
_HEDGED_MARKER = re.compile(
    r"\b(?:possible|probable|potential|suspected|differential|tentative|provisional"
    r"|presumptive|presumed|preliminary|working)\b[^\n.!?,;:]*$",
    re.IGNORECASE,
)
_SCORE = re.compile(r"score\s*[:=]\s*\**\s*(\d+(?:\.\d+)?)", re.IGNORECASE)


# ---- text ------------------------------------------------------------------------------------


def content_words(text: str) -> list[str]:
    """Lower-cased words of ``text`` without punctuation, stop words and one-letter tokens."""
    return [w for w in utils.default_process(text).split() if len(w) > 1 and w not in STOPWORDS]


def _clean(text: str) -> str:
    return " ".join(content_words(text))


def similarity(a: str, b: str, metric: str = "token_set_ratio") -> float:
    """rapidfuzz's ``metric`` of the content words of ``a`` and ``b``, scaled to 0..1 (0 when
    either has no content words)."""
    return getattr(fuzz, metric)(a, b, processor=_clean) / 100.0


def word_found(word: str, vocab: Sequence[str], cutoff: float) -> bool:
    """Whether some word of ``vocab`` matches ``word`` with fuzz.ratio >= ``cutoff``."""
    return process.extractOne(word, vocab, scorer=fuzz.ratio, score_cutoff=cutoff) is not None


def coverage(words: Sequence[str], vocab: Sequence[str], cutoff: float) -> float | None:
    """Share of ``words`` found in ``vocab``; None when there are no words."""
    if not words:
        return None
    return sum(word_found(w, vocab, cutoff) for w in words) / len(words)


# ---- the doctor's final turn -----------------------------------------------------------------


@dataclass(frozen=True)
class Final:
    """The doctor's closing turn: what follows 'Diagnosis:' and 'Recommendation:', and why
    the words before the marker take the diagnosis back (``doubt``; None: they do not)."""

    diagnosis: str
    recommendation: str
    doubt: str | None = None

    @property
    def well_formed(self) -> bool:
        return bool(self.diagnosis) and bool(self.recommendation)


def marker_doubt(text: str, start: int) -> str | None:
    """Why the words before the 'Diagnosis:' marker at ``text[start]``, in its clause, take its
    diagnosis back ("rejected: negated", "rejected: hedged"), or None: a hedge or condition
    anywhere in the clause ("I think the diagnosis:"), a negation next to it ("Not the
    diagnosis:"; ``kernel.answers.doubt``, as math reads "Maybe the answer is 5"), or a word
    that makes it one of several or a guess ("Possible diagnosis:", "Differential diagnosis:",
    ``_HEDGED_MARKER``). An earlier sentence does not count: "It is not a cold. Diagnosis: X"."""
    if _HEDGED_MARKER.search(text[max(0, start - 300) : start]) is not None:
        return "rejected: hedged"
    # no answer words and no text after: only the marker's clause before it is read
    return doubt(text[: start + 1], start, "", start + 1)


def parse_final(text: str) -> Final | None:
    """The closing turn's parts (from the LAST 'Diagnosis:'), or None if ``text`` has no
    'Diagnosis:' (it is a question). A missing or misplaced 'Recommendation:' gives an empty
    recommendation, i.e. a malformed final turn. ``doubt``: ``marker_doubt`` of the marker."""
    found = list(_DIAGNOSIS.finditer(text))
    if not found:
        return None
    why = marker_doubt(text, found[-1].start())
    after = text[found[-1].end() :]
    rec = _RECOMMENDATION.search(after)
    if rec is None:
        return Final(after.strip(), "", why)
    return Final(after[: rec.start()].strip(), after[rec.end() :].strip(), why)


def stated_diagnosis(final: Final | None) -> str:
    """The diagnosis a final turn stands by: its text, or "" without a final turn or when the
    words before its marker take it back (``Final.doubt``)."""
    return final.diagnosis if final is not None and final.doubt is None else ""


# ---- doctor terms ----------------------------------------------------------------------------


def diagnosis_correct(final: Final | None, case: Case) -> float:
    """1.0 when the final turn's diagnosis names exactly one condition, the case's, by the
    synonym table (``data.diagnosis_matches``), and the words before its marker do not take it
    back (``marker_doubt``); else 0.0 (also without a final turn). A label with no synonyms
    raises ValueError naming it, diagnosed or not."""
    stated = stated_diagnosis(final)
    return float(diagnosis_matches(stated, case.diagnosis, case.synonyms) and bool(stated))


def candidate_named(final: Final | None, case: Case) -> float | None:
    """1.0 when the final diagnosis names exactly one of the case's candidate conditions (the
    right one or not), 0.0 when it names none or several (also without a final turn); None for
    a case without candidates."""
    if not case.candidates:
        return None
    stated = stated_diagnosis(final)
    named = [c for c in case.candidates if stated and diagnosis_matches(stated, c)]
    return float(len(named) == 1)


def diagnosis_score(final: Final | None, truth: str, metric: str) -> float:
    """Fuzzy similarity (0..1) of the stated diagnosis to the true one; 0 without a final turn.
    Reported as ``diagnosis_similarity``, never rewarded: token_set_ratio gives a list of
    diagnoses, or a broader name, the full 1.0."""
    return similarity(final.diagnosis, truth, metric) if final and final.diagnosis else 0.0


def recommendation_score(final: Final | None, truth: str, metric: str) -> float:
    """Similarity (0..1) of the stated recommendation to the true one; 0 if none."""
    return (
        similarity(final.recommendation, truth, metric) if final and final.recommendation else 0.0
    )


def revealed(facts: Sequence[str], text: str, cutoff: float, threshold: float) -> set[int]:
    """Indices of the facts whose content words occur in ``text`` for at least ``threshold``."""
    vocab = content_words(text)
    out = set()
    for i, fact in enumerate(facts):
        share = coverage(content_words(fact), vocab, cutoff)
        if share is not None and share >= threshold:
            out.add(i)
    return out


def information_gains(
    facts: Sequence[str],
    chief_complaint: str,
    answers: Sequence[str],
    cutoff: float,
    threshold: float,
) -> list[float]:
    """Per answered question: the share of all facts it reveals for the first time (facts the
    chief complaint states are known before the first question)."""
    if not facts:
        return [0.0] * len(answers)
    known = revealed(facts, chief_complaint, cutoff, threshold)
    gains = []
    for answer in answers:
        new = revealed(facts, answer, cutoff, threshold) - known
        known |= new
        gains.append(len(new) / len(facts))
    return gains


def information_score(gains: Sequence[float]) -> float:
    """Mean information gained per answered question; 0 when no question was answered."""
    return sum(gains) / len(gains) if gains else 0.0


def asks_several(turn: str) -> bool:
    """A question turn that asks more than one question (two or more '?')."""
    return turn.count("?") >= 2


def asks_question(turn: str) -> bool:
    """A doctor turn that asks the patient a question: not the diagnosis, and holds a '?' and
    a word (sympathy such as "I'm so sorry to hear that." asks nothing, nor does a bare "?")."""
    return parse_final(turn) is None and "?" in turn and re.search(r"\w", turn) is not None


def questions_asked(doctor_turns: Sequence[str]) -> int:
    """How many of the doctor's turns ask the patient a question (``asks_question``)."""
    return sum(asks_question(t) for t in doctor_turns)


def diagnosis_accepted(doctor_turns: Sequence[str], cfg: RecipeConfig) -> float:
    """1.0 when the doctor asked at least ``min_questions`` questions, so its closing diagnosis
    counts (for the doctor's terms and the patient's shared outcome), else 0.0."""
    return float(questions_asked(doctor_turns) >= cfg.min_questions)


def compliance_penalty(doctor_turns: Sequence[str], cfg: RecipeConfig) -> float:
    """Minus the penalties for the DOCTOR's own turns: several questions in one turn (each),
    no final diagnosis, a malformed final turn, a diagnosis after fewer than ``min_questions``
    questions (turns with a '?': a turn that asks nothing does not count). A well-formed
    episode scores exactly 0."""
    final = parse_final(doctor_turns[-1]) if doctor_turns else None
    questions = doctor_turns if final is None else doctor_turns[:-1]
    penalty = cfg.multi_question_penalty * sum(asks_several(q) for q in questions)
    if final is None:
        penalty += cfg.no_diagnosis_penalty
    else:
        if not final.well_formed:
            penalty += cfg.malformed_penalty
        if not diagnosis_accepted(doctor_turns, cfg):  # the closing turn asks nothing
            penalty += cfg.early_diagnosis_penalty
    return -penalty


def doctor_reward(
    case: Case, doctor_turns: Sequence[str], answers: Sequence[str], cfg: RecipeConfig
) -> tuple[float, dict[str, float]]:
    """The doctor's reward and its terms (unweighted, for the metrics; ``diagnosis_correct`` is
    the skill apart from format, beside generate's ``questions_asked``)."""
    final = parse_final(doctor_turns[-1]) if doctor_turns else None
    gains = information_gains(
        case.facts, case.chief_complaint, answers, cfg.word_cutoff, cfg.reveal_threshold
    )
    terms = {
        "diagnosis_correct": diagnosis_correct(final, case),
        "diagnosis_similarity": diagnosis_score(final, case.diagnosis, cfg.similarity),
        "recommendation_similarity": recommendation_score(
            final, case.recommendation, cfg.similarity
        ),
        "information_gain": information_score(gains),
        "facts_revealed": sum(gains),
        "compliance": compliance_penalty(doctor_turns, cfg),
    }
    if (named := candidate_named(final, case)) is not None:
        terms["named_candidate"] = named  # reported only
    accepted = diagnosis_accepted(doctor_turns, cfg)
    total = (
        cfg.diagnosis_weight * terms["diagnosis_correct"] * accepted
        + cfg.recommendation_weight * terms["recommendation_similarity"] * accepted
        + cfg.information_weight * terms["information_gain"]
        + terms["compliance"]
    )
    return total, terms


# ---- patient terms ---------------------------------------------------------------------------


def case_vocab(case: Case, unknown_reply: str) -> list[str]:
    """Every content word the patient may use: chief complaint, facts, the 'not sure' reply."""
    text = " ".join([case.chief_complaint, *case.facts, unknown_reply])
    return sorted(set(content_words(text)))


def faithfulness(answers: Sequence[str], vocab: Sequence[str], cutoff: float) -> float:
    """Share of the patient's content words found in the case (0 when it said nothing
    checkable: an empty or all-filler answer earns nothing)."""
    words = [w for a in answers for w in content_words(a)]
    share = coverage(words, vocab, cutoff)
    return 0.0 if share is None else share


def leaks(
    answer: str,
    diagnosis: str,
    vocab: Sequence[str],
    cutoff: float,
    threshold: float,
    synonyms: Sequence[str] = (),
) -> bool:
    """Whether ``answer`` names the diagnosis: it holds at least ``threshold`` of the diagnosis
    words the case does not already contain (a patient may repeat its own complaint; words
    match fuzzily, so "migrane" and "mi-graine" leak "migraine"), or ALL of those words of one
    of its ``synonyms``, matched exactly ("hay fever" for allergic rhinitis, "flu" for
    influenza; exactly, so that "stay" is not "sty", and all, so that "low" alone is not
    "mechanical low back pain")."""
    said = content_words(answer)
    secret = [w for w in content_words(diagnosis) if not word_found(w, vocab, cutoff)]
    share = coverage(secret, said, cutoff)
    if share is not None and share >= threshold:
        return True
    for name in synonyms:
        secret = [w for w in content_words(name) if not word_found(w, vocab, cutoff)]
        if secret and set(secret) <= set(said):
            return True
    return False


def patient_rule_score(
    case: Case, answers: Sequence[str], cfg: RecipeConfig
) -> tuple[float, dict[str, float]]:
    """The patient's rule-based reward and its terms (a leak by the diagnosis or any of its
    synonyms, ``data.synonyms_for``)."""
    vocab = case_vocab(case, cfg.unknown_reply)
    names = sorted(synonyms_for(case.diagnosis, case.synonyms))
    terms = {
        "faithfulness": faithfulness(answers, vocab, cfg.word_cutoff),
        "leaked": float(
            any(
                leaks(a, case.diagnosis, vocab, cfg.word_cutoff, cfg.leak_threshold, names)
                for a in answers
            )
        ),
    }
    total = cfg.faithfulness_weight * terms["faithfulness"] - cfg.leak_penalty * terms["leaked"]
    return total, terms


def team_score(doctor_terms: Mapping[str, float], accepted: float, cfg: RecipeConfig) -> float:
    """The patient's share of the team's result, from the doctor's terms: the facts the
    patient's answers revealed and the doctor's correct diagnosis when it is ``accepted``
    (``diagnosis_accepted``; see the module docstring)."""
    return (
        cfg.helpfulness_weight * doctor_terms["facts_revealed"]
        + cfg.outcome_weight * doctor_terms["diagnosis_correct"] * accepted
    )


# ---- the optional judge ----------------------------------------------------------------------


class JudgeError(RuntimeError):
    """The judge's reply could not be used (HTTP errors are httpx.HTTPError)."""


@dataclass(frozen=True)
class JudgeEndpoint:
    """An OpenAI-compatible chat endpoint: ``{url}/chat/completions``. The API key goes as a
    Bearer token; a ``user:password@`` in the URL goes as basic auth only when there is no key
    (one Authorization header: the key wins). Logs show the URL with its password as ``***``."""

    url: str
    model: str = "judge"
    api_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> JudgeEndpoint | None:
        """From TANDEM_JUDGE_URL / TANDEM_JUDGE_MODEL / TANDEM_JUDGE_API_KEY; None if no URL."""
        env = os.environ if env is None else env
        url = env.get(JUDGE_URL_ENV, "").strip()
        if not url:
            return None
        return cls(url.rstrip("/"), env.get(JUDGE_MODEL_ENV) or "judge", env.get(JUDGE_KEY_ENV))

    def request(self) -> tuple[str, dict[str, str], httpx.BasicAuth | None]:
        """The base URL without its userinfo (so no error message repeats a password), the
        headers and the basic auth of a request (see the class docstring)."""
        parts = urlsplit(self.url)
        base = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        if self.api_key:
            return base, {"Authorization": f"Bearer {self.api_key}"}, None
        if parts.username is None:
            return base, {}, None
        return base, {}, httpx.BasicAuth(unquote(parts.username), unquote(parts.password or ""))


def parse_judge_score(text: str) -> float:
    """The last 'Score: N' (0 <= N <= 10) of the judge's reply, scaled to 0..1."""
    found = _SCORE.findall(text or "")
    if not found or not 0 <= float(found[-1]) <= 10:
        raise JudgeError(f"no 'Score: N' with 0 <= N <= 10 in the judge's reply {text!r:.120}")
    return float(found[-1]) / 10.0


async def judge_patient(
    endpoint: JudgeEndpoint, cfg: JudgeConfig, messages: list[dict[str, str]]
) -> float:
    """Ask the judge; retry (exponential backoff) on HTTP errors and unusable replies; raise
    the last error after ``1 + retries`` attempts."""
    url, headers, auth = endpoint.request()
    body = {
        "model": endpoint.model,
        "messages": messages,
        "temperature": cfg.temperature,
        "max_tokens": cfg.max_tokens,
    }
    retrying = AsyncRetrying(
        stop=stop_after_attempt(1 + cfg.retries),
        wait=wait_exponential(multiplier=cfg.backoff_s, min=0, max=8),
        retry=retry_if_exception_type((httpx.HTTPError, JudgeError)),
        reraise=True,
    )
    async with httpx.AsyncClient(timeout=cfg.timeout_s, headers=headers, auth=auth) as client:
        async for attempt in retrying:
            with attempt:
                r = await client.post(f"{url}/chat/completions", json=body)
                r.raise_for_status()
                try:
                    content = r.json()["choices"][0]["message"]["content"]
                except (ValueError, KeyError, IndexError, TypeError) as e:
                    raise JudgeError(f"not a chat completion: {r.text[:120]!r}") from e
                return parse_judge_score(content)
    raise AssertionError("unreachable: tenacity reraises the last error")


# ---- the recipe's reward hook ----------------------------------------------------------------


async def reward(ctx: RolloutContext, samples: list[Sample]) -> dict[str, float | None]:
    """``{doctor: R_doctor, patient: R_patient}`` for one episode (see the module docstring).

    Reads the dialogue the generate function stored in ``metadata`` (``doctor_turns``,
    ``answers``); adds the reward terms to the episode metrics and sets ``metadata["correct"]``
    (``diagnosis_correct``: one condition, the true one by the synonym table) on every sample.
    The patient's reward is None when it never answered, or when the judge is configured and
    failed.
    """
    cfg = as_config(ctx.config)
    by_agent = {s.agent: s for s in samples}
    first = by_agent.get(DOCTOR, samples[0])
    case = Case.from_sample(first)
    doctor_turns = list(first.metadata.get("doctor_turns", []))
    answers = list(first.metadata.get("answers", []))
    metrics = first.metadata.setdefault("metrics", {})

    r_doctor, terms = doctor_reward(case, doctor_turns, answers, cfg)
    metrics.update(terms)
    r_patient: float | None = None
    if answers:
        r_patient, p_terms = patient_rule_score(case, answers, cfg)
        metrics.update(p_terms)
        r_patient += team_score(terms, diagnosis_accepted(doctor_turns, cfg), cfg)
        endpoint = JudgeEndpoint.from_env()
        if endpoint is not None:
            r_patient = await _with_judge(
                endpoint, cfg, case, doctor_turns, answers, r_patient, first
            )
    correct = terms["diagnosis_correct"] == 1.0
    for s in samples:
        s.metadata["correct"] = correct
    return {DOCTOR: r_doctor, PATIENT: r_patient}


async def _with_judge(
    endpoint: JudgeEndpoint,
    cfg: RecipeConfig,
    case: Case,
    doctor_turns: list[str],
    answers: list[str],
    rule: float,
    carrier: Sample,
) -> float | None:
    """``rule`` plus the weighted judge score, or None (and judge_failed=1) if the judge fails."""
    metrics = carrier.metadata["metrics"]
    messages = [
        {"role": "system", "content": prompts.JUDGE_SYSTEM},
        {
            "role": "user",
            "content": prompts.judge_user(
                case.chief_complaint, case.facts, case.diagnosis, doctor_turns, answers
            ),
        },
    ]
    try:
        score = await judge_patient(endpoint, cfg.judge, messages)
    except Exception as e:  # any failure masks the patient sample; the step goes on
        url = redact_url(endpoint.url)
        log.warning("judge at %s failed for episode %s: %r", url, carrier.key, e)
        metrics["judge_failed"] = 1.0
        carrier.metadata["judge_error"] = repr(e)
        return None
    metrics["judge_failed"] = 0.0
    metrics["judge_score"] = score
    return rule + cfg.judge.weight * score
