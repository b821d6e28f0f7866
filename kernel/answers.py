"""Reading the one final answer a reply states: where a marked answer starts and ends, whether
it is negated, hedged or names several candidates, and the one number of a reply's last
sentence.

Recipes that grade a reply by its final answer (math_solver_verifier, debate) find their own
markers (a ``\\boxed{...}``, "The answer is", "Answer:") and decide what an answer may be (a
number, an expression); this module reads what is around it, the same way for every recipe, so
a reply cannot talk its way into credit:

- ``clause_after_marker`` and ``right_side``: the answer a text marker introduces (the rest of
  its line to the end of the clause, or the next line with text; of an equation its right-hand
  side);
- ``doubt``: why a marked answer does not stand ("rejected: negated", "rejected: hedged",
  "rejected: several answers"), or None: its clause before the marker doubts it (a hedge or
  condition anywhere: "I think", "if"; a negation, approximation or alternative next to it,
  only filler words between: "The answer is not 5", "4 or the answer is 5"), its own words do
  ("not 5", "about 5", "4 and 5", "5?"), the words after it in its clause do ("5 is wrong",
  "5 or 6"), or a later clause of its sentence names another candidate or hedges ("5, 6",
  "5, maybe", a sentence ending in "?"); a negation in a later clause is fine ("5, not 6");
- ``last_sentence_number``: a reply with no marker answers with the ONE number of its last
  sentence, or the result it states as an equation ("So 3 + 4 = 7." -> 7; "= 7 or 8" and
  "= 6 = 7" state none), when its clause does not doubt it;
- ``strip_end_token``: a trailing end-of-turn token (``<|im_end|>``, ``</s>``) is no text.

The word lists are small on purpose (a reply is read, not understood). Negations: not, no,
never, none, neither, nor, cannot, wrong, incorrect, false, ...n't, ``\\neq``, "≠".
Approximations (next to the answer): about, approx(imately), around, roughly, nearly, almost,
circa, close, somewhere, "≈". Hedges anywhere in the clause: maybe, perhaps, probably, possibly,
(un)likely, presumably, apparently, guess, think, believe, suppose, assume, might, could, may,
unsure, uncertain, estimate(d), "not sure". Alternatives next to it: or, either, between,
range; conditions anywhere: if, whether, unless, otherwise, alternatively. Every read is
bounded (``_LOOK_BACK`` characters before a marker, ``_READ_AHEAD`` after an answer), so a
reply with many markers is read in linear time.
"""

from __future__ import annotations

import collections
import itertools
import re

_NEGATION = r"not|no|never|none|neither|nor|cannot|wrong|incorrect|false|\w*n['’]t"
_APPROX = r"about|approx|approximately|around|roughly|nearly|almost|circa|close|somewhere"
_UNSURE = (
    r"maybe|perhaps|probably|possibly|likely|unlikely|presumably|apparently|guess|think"
    r"|believe|suppose|assume|might|could|may|unsure|uncertain|estimate|estimated"
)
_CHOICE = r"or|either|between|range"
_CONDITION = r"if|whether|unless|otherwise|alternatively"
_NOT_EQUAL = r"\\neq?(?![A-Za-z])|≠"
_APPROX_SIGN = r"≈|\\approx(?![A-Za-z])"
# Some words doubt the whole clause wherever they stand ("I think", "if"); the others only an
# answer they stand next to, with at most filler words between ("is not 5", "about 5", "4 or
# the answer is 5"), so "the number that is not a factor is 4" stands.
_CLAUSE_WIDE = re.compile(
    rf"\b(?:{_UNSURE}|{_CONDITION})\b"
    r"|\b(?:not|\w*n['’]t)\s+(?:\w+\s+)?(?:sure|certain|convinced|positive|know)\b",
    re.I,
)
_LOCAL = re.compile(rf"\b(?:{_NEGATION}|{_APPROX}|{_CHOICE})\b|{_NOT_EQUAL}|{_APPROX_SIGN}", re.I)
# An answer's own words (a text marker's clause): any doubt counts, a negation before more
# text ("not 5"; a bare "no" may be the answer), and "and", "to", "from" list or range
# candidates ("4 and 5", "from 4 to 5").
_IN_ANSWER = re.compile(
    rf"\b(?:{_NEGATION})\b(?=\W*\w)|\b(?:{_APPROX}|{_UNSURE}|{_CHOICE}|{_CONDITION}|and|to|from)\b"
    rf"|{_NOT_EQUAL}|{_APPROX_SIGN}|\?",
    re.I,
)
# Hedges and alternatives only: an enclosed answer's content (a box may hold "\text{no}" or
# "4 and 5", which are what it says) and the first words of a later clause.
_HEDGE = re.compile(rf"\b(?:{_APPROX}|{_UNSURE}|{_CHOICE}|{_CONDITION})\b|{_APPROX_SIGN}|\?", re.I)
_HEDGE_OR_NOT_EQUAL = re.compile(
    rf"\b(?:{_APPROX}|{_UNSURE}|{_CHOICE}|{_CONDITION})\b|{_NOT_EQUAL}|{_APPROX_SIGN}|\?", re.I
)
# What may stand between a local doubt word and the answer it doubts.
_FILLER_WORDS = re.compile(
    r"the|an|final|answer|is|are|was|be|been|it|its|it['’]s|this|that|which|what|true|case"
    r"|equal|equals|to|exactly|simply|just|really|definitely|certainly|surely|actually|indeed"
    r"|correct|right|result|value|number|solution|would|will|should|can|must|i|i['’]m|im|my"
    r"|here|there|as|going",
    re.I,
)
_TOKEN = re.compile(r"\\[A-Za-z]+|[A-Za-z'’]+|\d[\d.,/]*")
_NEGATED = re.compile(rf"\b(?:{_NEGATION})\b|{_NOT_EQUAL}", re.I)
# A later clause of the answer's sentence that adds a candidate opens with a number ("5, 6",
# "5, or 6", "5, and 6") or a hedge or alternative among its first words ("5, maybe 6");
# in the answer's own clause, "or" or "and" before another number ("5 apples or 6"; not
# "to": "3.14 to 2 decimal places").
_ANOTHER = re.compile(r"(?:(?:and|or|plus|also|then)\s+)?[-+]?(?:\d|\\[dt]?frac)", re.I)
_ANOTHER_IN = re.compile(r"\b(?:or|nor|and|plus)\s+(?:\S+\s+){0,2}?[-+]?\d", re.I)
# A sentence ends at an end mark before a space (not "2.5") or at a line break; a clause at
# a comma or semicolon before a space (not "1,000"). A marker's own clause starts after the
# last of those, a colon, a think tag, or a connective: in "It is not 4, so the answer is 5"
# the negation is not the answer's. (No "and": "between 4 and 5" is one clause.)
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n")
_CLAUSE_END = re.compile(r"[,;](?=\s|$)")
_CLAUSE_START = re.compile(r"[.!?,;:](?=\s)|\n|</?think>")
_CONNECTIVE = re.compile(r"\b(?:so|thus|therefore|hence|then|but|because|since|finally)\b", re.I)
_FIRST_END = re.compile(r"[,;.!?](?=\s|$)|\n")
_LOOK_BACK = 300  # characters before a marker searched for its clause's start
_READ_AHEAD = 2000  # characters after an answer read for the rest of its sentence
_END_TOKEN = re.compile(r"(?:<\|[^<>|\s]{1,40}\|>|</s>|<eos>|<end_of_turn>)$")

WRAP = " \t*$"
"""Around an answer and changing nothing: spaces, markdown bold, math-mode dollars."""

NUMBER = re.compile(r"(?:(?<![\w)\]}])-)?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
"""A number: an optional minus that is a sign (not "10-3"), thousands separators, decimals, a
fraction ("3/4")."""


def strip_end_token(text: str) -> str:
    """``text`` without trailing whitespace and end-of-turn tokens (``<|im_end|>``,
    ``<|eot_id|>``, ``</s>``, ``<eos>``, ``<end_of_turn>``)."""
    text = text.rstrip()
    while (m := _END_TOKEN.search(text[-48:])) is not None:
        text = text[: len(text) - len(m.group(0))].rstrip()
    return text


def clause_from(text: str, pos: int) -> tuple[str, int]:
    """The clause from ``pos`` on and where it ends (a clause or sentence end; read at most
    ``_READ_AHEAD`` characters, so passing over many markers stays linear)."""
    m = _FIRST_END.search(text, pos, pos + _READ_AHEAD)
    end = min(len(text), pos + _READ_AHEAD) if m is None else m.start()
    return text[pos:end], end


def clause_after_marker(text: str, end: int) -> tuple[str, int] | None:
    """The clause a text marker ending at ``end`` introduces, without wrappers and colons, and
    where it ends in ``text``: the rest of the marker's line or, when that is empty, the next
    line with text (up to 3 more: "The answer is:\\n$$\\n5\\n$$"). None when nothing follows."""
    pos = end
    for _ in range(4):
        line_end = text.find("\n", pos, pos + _READ_AHEAD)
        line_end = min(len(text), pos + _READ_AHEAD) if line_end < 0 else line_end
        if text[pos:line_end].strip(WRAP + ":\\[]()"):
            break
        if line_end >= len(text):
            return None
        pos = line_end + 1
    else:
        return None
    clause, clause_end = clause_from(text, pos)
    return clause.strip(WRAP + ":"), clause_end


def right_side(clause: str) -> str:
    """The answer a clause states: of an equation its right-hand side ("3 + 4 = 7" -> "7"),
    without wrappers and a final period."""
    return clause.rsplit("=", 1)[-1].strip(WRAP).rstrip(".").strip(WRAP)


def _last_end(pattern: re.Pattern, text: str) -> int:
    """Where the last match of ``pattern`` in ``text`` ends (0 if none)."""
    end = 0
    for m in pattern.finditer(text):
        end = m.end()
    return end


def _reason(word: str) -> str:
    """The "rejected: ..." reason a doubting word or sign gives."""
    if re.search(r"sure|certain|convinced|positive|know", word, re.I):  # "not sure"
        return "rejected: hedged"
    if _NEGATED.fullmatch(word.strip()):
        return "rejected: negated"
    if re.fullmatch(rf"{_CHOICE}|{_CONDITION}|and|to|from", word.strip(), re.I):
        return "rejected: several answers"
    return "rejected: hedged"


def _only_filler(words: str) -> bool:
    """Whether ``words`` hold nothing but filler: ``_FILLER_WORDS``, single letters,
    numbers and LaTeX commands ("is equal to", "the answer is $x = 3 + 2 =")."""
    return all(
        t[0] in "\\0123456789" or len(t) == 1 or _FILLER_WORDS.fullmatch(t)
        for t in _TOKEN.findall(words)
    )


def _before_doubt(words: str) -> str | None:
    """Why the words of a clause before its answer take it back, hedge it or offer others:
    a clause-wide doubt anywhere, a local one with only filler up to the answer."""
    if (m := _CLAUSE_WIDE.search(words)) is not None:
        return _reason(m.group(0))
    # only the last local word can be next to the answer: the words after an earlier one
    # hold the later one
    last = collections.deque(_LOCAL.finditer(words), maxlen=1)
    if last and _only_filler(words[last[0].end() :]):
        return _reason(last[0].group(0))
    return None


def _after_doubt(words: str) -> str | None:
    """Why the words of a clause after its answer take it back, hedge it or offer others
    ("5 is wrong", "5 or 6", "5 I think")."""
    if (m := _CLAUSE_WIDE.search(words)) is not None:
        return _reason(m.group(0))
    first = _LOCAL.search(words)
    if first is not None and _only_filler(words[: first.start()]):
        return _reason(first.group(0))
    return "rejected: several answers" if _ANOTHER_IN.search(words) else None


def _clause_before(text: str, start: int) -> str:
    """The words before position ``start`` in its clause, from its last connective on."""
    window = text[max(0, start - _LOOK_BACK) : start]
    window = window[_last_end(_CLAUSE_START, window) :]
    return window[_last_end(_CONNECTIVE, window) :]


def _later_doubt(text: str, end: int, later: re.Pattern) -> str | None:
    """Why the rest of an answer's sentence, after its clause ending at ``end``, makes it one
    of several or uncertain ("5, or 6"; "5, 6"; "5, maybe"; "5?"), or None ("5, not 6";
    "5, since 2 + 3 = 5"). ``later`` finds a doubt among a later clause's first words."""
    if end >= len(text) or text[end] not in ",;":
        return "rejected: hedged" if text[end : end + 1] == "?" else None
    m = _SENTENCE_END.search(text, end + 1, end + 1 + _READ_AHEAD)
    if m is not None and m.group(0) == "?":
        return "rejected: hedged"
    stop = min(len(text), end + 1 + _READ_AHEAD) if m is None else m.start()
    for clause in _CLAUSE_END.split(text[end + 1 : stop]):
        clause = clause.lstrip(WRAP + "([")
        if _ANOTHER.match(clause):
            return "rejected: several answers"
        if (found := later.search(" ".join(clause[:80].split()[:3]))) is not None:
            return _reason(found.group(0))
    return None


def doubt(
    text: str,
    start: int,
    words: str,
    end: int,
    *,
    after: str = "",
    enclosed: bool = False,
    later_not_equal: bool = False,
) -> str | None:
    """Why the answer of the marker at ``text[start]`` does not stand ("rejected: negated",
    "rejected: hedged", "rejected: several answers"), or None when it stands.

    ``words`` are the answer's own words (a text marker's clause, a box's content), ``after``
    the words after it in its clause (after a box), ``end`` where that clause ends in ``text``.
    In order: the clause before the marker (from its last connective on) doubts the answer, its
    own words do (``enclosed``: an enclosed content, such as a box's, where only hedges and
    alternatives count, since "no" or "4 and 5" may be what it says), the words after it do, or
    the later clauses of its sentence add a candidate or hedge (with ``later_not_equal`` a
    "≠" among a later clause's first words also counts).
    """
    own = _HEDGE if enclosed else _IN_ANSWER
    return (
        _before_doubt(_clause_before(text, start))
        or (None if (m := own.search(words)) is None else _reason(m.group(0)))
        or _after_doubt(after)
        or _later_doubt(text, end, _HEDGE_OR_NOT_EQUAL if later_not_equal else _HEDGE)
    )


# what states an equation's result: "3 + 4 = 7", "9 - 3 equals 6", "-2 * 3 is -6"
_EQUATION = re.compile(r"=|\bequals\b|\bis(?:\s+equal\s+to)?\b", re.I)


def _result_of_equation(sentence: str, number: re.Pattern) -> re.Match | None:
    """The result a sentence with several numbers states as an equation's right-hand side: the
    number right after its last "=", "equals" or "is" that a number follows, filler words
    aside ("So 3 + 4 = 7" -> 7, "2 * 7 is indeed 14", "5 + 2 = 7 is correct" -> 7); None when
    more than one number follows that connector ("= 7 or 8", "is 7, not 6"), when a bare
    number stands between it and the connector before ("= 6 = 7" names two results), or when
    no connector is followed by a number ("3 is a multiple of 5" states no result)."""
    connectors = list(_EQUATION.finditer(sentence))
    for i in range(len(connectors) - 1, -1, -1):
        at = connectors[i].end()
        after = list(itertools.islice(number.finditer(sentence, at), 2))
        if not after or not _only_filler(sentence[at : after[0].start()]):
            continue  # "is correct", "is a multiple of 5": no result stated here
        if len(after) != 1:
            return None
        before = sentence[connectors[i - 1].end() : connectors[i].start()] if i else ""
        if i and number.fullmatch(before.strip(WRAP + " ()")):
            return None
        return after[0]
    return None


def last_sentence_number(
    text: str, number: re.Pattern = NUMBER, *, later_not_equal: bool = False
) -> str | None:
    """The one ``number`` of the text's last sentence (after the last ".!?" before a space, or
    line break; trailing wrappers and ".!" ignored), as written -- or, in a sentence of several,
    the result it states as an equation's right-hand side ("So 3 + 4 = 7." -> 7, "9 - 3 equals
    6", "-2 * 3 is -6"; not "= 7 or 8", "is 7, not 6", "= 6 = 7"); None when it has none, or
    when its clause negates, hedges or offers alternatives to it (as ``doubt`` reads a marked
    answer; its clause starts after the last ".!?,;:" or think tag, connectives included).
    ``later_not_equal`` as in ``doubt``."""
    text = text.rstrip(WRAP + ".!")
    sentence = text[_last_end(_SENTENCE_END, text) :]
    numbers = list(itertools.islice(number.finditer(sentence), 2))
    found = numbers[0] if len(numbers) == 1 else _result_of_equation(sentence, number)
    if found is None:
        return None
    before = sentence[: found.start()]
    before = before[_last_end(_CLAUSE_START, before) :]
    after, end = clause_from(sentence, found.end())
    later = _HEDGE_OR_NOT_EQUAL if later_not_equal else _HEDGE
    if _before_doubt(before) or _after_doubt(after) or _later_doubt(sentence, end, later):
        return None
    return found.group(0)
