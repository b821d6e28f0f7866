"""Golden tests for recipes/math_solver_verifier/reward.py: answer extraction, math-verify
equivalence, score and the reward hook.

Each golden is written out as (input, label, expected). Where math-verify's verdict differs
from what a human grader might say, the case is kept with math-verify's verdict and a comment
("math-verify:"), so a change in the library shows up here instead of silently in training.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import pytest

from kernel.hooks import RolloutContext, call_reward, load_reward
from kernel.sample import Sample
from recipes.math_solver_verifier.reward import (
    MathRewardConfig,
    extract_answer,
    final_answer,
    is_equivalent,
    is_number,
    last_number,
    reward,
    score,
)

# ---- is_equivalent: (answer, label, expected) -----------------------------------------------

EQUIVALENCE = [
    # fractions, decimals, LaTeX fraction variants
    ("1/2", "0.5", True),
    ("0.5", "\\frac{1}{2}", True),
    ("\\dfrac{1}{2}", "1/2", True),
    ("\\tfrac12", "1/2", True),
    ("\\frac12", "\\frac{2}{4}", True),  # 2/4 reduces to 1/2
    ("-\\frac{1}{2}", "-0.5", True),
    ("1/3", "0.333333", True),  # floats compared to 6 decimals: 0.333333 rounds like 1/3
    ("1/3", "0.33", False),  # ...but 0.33 does not
    ("10.0", "10", True),
    ("3.0000001", "3", False),  # 3.0000001 - 3 = 1e-7, kept by numeric_precision=15
    # \left( \right), tuples, intervals, sets
    ("\\left(1, 2\\right)", "(1,2)", True),
    ("\\left( 3, -1 \\right)", "(3,-1)", True),
    ("(2, 1)", "(1, 2)", False),  # order matters in a pair (math-verify reads (1,2) as interval)
    ("\\{2, 1\\}", "\\{1,2\\}", True),  # order does not matter in a set
    ("2, 1", "\\{1,2\\}", True),  # a bare list is read as a set
    # roots, pi, powers, symbolic
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),
    ("\\sqrt{18}", "3\\sqrt{2}", True),  # sqrt(18) = sqrt(9*2) = 3 sqrt(2)
    ("\\sqrt[3]{8}", "2", True),  # 2^3 = 8
    ("2\\pi", "6.283185", True),  # 2 * 3.14159265... = 6.2831853 -> 6.283185
    ("\\pi", "3.14", False),  # 3.14159265 != 3.14 at 6 decimals
    ("(x+1)^2", "x^2+2x+1", True),
    ("x = 5", "5", True),  # an assignment counts as its right-hand side
    # percentages: math-verify accepts both the percent number and the fraction
    ("50\\%", "0.5", True),
    ("50\\%", "50", True),
    # negative numbers
    ("-3", "-3", True),
    ("3", "-3", False),
    ("-7", "-7.0", True),
    # thousands separators
    ("1,000", "1000", True),
    ("1000", "1{,}000", True),
    ("12,345", "12345", True),
    ("1.000", "1000", False),  # a decimal point, not a European thousands separator: 1.0
    # units and text
    ("5\\text{ cm}", "5", True),  # trailing \text units are dropped
    ("90^\\circ", "90", True),
    ("5 apples", "5", True),  # math-verify: a trailing word after the number is dropped
    ("5 dollars", "5", False),  # math-verify: read as 5*d*o*l*l*a*r*s, a product of symbols
    ("\\text{5 apples}", "5", False),  # math-verify: the whole \text{} is one symbol
    ("e^{i\\pi}", "-1", False),  # math-verify: e is a symbol here, not Euler's number
    # plainly wrong, and malformed input
    ("12", "13", False),
    (None, "5", False),
    ("", "5", False),
    ("   ", "5", False),
    ("5", "", False),
    ("\\frac{1}{", "0.5", False),  # unbalanced braces: math-verify cannot parse it
    ("1" * 2000, "5", False),  # longer than max_chars (1000): wrong without parsing
]


@pytest.mark.parametrize(("answer", "label", "expected"), EQUIVALENCE)
def test_is_equivalent_golden(answer, label, expected):
    assert is_equivalent(answer, label) is expected


def test_is_equivalent_never_raises_on_timeout_and_stays_bounded():
    # A power tower that sympy cannot settle: math-verify's alarm fires after timeout_s per step
    # (parse label, parse answer, compare: at most 3 s here), and the verdict is False.
    start = time.monotonic()
    assert is_equivalent("2^{2^{2^{2^{2^{2}}}}}", "5", timeout_s=1) is False
    assert time.monotonic() - start < 4.0


def test_is_equivalent_works_off_the_main_thread():
    # SIGALRM only works in the main thread; elsewhere math-verify would refuse a timeout, so
    # is_equivalent runs without one instead of raising or returning False for a right answer.
    out: list[bool] = []
    t = threading.Thread(target=lambda: out.append(is_equivalent("1/2", "0.5")))
    t.start()
    t.join()
    assert out == [True]


# ---- extract_answer: (text, markers, after_think, expected) ---------------------------------

B = ("\\boxed",)
T = ("answer is",)
EXTRACTION = [
    ("so \\boxed{42}.", B, False, "42"),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", B, False, "\\frac{1}{\\sqrt{2}}"),  # nested braces
    ("\\boxed{\\{1,2\\}}", B, False, "\\{1,2\\}"),  # escaped braces are not groups
    ("first \\boxed{3}, no wait: \\boxed{4}", B, False, "4"),  # the last box wins
    ("\\boxed{3} then \\boxed{4", B, False, "3"),  # an unclosed box is no box
    ("\\boxed{\\frac{1}{2}", B, False, None),  # unbalanced, nothing else
    ("\\boxed{}", B, False, None),  # empty box
    ("\\boxed{  }", B, False, None),
    ("\\boxed 5", B, False, "5"),  # without braces, as math-verify allows
    ("\\boxedfoo{5}", B, False, None),  # another command, not \boxed
    ("the answer is 4", B, False, None),  # no box
    ("The answer is 4.", ("\\boxed", "The answer is"), False, "4"),
    ("Answer: $\\frac{1}{2}$.\nok", ("Answer:",), False, "\\frac{1}{2}"),  # to end of line
    ("answer: 7", ("Answer:",), False, "7"),  # text markers ignore case
    ("Answer: 3 ... \\boxed{5}", ("\\boxed", "Answer:"), False, "5"),  # latest match wins
    ("\\boxed{5} Answer: 6", ("\\boxed", "Answer:"), False, "6"),
    ("\\fbox{5}", B, False, None),  # only configured markers count
    ("\\fbox{5}", ("\\boxed", "\\fbox"), False, "5"),
    # after_think: only the text after the last </think>; none means unfinished thinking
    ("<think>\\boxed{3}</think> so \\boxed{4}", B, True, "4"),
    ("<think>\\boxed{3}</think> no box after", B, True, None),
    ("<think>still thinking \\boxed{4}", B, True, None),
    ("<think>still thinking \\boxed{4}", B, False, "4"),
    ("<think>a</think>b</think>\\boxed{9}", B, True, "9"),
    # a text marker's answer ends with its clause; colon, dollars and bold around it go
    ("The answer is 5, since 2 + 3 = 5.", T, False, "5"),
    ("So the answer is: **$-8$**.", T, False, "-8"),
    ("The answer is 1,000. Done", T, False, "1,000"),
    ("The answer is 2.5; check it", T, False, "2.5"),
    ("So, the final answer is -2 + 1 = -1.", T, False, "-1"),  # an equation: its result
    ("The answer is \\boxed{7}.", ("\\boxed", "the answer is"), False, "7"),  # the box is later
]


@pytest.mark.parametrize(("text", "markers", "after_think", "expected"), EXTRACTION)
def test_extract_answer_golden(text, markers, after_think, expected):
    assert extract_answer(text, markers, after_think) == expected


# (text, last_number, the fallback answer): the fallback is not the last number but the ONE
# number of the last sentence, of a reply without any marker (the strict rule: a list or a
# restated problem that ends in the label is no answer; "So 3 + 4 = 7." neither).
LAST_NUMBER = [
    ("So 3 + 4 = 7.", "7", "7"),  # an equation's result in the last sentence
    ("= -8", "-8", "-8"),
    ("10-3", "3", None),  # a minus between numbers is an operator, not a sign; two numbers
    ("(2)-(5)", "5", None),
    ("It is 1,234,567 in total", "1,234,567", "1,234,567"),
    ("about 3.75 then 2/3", "2/3", None),
    ("3 + 4 = 7.\nThe sum is 7.", "7", "7"),  # a line break or a full stop ends a sentence
    ("no digits here", None, None),
    ("", None, None),
]


@pytest.mark.parametrize(("text", "expected", "fallback"), LAST_NUMBER)
def test_last_number_golden(text, expected, fallback):
    assert last_number(text) == expected
    # ... the fallback reads the last sentence, and only when no marker occurs
    assert extract_answer(text, B, fallback_last_number=True) == fallback
    assert extract_answer(text + " \\boxed{9}", B, fallback_last_number=True) == "9"


def test_extract_answer_is_linear_on_huge_and_adversarial_input():
    start = time.monotonic()
    assert extract_answer("x" * 1_000_000 + "\\boxed{7}") == "7"
    # 100k unclosed boxes: a naive scan from each would be quadratic (10^10 steps).
    assert extract_answer("\\boxed{" * 100_000) is None
    assert extract_answer(None) is None  # type: ignore[arg-type]
    assert time.monotonic() - start < 3.0


# ---- score: (text, label, cfg, expected reward) ---------------------------------------------

PENALTY = MathRewardConfig(markers=B, last_number=False, format_penalty=-1.0)
THINK = MathRewardConfig(markers=B, last_number=False, after_think=True, format_penalty=-1.0)
DEFAULT = MathRewardConfig(format_penalty=-1.0)  # boxes, "the answer is", else the last number
SCORES = [
    ("So the answer is \\boxed{\\frac{1}{\\sqrt{2}}}.", "\\frac{\\sqrt{2}}{2}", PENALTY, 1.0),
    ("\\boxed{0.5}", "\\dfrac{1}{2}", PENALTY, 1.0),
    ("\\boxed{3} no, \\boxed{4}", "4", PENALTY, 1.0),  # last box wins...
    ("\\boxed{3} no, \\boxed{4}", "3", PENALTY, 0.0),  # ...so the first one does not count
    ("\\boxed{12}", "13", PENALTY, 0.0),  # wrong answer: 0.0, not the penalty
    ("the answer is 4", "4", PENALTY, -1.0),  # no box: the format penalty
    ("no answer", "4", MathRewardConfig(markers=B, last_number=False), 0.0),  # penalty 0.0
    ("the answer is 4", "4", MathRewardConfig(markers=("\\boxed", "The answer is")), 1.0),
    ("the answer is 4.", "4", DEFAULT, 1.0),
    # the strict rule: the fallback is the one number of the last sentence, or the result it
    # states as an equation ("3 + 1 = 4"; "3 + 1 = 4 or 5" states none)
    ("3 + 1 = 4", "4", DEFAULT, 1.0),
    ("3 + 1 = 4 or 5", "4", DEFAULT, -1.0),
    ("3 + 1 = 4. The sum is 4.", "4", DEFAULT, 1.0),  # one number in the last sentence
    ("4, or \\boxed{5}", "4", DEFAULT, 0.0),  # "or \\boxed{5}": one of several; no fallback
    ("\\boxed{5}, so 4", "4", DEFAULT, 0.0),  # a box is never overruled by a later number
    ("no answer at all", "4", DEFAULT, -1.0),
    ("\\boxed{}", "4", PENALTY, -1.0),
    ("<think>\\boxed{3}</think>\\boxed{4}", "4", THINK, 1.0),
    ("<think>\\boxed{4}", "4", THINK, -1.0),  # never finished thinking
    ("x" * 5000 + "\\boxed{1,000}", "1000", PENALTY, 1.0),
]


@pytest.mark.parametrize(("text", "label", "cfg", "expected"), SCORES)
def test_score_golden(text, label, cfg, expected):
    assert score(text, label, cfg) == expected


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("markers", ()),
        ("markers", ("",)),
        ("format_penalty", math.nan),
        ("timeout_s", -1),
        ("max_answer_chars", 0),
    ],
)
def test_config_validate_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        MathRewardConfig(**{field: value}).validate()


# ---- the reward hook ------------------------------------------------------------------------


def _sample(role: str, label: str = "5", **metadata) -> Sample:
    return Sample(agent=role, label=label, metadata={"role": role, **metadata})


def test_reward_hook_scores_each_role_on_its_own_decision():
    ctx = RolloutContext()
    episode = [
        _sample("solver", text="so \\boxed{5}", correct=False),  # right answer: 1.0
        _sample("solver", text="\\boxed{6}", correct=False),  # wrong: 0.0
        _sample("rewriter", text="no box at all", correct=False),  # no answer: format 0.0
        _sample("selector", picked=1, correct=False),  # picked a wrong one: 0.0
        _sample("selector", picked=None, correct=True),  # malformed judgment: format penalty
        _sample("verifier", verdicts=[False, True], correct=True),  # approved a right answer
        _sample("verifier", verdicts=[True], correct=False),  # approved a wrong answer: 0.0
        _sample("verifier", verdicts=[False, None], correct=False),  # malformed last verdict
    ]
    assert reward(ctx, episode) == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]

    class Cfg:
        answer = MathRewardConfig(format_penalty=-0.5)

    penalised = reward(RolloutContext(config=Cfg()), episode)
    assert penalised == [1.0, 0.0, -0.5, 0.0, -0.5, 1.0, 0.0, -0.5]
    with pytest.raises(ValueError, match="unknown role 'judge'"):
        reward(ctx, [_sample("judge")])


def test_outcome_pays_the_verifier_for_the_final_answer_not_its_verdict():
    from recipes.math_solver_verifier.config import RecipeConfig

    episode = [
        _sample("verifier", verdicts=[False, False], correct=False),  # right to reject: 0.0
        _sample("verifier", verdicts=[False, True], correct=True),  # the revision was right
        _sample("verifier", verdicts=[True], correct=False),  # approved a wrong answer: 0.0
        _sample("verifier", verdicts=[False, None], correct=True),  # malformed: penalty
        _sample("solver", text="\\boxed{5}", correct=True),  # other roles: unchanged
    ]
    cfg = RecipeConfig(workflow="solver_verifier", verifier_reward="outcome").validate()
    cfg.answer.format_penalty = -0.5
    assert reward(RolloutContext(config=cfg), episode) == [0.0, 1.0, 0.0, -0.5, 1.0]
    cfg.verifier_reward = "verdict"
    assert reward(RolloutContext(config=cfg), episode) == [1.0, 1.0, 0.0, -0.5, 1.0]
    with pytest.raises(ValueError, match="verifier_reward must be one of"):
        RecipeConfig(verifier_reward="team").validate()


async def _call(samples):
    fn = load_reward("recipes.math_solver_verifier.reward.reward")
    return await call_reward(fn, RolloutContext(), samples)


def test_reward_hook_loads_by_dotted_path():
    import asyncio

    assert asyncio.run(_call([_sample("selector", picked=0, correct=True)])) == [1.0]


# ---- real replies: SmolLM2-135M-Instruct, greedy, the solver prompt -------------------------
# tests/data/smollm2_math_replies.jsonl: 44 replies from `python -m
# recipes.math_solver_verifier.tiers --dump` (reasoning-gym arithmetic tiers), each with the
# answer a reader takes from it ("expected", written by hand) and whether that is the label.
# None is boxed; they state "the (final) answer is X", an equation, or only a last number.

REPLIES = [
    json.loads(line)
    for line in (Path(__file__).resolve().parents[1] / "data" / "smollm2_math_replies.jsonl")
    .read_text()
    .splitlines()
]


# Replies the strict rule reads differently from the file's "expected" (the answer a reader
# takes): (answer, correct) now. Without a marker, a last sentence without exactly one number
# is no answer (1, 4, 7, 21, 23, 24, 36: 7 and 23 scored by luck, a truncated sentence with no
# number after a 0 or a 1 elsewhere); a marked answer that is prose is rejected (32).
STRICT = {
    4: (None, False),  # truncated: "This is because 3 is a multiple of 5, and any"
    7: (None, False),  # truncated: "It is also used to create other"
    21: (None, False),  # truncated: "So, the final answer to this"
    23: (None, False),  # "..., which is a fundamental property of arithmetic"
    24: (None, False),  # "This is a simple arithmetic operation that can be performed ..."
    32: (None, False),  # "the answer is a simple and elegant example of how ..."
    36: (None, False),  # "we need to add 61 and 69, which results in 69."
}


@pytest.mark.parametrize("i", range(len(REPLIES)), ids=[f"reply{i}" for i in range(len(REPLIES))])
def test_real_smollm2_replies_extract_and_score(i):
    reply, cfg = REPLIES[i], MathRewardConfig()
    expected, correct = STRICT.get(i, (reply["expected"], reply["correct"]))
    answer = extract_answer(reply["text"], cfg.markers, cfg.after_think, cfg.last_number)
    assert answer == expected
    assert score(reply["text"], reply["label"], cfg) == float(correct)


def test_real_replies_cover_every_extraction_path():
    right = [STRICT.get(i, (None, r["correct"]))[1] for i, r in enumerate(REPLIES)]
    assert len(REPLIES) >= 30 and sum(right) >= 10
    marker = [r for r in REPLIES if "answer is" in r["text"].lower()]
    assert len(marker) >= 20 and len(REPLIES) - len(marker) >= 5  # both paths, real text
    boxed_only = MathRewardConfig(markers=("\\boxed",), last_number=False)
    assert all(score(r["text"], r["label"], boxed_only) == 0.0 for r in REPLIES)


# ---- numbers only: restating the problem is no answer ----------------------------------------

NUMBERS = [
    ("5", True), ("-8", True), ("+3", True), ("1,000", True), ("1{,}000", True), ("2.5", True),
    ("3/4", True), ("\\frac{3}{4}", True), ("-\\dfrac{1}{2}", True), ("50\\%", True),
    ("5 \\text{ cm}", True), ("$-8$", True), ("**7**", True), ("−5", True),
    ("5 - 3", False), ("2 * 4", False), ("-(-3)", False), ("(-9 - 8)", False), ("x", False),
    ("6/3", False), ("\\frac{4}{2}", False), ("3/0", False), ("", False), (None, False),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), NUMBERS)
def test_is_number_golden(text, expected):
    assert is_number(text) is expected


RESTATED = [
    # a box holding the problem's expression is a stated answer that is no number: 0.0, and
    # nothing after it counts
    ("To calculate \\boxed{5 - 3}, you simply add 3 to 5.", "2", 0.0),
    # the strict rule: the box is the stated answer, an expression, so 0 (1.0 before, from
    # the computation after it); the last marked answer is the answer, no fallback
    ("To calculate \\boxed{5 - 3}, you add.\n\n5 - 3 = 2", "2", 0.0),
    ("\\boxed{5 - 3}", "2", 0.0),
    ("The answer is 12 / 4.", "3", 0.0),  # a division restated: no number
    ("The answer is 12 / 4 = 3.", "3", 1.0),
    # the strict rule: the last box is the answer (an expression: 0), and "or" makes it one
    # of several (1.0 before, skipping the expression box for the first)
    ("\\boxed{2} or rather \\boxed{1 + 1}", "2", 0.0),
    ("\\boxed{1 + 1}, that is \\boxed{2}", "2", 1.0),  # the last box: a number
    # a label that is no number accepts an expression (MATH-style answers)
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", 1.0),
]


@pytest.mark.parametrize(("text", "label", "expected"), RESTATED)
def test_a_restated_problem_is_no_answer(text, label, expected):
    assert score(text, label, DEFAULT) == expected
    lenient = MathRewardConfig(format_penalty=-1.0, numbers_only=False)
    if "\\boxed{5 - 3}" in text:  # the hack the strict rule stops: math-verify evaluates 5 - 3
        assert score(text, label, lenient) == 1.0


# tests/data/math_boxed_restatements.jsonl: the 256 held-out replies of a SmolLM2 policy trained
# 84 steps at 390cb91 with the lenient scorer (shared/evidence), with their problems: it learned
# to box the problem's own expression, and math-verify evaluated the box.
HACKED = [
    json.loads(line)
    for line in (Path(__file__).resolve().parents[1] / "data" / "math_boxed_restatements.jsonl")
    .read_text()
    .splitlines()
]


def test_a_trained_policys_boxed_restatements_no_longer_score():
    lenient = MathRewardConfig(numbers_only=False)
    boxed_expression = [
        r
        for r in HACKED
        if (a := extract_answer(r["text"], ("\\boxed",))) is not None and not is_number(a)
    ]
    assert len(HACKED) == 256 and sum(r["passed_at_390cb91"] for r in HACKED) == 239
    assert len(boxed_expression) == 227  # how the policy wrote its answers
    # the strict rule: an unclosed box (25 replies, "\\boxed{(-9 - 8), we ...") is a marker
    # without an answer, and no other number counts after it (236 before, from the last number)
    assert sum(score(r["text"], r["label"], lenient) for r in HACKED) == 230
    strict = [score(r["text"], r["label"]) for r in HACKED]
    # the strict rule: the boxed expression is the stated answer, no number: 0, whatever the
    # reply computes after it (94 before: the computation's last number)
    assert sum(strict) == 2
    for r, s in zip(HACKED, strict, strict=True):
        answer = final_answer(r["text"], r["label"], MathRewardConfig())
        assert answer is None or is_number(answer), r["text"]  # never an expression
        assert s == float(answer is not None and is_equivalent(answer, r["label"]))
    # problems answered by one of their own numbers ("0 * -5"): a restatement ending in that
    # number scored by the last number (32 before); the strict rule gives it nothing (the
    # learning tiers leave such problems out anyway: answer_is_an_operand)
    from recipes.math_solver_verifier.data import answer_is_an_operand

    lucky = [r for r, s in zip(HACKED, strict, strict=True) if s and answer_is_an_operand(r)]
    assert len(lucky) == 0
