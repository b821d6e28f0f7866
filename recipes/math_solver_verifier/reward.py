"""Math reward: pull the final answer out of a response and check it against the label with
math-verify, plus the recipe's reward hook.

Three layers, each usable on its own:

- ``extract_answer`` finds the ONE final answer a response states (``find_answer`` also
  says why there is none). Once a marker occurs -- a ``\\boxed{...}`` (braces matched, so
  ``\\boxed{\\frac{1}{\\sqrt{2}}}`` works), ``\\boxed 5``, or a text marker such as
  ``"answer is"`` (its answer: to the end of the clause, an equation's right-hand side) --
  the LAST marked answer is the answer, and nothing else in the response can be: negated
  ("not 5"), hedged ("maybe 5", "5?"), naming several candidates ("4 or 5", "4, 5", "between
  4 and 5") or refused by ``accept`` it does not stand. Only a response with no marker at
  all answers with a number (``last_number``, the recipe's default: small models state the
  result without boxing it), the ONE number of its last sentence or the result it states as
  an equation ("So 3 + 4 = 7." -> 7; "= 7 or 8", "= 6 = 7": no answer). With
  ``after_think`` only text after the last ``</think>`` counts. Extraction
  is the one place with hand-written string handling: it decides *where* the answer is and
  whether the reply commits to it, never whether it is right. This module finds the markers
  and a box's span; ``kernel.answers`` (shared with the debate recipe) reads the clause
  around an answer and the last sentence's number.
- ``is_equivalent`` decides whether an answer equals the label, entirely through math-verify
  (``parse`` + ``verify``): 1/2 == 0.5 == \\frac{1}{2}, 1,000 == 1000, {1,2} == {2,1}, 50\\% == 0.5.
  It never raises; errors and timeouts count as "not equivalent". It compares in a worker
  process killed at ``timeout_s``: a tower of powers (``9^{9^{9^{9}}}``) that math-verify would
  evaluate for hours costs the scorer seconds, not the run.
- ``score`` combines them into 1.0 / 0.0 / ``format_penalty``: 0.0 for a wrong answer and
  for a stated answer that does not stand, ``format_penalty`` only when nothing was stated.
  When the label is a number (``is_number``), so must the answer be (``numbers_only``, the
  default): a candidate that is an expression, such as ``\\boxed{5 - 3}`` for "Calculate 5 -
  3.", is a rejected answer scoring 0.0 (whatever the reply computes after it), so a policy
  cannot score by restating the problem and letting math-verify evaluate it (a SmolLM2 run
  learned exactly that: 227 of 239 held-out answers scored right boxed the problem's own
  expression; tests/data/math_boxed_restatements.jsonl). ``read_answer`` is the answer
  ``score`` grades and why, for rescoring stored replies. The attacks this stops are pinned
  by tests/recipes/test_math_reward_adversarial.py.

The hook ``reward(ctx, samples)`` scores each sample by its role (see its docstring): solvers
and rewriters on their own answers, the selector and the verifier on their decisions; the
episode outcome the generate function stored in ``metadata["correct"]`` drives the kernel's
asymmetric weighting on top.

What math-verify does with a few edge cases (pinned by tests/recipes/test_math_reward.py):
trailing text units are dropped (``5\\text{ cm}`` == 5, ``5 apples`` == 5) but ``5 dollars`` is
read as a product of symbols and fails, and so does ``\\text{5 apples}`` (one symbol);
``e^{i\\pi}`` != -1 (``e`` is a symbol); ``\\pi`` != 3.14 (floats are compared to 6 decimals, so
1/3 == 0.333333 but 1/3 != 0.33); ``1.000`` is one, not a thousand; ``50\\%`` equals both 0.5
and 50; ``(1,2)`` is read as an open interval, so it is not equal to ``(2,1)``.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from kernel.answers import (
    NUMBER,
    clause_after_marker,
    clause_from,
    doubt,
    last_sentence_number,
    right_side,
    strip_end_token,
)
from kernel.env.workers import BlockingWorker
from kernel.hooks import RewardResult, RolloutContext
from kernel.sample import Sample
from kernel.sandbox import PARSE_LOCK

THINK_END = "</think>"

# Both sides are wrapped in \boxed{} before parsing, so a bare label ("\frac{1}{2}", "1/2",
# "5 apples") and an extracted answer go through the same LaTeX-then-expression path.
# boxed_match_priority=0 makes the box the first thing math-verify looks for.
_EXTRACTION = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())


@dataclass
class MathRewardConfig:
    """How a response is turned into a reward."""

    markers: tuple[str, ...] = ("\\boxed", "answer is")
    """where the answer is: LaTeX commands (\\boxed, \\fbox) or text ('Answer:'); last match wins"""
    last_number: bool = True
    """a response without any marker answers with the one number of its last sentence (none
    or several there: no answer); once a marker occurs, no bare number counts"""
    numbers_only: bool = True
    """when the label is a number, only a number is an answer (an integer, decimal or reduced
    fraction, signed, maybe with a unit or %): an expression like '5 - 3' or '12/4' that
    restates the problem is a rejected answer (0.0, no other number counts); labels that are
    not numbers (\\sqrt{2}, intervals) accept any expression math-verify reads"""
    after_think: bool = False
    """only text after the last </think> counts; a response without </think> has no answer"""
    format_penalty: float = 0.0
    """reward when the response states no answer at all (e.g. -0.5 to punish a missing
    \\boxed{}); a stated answer that does not stand scores 0.0"""
    timeout_s: int = 5
    """seconds one comparison may take (parse label, parse answer, compare), in a worker process
    killed at this deadline; 0: no limit"""
    max_answer_chars: int = 1000
    """an extracted answer longer than this is wrong without being parsed (sympy can hang)"""

    def validate(self) -> MathRewardConfig:
        if not self.markers or any(not isinstance(m, str) or not m.strip() for m in self.markers):
            raise ValueError(f"markers must be non-empty strings, got {self.markers!r}")
        if not math.isfinite(self.format_penalty):
            raise ValueError(f"format_penalty must be finite, got {self.format_penalty}")
        if self.timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {self.timeout_s}")
        if self.max_answer_chars < 1:
            raise ValueError(f"max_answer_chars must be >= 1, got {self.max_answer_chars}")
        return self


# ---- extraction -----------------------------------------------------------------------------

# A number as a final answer: signed integer or decimal (thousands separators allowed), or a
# fraction a/b or \frac{a}{b}; then maybe a percent sign or a unit (\text{cm}, "apples").
_LITERAL = re.compile(
    r"""[+-]?(?:
        (?P<int>\d+(?:,\d{3})*|\d{1,3}(?:\{,\}\d{3})+)(?:\.\d+)?
      | (?P<num>\d+)\s*/\s*(?P<den>\d+)
      | \\[dt]?frac\s*\{\s*(?P<fnum>\d+)\s*\}\s*\{\s*(?P<fden>\d+)\s*\}
    )
    \s*(?:\\?%|\\text\s*\{\s*[A-Za-z ]*\}|\\mathrm\s*\{\s*[A-Za-z ]*\}|[A-Za-z]+)?""",
    re.VERBOSE,
)
# Wrappers around an answer that change nothing: math mode, bold, spacing commands.
_WRAPPERS = re.compile(r"^\$+|\$+$|^\\\(|\\\)$|\\[,;!: ]|\*\*")


def is_number(text: str | None) -> bool:
    """Whether ``text`` is a number written as a final answer: "-8", "1,000", "2.5", "3/4",
    "\\frac{3}{4}", "50\\%", "5 \\text{cm}". Not an expression: "5 - 3", "2 * 4", "-(-3)", and
    not a fraction that is not reduced ("6/3", "\\frac{4}{2}": the problem's division, restated).
    """
    if not isinstance(text, str):
        return False
    text = _WRAPPERS.sub("", text.strip()).strip().replace("−", "-")
    m = _LITERAL.fullmatch(text)
    if m is None:
        return False
    num, den = m.group("num") or m.group("fnum"), m.group("den") or m.group("fden")
    return num is None or (int(den) > 1 and math.gcd(int(num), int(den)) == 1)


def _matching_braces(text: str) -> dict[int, int]:
    """Position of each '{' -> position of its matching '}', in one pass (O(n), so a huge or
    adversarial response cannot make extraction quadratic). Escaped braces (\\{ \\}) are
    literal characters in LaTeX, not groups, and are skipped."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def _command_spans(text: str, command: str, pairs: dict[int, int]) -> list[tuple[int, int, int]]:
    """(position, argument start, argument end) of every ``\\command{...}`` and
    ``\\command token``; the end is -1 for an unclosed ``\\command{`` or a bare ``\\command``.
    Spans, not slices: slicing the argument of every nested box would be quadratic."""
    found = []
    for m in re.finditer(re.escape(command) + r"(?![A-Za-z])", text):
        j = m.end()
        while j < len(text) and text[j] in " \t":
            j += 1
        if j < len(text) and text[j] == "{":
            found.append((m.start(), j + 1, pairs.get(j, -1)))
        elif j > m.end():  # "\boxed 5": the token after the space, as math-verify reads it
            token = re.match(r"[^\s$]*", text[j : j + 200]).group(0)
            found.append((m.start(), j, j + len(token)))
        else:  # a bare "\boxed": a marker that holds no answer
            found.append((m.start(), j, -1))
    return found


# Between a text marker and its answer: "the answer is equal to 5".
_FILLER = re.compile(r"(?:equal\s+to|equals|exactly|just|simply)\s+", re.I)
# The fallback's number: a plain one (kernel.answers.NUMBER) or a LaTeX fraction.
_SENTENCE_NUMBER = re.compile(r"\\[dt]?frac\s*\{\s*-?\d+\s*\}\s*\{\s*\d+\s*\}|" + NUMBER.pattern)

NO_ANSWER = "no answer"
"""``Found.why`` of a reply that states nothing: no marker with content, no fallback number"""


class Found(NamedTuple):
    """What ``find_answer`` read: the answer (None unless it stands) and why: "marked" (a
    marker's answer), "last number" (the fallback), ``NO_ANSWER``, or "rejected: ..." (a
    marked answer that does not stand: negated, hedged, several answers, not a number): the
    reply stated an answer, an invalid one."""

    answer: str | None
    why: str


def last_number(text: str) -> str | None:
    """The last number in ``text`` ("so 3 + 4 = 7." -> "7"; "= -8" -> "-8"), or None. Not
    the fallback answer (that is the ONE number of the last sentence)."""
    found = NUMBER.findall(text) if isinstance(text, str) else []
    return found[-1] if found else None


def _box_answer(text: str, start: int, a: int, b: int) -> Found | None:
    """The answer of the box at ``start`` holding ``text[a:b]``; None when it holds none
    (empty, unclosed, bare)."""
    if b < 0 or not text[a:b].strip():
        return None
    answer = text[a:b].strip()
    after, end = clause_from(text, b + 1)
    # enclosed: a box may hold "\text{no}"; "not 5" is no number anyway
    why = doubt(text, start, answer, end, after=after, enclosed=True)
    return Found(None, why) if why else Found(answer, "marked")


def _text_answer(text: str, start: int, end: int) -> Found | None:
    """The answer after the text marker ``text[start:end]``: the rest of its line (or, when
    that is empty, the next line with text) to the end of the clause; of an equation its
    right-hand side. None when nothing follows the marker."""
    if (clause := clause_after_marker(text, end)) is None:
        return None
    first, first_end = _FILLER.sub("", clause[0], count=1), clause[1]
    answer = re.sub(r"^\\\(|\\\)$", "", right_side(first)).strip()
    if not answer:
        return None
    why = doubt(text, start, first, first_end)
    return Found(None, why) if why else Found(answer, "marked")


def find_answer(
    text: str,
    markers: tuple[str, ...] = ("\\boxed",),
    after_think: bool = False,
    fallback_last_number: bool = False,
    accept: Callable[[str], bool] | None = None,
) -> Found:
    """The one final answer ``text`` states and why (``Found``); see ``extract_answer``."""
    if not isinstance(text, str):
        return Found(None, NO_ANSWER)
    if after_think:
        end = text.rfind(THINK_END)
        if end < 0:
            return Found(None, NO_ANSWER)
        text = text[end + len(THINK_END) :]
    # a unicode minus or an en dash is a minus (one character for one: positions stay)
    text = strip_end_token(text.replace("−", "-").replace("–", "-"))
    pairs = _matching_braces(text) if any(m.startswith("\\") for m in markers) else {}
    spans: list[tuple[int, int, int]] = []  # (start, argument start, end); end -2: text marker
    for marker in markers:
        if marker.startswith("\\"):
            spans += _command_spans(text, marker, pairs)
        else:
            spans += [(m.start(), m.end(), -2) for m in re.finditer(re.escape(marker), text, re.I)]
    if not spans:
        number = last_sentence_number(text, _SENTENCE_NUMBER) if fallback_last_number else None
        if number is None or (accept is not None and not accept(number)):
            return Found(None, NO_ANSWER)
        return Found(number, "last number")
    # the marker that starts last decides; one holding nothing (an empty or unclosed box, a
    # truncated "The answer is") is passed over for the one before, never for a bare number
    for start, a, b in sorted(spans, reverse=True):
        found = _text_answer(text, start, a) if b == -2 else _box_answer(text, start, a, b)
        if found is None:
            continue
        if found.answer is not None and accept is not None and not accept(found.answer):
            return Found(None, "rejected: not a number")
        return found
    return Found(None, NO_ANSWER)


def extract_answer(
    text: str,
    markers: tuple[str, ...] = ("\\boxed",),
    after_think: bool = False,
    fallback_last_number: bool = False,
    accept: Callable[[str], bool] | None = None,
) -> str | None:
    """The one final answer ``text`` states, or None when it states none or its answer does
    not stand (``find_answer`` tells which).

    Markers starting with a backslash are LaTeX commands: their brace argument (balanced,
    nested braces included) or, without braces, the next token. Other markers are text, any
    case: the rest of their line (the next line with text when it is empty) to the end of the
    clause, of an equation its right-hand side ("the final answer is 3 + 4 = 7." -> "7"). The
    match that starts last is THE answer; one holding nothing (``\\boxed{}``, an unclosed
    ``\\boxed{5``, a truncated "The answer is") is passed over for the one before. Once a
    marker occurs, nothing outside markers can be the answer. The answer does not stand when

    - its clause before the marker doubts it: a hedge or condition anywhere in the clause
      ("I think the answer is 5", "if ..."), a negation, approximation or alternative next to
      it, only filler words between ("The answer is not \\boxed{5}", "It is not true that
      the answer is 5", "\\boxed{4} or \\boxed{5}", "x \\neq \\boxed{5}"); so "the number that
      is not a factor is \\boxed{4}" stands, and so does "It is not 4, so the answer is 5"
      (the clause starts after the last ``.!?,;:``, think tag or connective: so, thus,
      therefore, hence, then, but, because, since, finally);
    - a text answer's own words doubt it: negated ("not 5", "isn't 5"), hedged ("probably
      5", "about 5"), several ("4 or 5", "5 or 5", "4 and 5", "between 4 and 5", "from 4 to
      5"); a box's content only hedged or several (a box may hold "\\text{no}");
    - the words after it in its clause doubt it ("\\boxed{5} is wrong", "\\boxed{5} or 6",
      "\\boxed{5} apples or 6"), a later clause of its sentence names another candidate or
      hedges ("5, 6", "5, or 6", "5, maybe"), or the sentence ends in "?"; a negation in a
      later clause is fine: "The answer is 5, not 6." states 5;
    - ``accept`` refuses it (e.g. not ``is_number``).

    Negations: not, no, never, none, neither, nor, cannot, wrong, incorrect, false, ...n't,
    \\neq. Hedges next to the answer: about, approx(imately), around, roughly, nearly, almost,
    circa, close, somewhere, "≈"; anywhere in its clause: maybe, perhaps, probably, possibly,
    (un)likely, presumably, apparently, guess, think, believe, suppose, assume, might, could,
    may, unsure, uncertain, estimate(d), "not sure". Alternatives next to it: or, either,
    between, range; anywhere: if, whether, unless, otherwise, alternatively.

    With ``fallback_last_number``, a text in which no marker occurs answers with the one
    number of its last sentence (after the last ``.!?`` before a space, or line break; a
    trailing end-of-turn token and period ignored) when the sentence has exactly one, or
    states one as an equation's result ("So 3 + 4 = 7." -> 7), and its clause does not doubt
    it (as above): a list, "= 7 or 8" or a restated problem ending in the label is no answer. With
    ``after_think``, only the text after the last ``</think>`` counts and no ``</think>``
    means None (the model never finished thinking).
    """
    return find_answer(text, markers, after_think, fallback_last_number, accept).answer


# ---- equivalence ----------------------------------------------------------------------------


def is_equivalent(
    answer: str | None, label: str, *, timeout_s: int = 5, max_chars: int = 1000
) -> bool:
    """Whether ``answer`` equals ``label`` mathematically, decided by math-verify.

    Never raises: None, an empty or over-long answer, one whose braces do not pair up (it would
    close the ``\\boxed{}`` it is read in), a math-verify error or a timeout are all False.
    The comparison runs in a worker process (``kernel.env.workers.BlockingWorker``, one per
    process, one comparison at a time) killed when it takes longer than ``timeout_s`` (0: no
    limit): math-verify evaluates integer powers, factorials and binomials while it parses
    (``9^{9^{9^{9}}}``), big-integer arithmetic that holds the GIL in C, which neither SIGALRM
    nor a thread can stop -- a process can be killed. Its memory is capped too
    (``VERIFY_MEMORY_MB``: a huge number is a MemoryError there, False here). Inside a hosted
    environment's worker (already under a deadline) it runs in place.
    """
    if answer is None or label is None:
        return False
    answer, label = str(answer).strip(), str(label).strip()
    if not answer or not label or len(answer) > max_chars or not _balanced(answer):
        return False
    limit = timeout_s if timeout_s > 0 else None
    try:
        return _VERIFIER.call(limit, _compare, answer, label, limit)
    except Exception:  # WorkerTimeout, WorkerLost, WorkerFailed: not shown equal
        return False


VERIFY_MEMORY_MB = 4096
"""Address-space limit of the process math-verify compares in (soft: MemoryError, no OOM kill)."""
_VERIFIER = BlockingWorker(preload=(__name__,), memory_mb=VERIFY_MEMORY_MB)


def _compare(answer: str, label: str, limit: int | None) -> bool:
    """math-verify's parse + verify, in ``_VERIFIER``'s worker: each step also bounded by
    SIGALRM where that works (a main thread), which ends sympy's own loops without costing the
    worker; the worker's deadline ends the rest."""
    if os.name != "posix" or threading.current_thread() is not threading.main_thread():
        limit = None
    try:
        options = {"extraction_config": _EXTRACTION, "parsing_timeout": limit}
        with PARSE_LOCK:  # sympy's parse_expr parses Python: not from two threads at once
            gold = parse(f"\\boxed{{{label}}}", **options)
            pred = parse(f"\\boxed{{{answer}}}", **options)
        return bool(gold and pred and verify(gold, pred, timeout_seconds=limit))
    except (Exception, TimeoutException):  # TimeoutException is a BaseException
        return False


def _balanced(text: str) -> bool:
    """Whether ``text``'s braces pair up: an answer is compared inside ``\\boxed{...}``, and one
    that closes that box itself ("7}{5", "5}\\boxed{7") would be read as something else."""
    depth = 0
    for ch in text:
        depth += (ch == "{") - (ch == "}")
        if depth < 0:
            return False
    return depth == 0


def read_answer(text: str, label: str, cfg: MathRewardConfig) -> Found:
    """The answer ``score`` grades and why (``find_answer`` with the config's markers,
    accepting only numbers when ``cfg.numbers_only`` and the label is one): for rescoring
    stored replies and reading why one scored what it did."""
    accept = is_number if cfg.numbers_only and is_number(str(label)) else None
    return find_answer(text, cfg.markers, cfg.after_think, cfg.last_number, accept)


def final_answer(text: str, label: str, cfg: MathRewardConfig) -> str | None:
    """The answer ``score`` grades, or None when there is none or it does not stand."""
    return read_answer(text, label, cfg).answer


def score(text: str, label: str, cfg: MathRewardConfig | None = None) -> float:
    """1.0 if the response's final answer equals ``label``; 0.0 if not, or if the answer it
    stated does not stand (negated, hedged, several, not a number: it answered, wrongly);
    ``cfg.format_penalty`` if it stated no answer at all."""
    cfg = cfg or MathRewardConfig()
    answer, why = read_answer(text, label, cfg)
    if answer is None:
        return cfg.format_penalty if why == NO_ANSWER else 0.0
    ok = is_equivalent(answer, label, timeout_s=cfg.timeout_s, max_chars=cfg.max_answer_chars)
    return 1.0 if ok else 0.0


# ---- the recipe's reward hook ---------------------------------------------------------------


def reward(ctx: RolloutContext, samples: list[Sample]) -> RewardResult:
    """One reward per sample, by role (the kernel then scales every sample of the episode by
    its outcome, ``metadata["correct"]``: x1.2 if right, x0.8 if wrong, when asymmetric):

    - solver, rewriter: 1.0 if its own final answer equals the label, 0.0 if not or if the
      answer it stated does not stand (``score``), ``format_penalty`` if it stated none;
    - selector: 1.0 if the solution it picked was right, 0.0 if not, ``format_penalty`` if it
      stated no valid ``Judgment: N``;
    - verifier: with ``verifier_reward: verdict`` 1.0 if its last verdict was right (approve
      exactly when the final answer is right), 0.0 if not; with ``outcome`` 1.0 if the final
      answer is right, 0.0 if not; ``format_penalty`` if its last verdict was malformed.
    """
    cfg = getattr(ctx.config, "answer", None) or MathRewardConfig()
    pay_outcome = getattr(ctx.config, "verifier_reward", "verdict") == "outcome"
    out: list[float | None] = []
    for s in samples:
        role, meta = s.metadata.get("role", s.agent), s.metadata
        if role in ("solver", "rewriter"):
            out.append(score(meta.get("text", ""), s.label, cfg))
        elif role == "selector":
            ok = meta.get("picked") is not None
            out.append(float(meta["correct"]) if ok else cfg.format_penalty)
        elif role == "verifier":
            last = (meta.get("verdicts") or [None])[-1]
            if last is None:
                out.append(cfg.format_penalty)
            else:
                out.append(float(meta["correct"] if pay_outcome else last == meta["correct"]))
        else:
            raise ValueError(f"sample {s.key}: unknown role {role!r}")
    return out
