"""Math reward: pull the final answer out of a response and check it against the label with
math-verify, plus the recipe's reward hook.

Three layers, each usable on its own:

- ``extract_answer`` finds the final answer in a response: the content of the LAST complete
  ``\\boxed{...}`` (braces matched, so ``\\boxed{\\frac{1}{\\sqrt{2}}}`` works), ``\\boxed 5``,
  or what follows a text marker such as ``"answer is"`` up to the end of its clause; failing
  every marker, the last number of the response (``last_number``, the recipe's default: small
  models state the result without boxing it); with ``after_think`` only text after the last
  ``</think>`` counts. Extraction is the one place with hand-written string handling: it
  decides *where* the answer is, never whether it is right.
- ``is_equivalent`` decides whether an answer equals the label, entirely through math-verify
  (``parse`` + ``verify``): 1/2 == 0.5 == \\frac{1}{2}, 1,000 == 1000, {1,2} == {2,1}, 50\\% == 0.5.
  It never raises; errors and timeouts count as "not equivalent".
- ``score`` combines them into 1.0 / 0.0 / ``format_penalty``. When the label is a number
  (``is_number``), so must the answer be (``numbers_only``, the default): a candidate that is
  an expression, such as ``\\boxed{5 - 3}`` for "Calculate 5 - 3.", is no answer at all, so a
  policy cannot score by restating the problem and letting math-verify evaluate it (a
  SmolLM2 run learned exactly that: 227 of 239 held-out answers scored right boxed the problem's
  own expression; tests/data/math_boxed_restatements.jsonl).

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

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from kernel.hooks import RewardResult, RolloutContext
from kernel.sample import Sample

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
    """failing every marker, the last number of the response is its answer"""
    numbers_only: bool = True
    """when the label is a number, only a number is an answer (an integer, decimal or reduced
    fraction, signed, maybe with a unit or %): an expression like '5 - 3' or '12/4' that
    restates the problem is skipped as no answer; labels that are not numbers (\\sqrt{2},
    intervals) accept any expression math-verify reads"""
    after_think: bool = False
    """only text after the last </think> counts; a response without </think> has no answer"""
    format_penalty: float = 0.0
    """reward when no answer can be extracted (e.g. -0.5 to punish a missing \\boxed{})"""
    timeout_s: int = 5
    """seconds math-verify may spend per step (parse label, parse answer, compare); 0: no limit"""
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


def _command_answers(text: str, command: str, pairs: dict[int, int]) -> list[tuple[int, str]]:
    """(position, argument) of every complete ``\\command{...}`` or ``\\command token``."""
    found = []
    for m in re.finditer(re.escape(command) + r"(?![A-Za-z])", text):
        j = m.end()
        while j < len(text) and text[j] in " \t":
            j += 1
        if j < len(text) and text[j] == "{":
            if j in pairs:  # an unclosed box (e.g. a truncated response) is no answer
                found.append((m.start(), text[j + 1 : pairs[j]]))
        elif j > m.end():  # "\boxed 5": the token after the space, as math-verify reads it
            token = re.match(r"[^\s$]*", text[j:]).group(0)
            found.append((m.start(), token))
    return found


# Where a text marker's answer ends: the line's end, or a full stop, comma or semicolon
# followed by a space ("The answer is 5, since ..."; "1,000" and "2.5" stay whole).
_CLAUSE_END = re.compile(r"[.,;](?:\s|$)")
# A number: an optional minus that is a sign (not "10-3"), thousands separators, decimals, a
# fraction ("3/4").
_NUMBER = re.compile(r"(?:(?<![\w)\]}])-)?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")


def _marker_answer(text: str, marker: str) -> tuple[int, str] | None:
    """(position, answer) after the last case-insensitive ``marker``: the rest of its line up
    to the end of the clause, without a leading colon or the math-mode dollars and markdown
    bold around it ("The answer is: **$5$**." -> "5"; "5." would parse as a string); of an
    equation, its right-hand side ("the final answer is 3 + 4 = 7." -> "7")."""
    matches = list(re.finditer(re.escape(marker), text, flags=re.IGNORECASE))
    if not matches:
        return None
    last = matches[-1]
    line = text[last.end() :].split("\n", 1)[0].strip().lstrip(":").strip()
    line = _CLAUSE_END.split(line, 1)[0].rsplit("=", 1)[-1].strip().rstrip(".")
    while len(line) >= 2 and line[0] == line[-1] and line[0] in "$*":
        line = line.strip(line[0]).strip()
    return last.start(), line


def last_number(text: str) -> str | None:
    """The last number in ``text`` ("so 3 + 4 = 7." -> "7"; "= -8" -> "-8"), or None."""
    found = _NUMBER.findall(text) if isinstance(text, str) else []
    return found[-1] if found else None


def extract_answer(
    text: str,
    markers: tuple[str, ...] = ("\\boxed",),
    after_think: bool = False,
    fallback_last_number: bool = False,
    accept: Callable[[str], bool] | None = None,
) -> str | None:
    """The final answer in ``text``, or None if there is none.

    Markers starting with a backslash are LaTeX commands: their brace argument (balanced,
    nested braces included) or, without braces, the next token. Other markers are text: the
    rest of the line after them, to the end of the clause. Of all matches, the one that starts
    last wins. An empty answer (``\\boxed{}``) is None, and so is an unclosed ``\\boxed{...``.
    With ``fallback_last_number``, a text no marker matches answers with its last number. With
    ``after_think``, only the text after the last ``</think>`` is searched and no ``</think>``
    means None (the model never finished thinking). With ``accept``, a candidate it refuses
    (e.g. not ``is_number``) is skipped as if its marker were absent, the last number included.
    """
    if not isinstance(text, str):
        return None
    if after_think:
        end = text.rfind(THINK_END)
        if end < 0:
            return None
        text = text[end + len(THINK_END) :]
    pairs = _matching_braces(text) if any(m.startswith("\\") for m in markers) else {}
    candidates: list[tuple[int, str]] = []
    for marker in markers:
        if marker.startswith("\\"):
            candidates += _command_answers(text, marker, pairs)
        elif (found := _marker_answer(text, marker)) is not None:
            candidates.append(found)
    candidates = [(i, a.strip()) for i, a in candidates if a.strip()]
    if accept is not None:
        candidates = [(i, a) for i, a in candidates if accept(a)]
    if candidates:
        return max(candidates, key=lambda c: c[0])[1]
    number = last_number(text) if fallback_last_number else None
    return number if number is None or accept is None or accept(number) else None


# ---- equivalence ----------------------------------------------------------------------------


def is_equivalent(
    answer: str | None, label: str, *, timeout_s: int = 5, max_chars: int = 1000
) -> bool:
    """Whether ``answer`` equals ``label`` mathematically, decided by math-verify.

    Never raises: None, an empty or over-long answer, a math-verify error or a timeout are all
    False. ``timeout_s`` bounds each of math-verify's steps (parse label, parse answer, compare)
    with SIGALRM, which only the main thread of a POSIX process can set; elsewhere (a worker
    thread) math-verify would refuse, so the comparison runs without a limit there.
    """
    if answer is None or label is None:
        return False
    answer, label = str(answer).strip(), str(label).strip()
    if not answer or not label or len(answer) > max_chars:
        return False
    limit: int | None = timeout_s if timeout_s > 0 else None
    if os.name != "posix" or threading.current_thread() is not threading.main_thread():
        limit = None
    try:
        gold = parse(f"\\boxed{{{label}}}", extraction_config=_EXTRACTION, parsing_timeout=limit)
        pred = parse(f"\\boxed{{{answer}}}", extraction_config=_EXTRACTION, parsing_timeout=limit)
        return bool(gold and pred and verify(gold, pred, timeout_seconds=limit))
    except (Exception, TimeoutException):  # TimeoutException is a BaseException
        return False


def final_answer(text: str, label: str, cfg: MathRewardConfig) -> str | None:
    """The answer ``score`` grades: ``extract_answer`` with the config's markers, accepting only
    numbers when ``cfg.numbers_only`` and the label is one."""
    accept = is_number if cfg.numbers_only and is_number(str(label)) else None
    return extract_answer(text, cfg.markers, cfg.after_think, cfg.last_number, accept)


def score(text: str, label: str, cfg: MathRewardConfig | None = None) -> float:
    """1.0 if the response's final answer equals ``label``, 0.0 if not, ``cfg.format_penalty``
    if no answer can be extracted."""
    cfg = cfg or MathRewardConfig()
    answer = final_answer(text, label, cfg)
    if answer is None:
        return cfg.format_penalty
    ok = is_equivalent(answer, label, timeout_s=cfg.timeout_s, max_chars=cfg.max_answer_chars)
    return 1.0 if ok else 0.0


# ---- the recipe's reward hook ---------------------------------------------------------------


def reward(ctx: RolloutContext, samples: list[Sample]) -> RewardResult:
    """One reward per sample, by role (the kernel then scales every sample of the episode by
    its outcome, ``metadata["correct"]``: x1.2 if right, x0.8 if wrong, when asymmetric):

    - solver, rewriter: 1.0 if its own final answer equals the label, 0.0 if not,
      ``format_penalty`` if it gave none;
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
