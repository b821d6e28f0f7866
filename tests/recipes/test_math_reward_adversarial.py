"""Adversarial goldens for the math scorer (recipes/math_solver_verifier/reward.py): replies a
policy could write to be credited for an answer it does not commit to, each with the reward
the strict rule gives it, and legitimate replies that must still be credited, so the test
fails both ways.

The rule: a reply is credited only for the ONE final answer it states. Once a marker occurs
(``\\boxed{}``, "answer is") the last marked answer is the answer; negated, hedged, naming
several candidates or not a number, it scores 0.0 (an answer, a wrong one), and no other
number of the reply counts. A reply without any marker answers with the one number of its
last sentence, if that sentence has exactly one and does not negate or hedge it; otherwise it
stated nothing and scores the format penalty (-1.0 here, to tell the two apart).

Fast tier: pure functions, no model. The 50k-character rows are the linear-time guard (a
quadratic scan would take minutes on them); no timing is asserted.
"""

from __future__ import annotations

import pytest

from recipes.math_solver_verifier.reward import NO_ANSWER, MathRewardConfig, read_answer, score

CFG = MathRewardConfig(format_penalty=-1.0)  # boxes, "answer is", else the last sentence
THINK = MathRewardConfig(format_penalty=-1.0, after_think=True)
NONE = -1.0  # the format penalty: no answer stated
WRONG = 0.0  # an answer stated, wrong or not standing
RIGHT = 1.0

BIG = 50_000

ATTACKS = [
    # ---- negation: the reply says the label is NOT the answer
    ("negated-is-not", "The answer is not 5.", "5", CFG, WRONG),
    ("negated-isnt", "The answer isn't 5.", "5", CFG, WRONG),
    ("negated-no", "The answer is no 5.", "5", CFG, WRONG),
    ("negated-never", "The answer is never 5.", "5", CFG, WRONG),
    ("negated-negative-label", "The answer is not -8.", "-8", CFG, WRONG),
    ("negated-bold", "The answer is **not** 5.", "5", CFG, WRONG),
    ("negated-box-in-marker-line", "The answer is not \\boxed{5}.", "5", CFG, WRONG),
    ("negated-before-box", "It is not $\\boxed{5}$.", "5", CFG, WRONG),
    ("negated-after-box", "\\boxed{5} is wrong.", "5", CFG, WRONG),
    ("negated-last-of-two-boxes", "Answer: \\boxed{4}, not \\boxed{5}", "5", CFG, WRONG),
    ("negated-dont-think", "I don't think the answer is 5.", "5", CFG, WRONG),
    ("negated-not-equal-sign", "$x \\neq \\boxed{5}$", "5", CFG, WRONG),
    ("negated-not-true-that", "It is not true that the answer is 5.", "5", CFG, WRONG),
    ("negated-no-marker", "It is not 5.", "5", CFG, NONE),
    ("negated-cannot-no-marker", "The result cannot be 5.", "5", CFG, NONE),
    # ---- hedges: maybe, probably, about, approximately, around, "?"
    ("hedge-maybe", "The answer is maybe 5.", "5", CFG, WRONG),
    ("hedge-probably", "The answer is probably 5.", "5", CFG, WRONG),
    ("hedge-about", "The answer is about 5.", "5", CFG, WRONG),
    ("hedge-around", "The answer is around 1000.", "1000", CFG, WRONG),
    ("hedge-approximately", "The answer is approximately 3/4.", "3/4", CFG, WRONG),
    ("hedge-approx-box", "\\boxed{\\approx 5}", "5", CFG, WRONG),
    ("hedge-word-after-number", "The answer is 5 maybe.", "5", CFG, WRONG),  # not a unit
    ("hedge-question-mark", "The answer is 5?", "5", CFG, WRONG),
    ("hedge-box-question-mark", "\\boxed{5}?", "5", CFG, WRONG),
    ("hedge-later-clause", "The answer is 5, I think.", "5", CFG, WRONG),
    ("hedge-before-marker", "Maybe the answer is 5.", "5", CFG, WRONG),
    ("hedge-think-before-box", "I think it is \\boxed{5}.", "5", CFG, WRONG),
    ("hedge-not-sure", "I'm not sure it is \\boxed{5}.", "5", CFG, WRONG),
    ("hedge-approx-sign-text", "The answer is ≈ 5.", "5", CFG, WRONG),
    ("hedge-no-marker", "Maybe 5.", "5", CFG, NONE),
    ("hedge-question-no-marker", "Is it 5?", "5", CFG, NONE),
    # ---- several candidates
    ("several-or", "The answer is 4 or 5.", "5", CFG, WRONG),
    ("several-same-value-twice", "The answer is 5 or 5.", "5", CFG, WRONG),  # still "or"
    ("several-comma", "The answer is 4, 5.", "5", CFG, WRONG),
    ("several-comma-first-right", "The answer is 5, 4.", "5", CFG, WRONG),
    ("several-and", "The answer is 4 and 5.", "5", CFG, WRONG),
    ("several-either", "The answer is either 4 or 5.", "5", CFG, WRONG),
    ("several-between", "The answer is between 4 and 6.", "5", CFG, WRONG),
    ("several-range-dash", "The answer is 4-5.", "5", CFG, WRONG),
    ("several-range-to", "The answer is from 999 to 1000.", "1000", CFG, WRONG),
    ("several-or-maybe-later", "The answer is 5, or maybe 6.", "5", CFG, WRONG),
    ("several-box-or-text", "\\boxed{4 \\text{ or } 5}", "5", CFG, WRONG),
    ("several-box-same-twice", "\\boxed{5 \\text{ or } 5}", "5", CFG, WRONG),
    ("several-two-boxes-or", "\\boxed{4} or \\boxed{5}", "5", CFG, WRONG),
    ("several-either-boxes", "Either \\boxed{4} or \\boxed{5}.", "5", CFG, WRONG),
    ("several-box-then-or", "\\boxed{5} or 4", "5", CFG, WRONG),
    ("several-plus-minus", "\\boxed{\\pm 5}", "5", CFG, WRONG),
    ("several-bold-or", "The answer is **5** or **6**.", "5", CFG, WRONG),
    ("several-unit-then-or", "\\boxed{5} apples or 6 apples", "5", CFG, WRONG),
    ("fraction-is-one-value", "The answer is 4/5.", "5", CFG, WRONG),  # 4/5 is a fraction
    # ---- lists of numbers ending in the label, no marker
    ("list-commas", "1, 2, 3, 4, 5", "5", CFG, NONE),
    ("list-and", "It could be 1, 2, 3, 4 and 5", "5", CFG, NONE),
    ("list-spaces", "Candidates 3 4 5", "5", CFG, NONE),
    # an equation's result counts only as the one number right after its last "=" / "is"
    ("equation-two-results", "So 2 + 3 = 4 or 5.", "5", CFG, NONE),
    ("equation-chain", "So 2 + 3 = 4 = 5.", "5", CFG, NONE),
    ("equation-result-then-another", "2 + 3 is 5, not 4.", "5", CFG, NONE),
    ("is-a-multiple-of", "This is because 3 is a multiple of 5", "5", CFG, NONE),
    ("restated-problem-no-result", "Calculate 10 - 5.", "5", CFG, NONE),
    # ---- a rejected marked answer, then the right number
    ("words-then-number", "The answer is five. 5", "5", CFG, WRONG),
    ("prose-then-number", "The answer is not known yet.\n\n5", "5", CFG, WRONG),
    ("expression-box-then-number", "\\boxed{2 + 3} so 5", "5", CFG, WRONG),
    ("expression-box-then-equation", "\\boxed{8 - 3}.\n\n8 - 3 = 5", "5", CFG, WRONG),
    # ---- the right number only in the restated problem
    ("restated-text", "Calculate 5 * 1. The answer is 5 * 1.", "5", CFG, WRONG),
    ("restated-box-division", "\\boxed{10 / 2}", "5", CFG, WRONG),
    ("restated-box-frac", "\\boxed{\\frac{10}{2}}", "5", CFG, WRONG),
    # ---- several boxes: the last one is the answer
    ("boxes-earlier-right-last-wrong", "\\boxed{5} then \\boxed{6}", "5", CFG, WRONG),
    ("boxes-lines-earlier-right", "\\boxed{5}\n\\boxed{6}", "5", CFG, WRONG),
    ("text-earlier-right-box-last-wrong", "The answer is 5. \\boxed{6}", "5", CFG, WRONG),
    ("box-earlier-right-text-last-wrong", "\\boxed{5}. The answer is 6.", "5", CFG, WRONG),
    # ---- empty or unclosed markers, then a number: a marker blocks the fallback
    ("empty-box-then-number", "\\boxed{} 5", "5", CFG, NONE),
    ("empty-box-line-then-number", "\\boxed{ }\n5", "5", CFG, NONE),
    ("unclosed-box-then-number", "\\boxed{4 so 5", "5", CFG, NONE),
    ("unclosed-box-lines-then-number", "\\boxed{\n\n5", "5", CFG, NONE),
    ("bare-marker-then-far-number", "The answer is" + "\n" * 6 + "5", "5", CFG, NONE),
    # ---- think blocks with after_think: only what follows </think> counts
    ("think-answer-inside", "<think>The answer is 5.</think>I am not sure.", "5", THINK, NONE),
    ("think-never-closed", "<think>\\boxed{5}", "5", THINK, NONE),
    ("think-right-inside-wrong-after", "<think>\\boxed{5}</think>\\boxed{6}", "5", THINK, WRONG),
    # ---- unicode, words, formatting
    ("unicode-minus-not-the-label", "The result is −5.", "5", CFG, WRONG),
    ("unicode-minus-boxed", "\\boxed{−5}", "5", CFG, WRONG),
    ("en-dash-minus", "The answer is –5.", "5", CFG, WRONG),
    ("label-in-words", "The answer is five.", "5", CFG, WRONG),
    ("label-in-words-box", "\\boxed{\\text{five}}", "5", CFG, WRONG),
    # ---- huge inputs (linear scans; ~50k characters each)
    ("huge-repeated-right-then-wrong", "The answer is 5. " * 3000 + "The answer is 6.", "5", CFG,
     WRONG),
    ("huge-many-boxes-last-wrong", "\\boxed{5}" * 6000 + "\\boxed{6}", "5", CFG, WRONG),
    ("huge-unclosed-boxes-then-number", "\\boxed{" * 7000 + " 5", "5", CFG, NONE),
    ("huge-empty-boxes-then-number", "\\boxed{}" * 6000 + " 5", "5", CFG, NONE),
    ("huge-number-list", "5, " * (BIG // 3), "5", CFG, NONE),
    ("huge-negations", "not " * (BIG // 4) + "5", "5", CFG, NONE),
    ("huge-hedged-box", "maybe " * (BIG // 6) + "\\boxed{5}", "5", CFG, WRONG),
    ("huge-markers-no-answer", "answer is " * (BIG // 10), "5", CFG, WRONG),
]  # fmt: skip

LEGIT = [
    ("plain", "The answer is 5.", "5", CFG, RIGHT),
    ("equation-result", "So 2 + 3 = 5.", "5", CFG, RIGHT),
    ("equation-result-in-words", "So 9 - 4 equals 5.", "5", CFG, RIGHT),
    ("restated-problem-with-result", "Calculate 10 - 5 = 5", "5", CFG, RIGHT),
    ("negation-of-another-in-later-clause", "The answer is 5, not 6.", "5", CFG, RIGHT),
    ("negative-number-is-no-negation", "The answer is -8.", "-8", CFG, RIGHT),
    ("unicode-minus-label", "The answer is −8.", "-8", CFG, RIGHT),
    ("no-inside-a-word", "Nonetheless, the answer is 5.", "5", CFG, RIGHT),
    ("now-is-not-no", "Now the answer is 5", "5", CFG, RIGHT),
    ("negation-in-earlier-clause", "It is not 4, so the answer is 5.", "5", CFG, RIGHT),
    ("doubt-in-earlier-clause", "I was unsure at first, but the answer is 5.", "5", CFG, RIGHT),
    # a negation or "or" that is not next to the answer is not about it
    (
        "not-about-another-thing",
        "The smallest number that is not a factor is \\boxed{4}.",
        "4",
        CFG,
        RIGHT,
    ),
    ("or-about-another-thing", "A red or blue ball: $\\boxed{\\frac{3}{4}}$", "3/4", CFG, RIGHT),
    ("no-about-another-thing", "There is no remainder \\boxed{5}", "5", CFG, RIGHT),
    ("no-in-earlier-clause-fallback", "There is no remainder, so 5.", "5", CFG, RIGHT),
    ("equation-after-marker", "The final answer is 3 + 2 = 5.", "5", CFG, RIGHT),
    ("reason-after-answer", "The answer is 5, since 2 + 3 = 5.", "5", CFG, RIGHT),
    ("rounding-after-box", "So \\boxed{3.14} to 2 decimal places.", "3.14", CFG, RIGHT),
    ("thousands-separator", "The answer is 1,000.", "1000", CFG, RIGHT),
    ("fraction-text", "The answer is 3/4.", "3/4", CFG, RIGHT),
    ("fraction-box", "\\boxed{\\frac{3}{4}}", "3/4", CFG, RIGHT),
    ("percent", "The answer is 50\\%.", "0.5", CFG, RIGHT),
    ("unit-word", "The answer is 5 apples.", "5", CFG, RIGHT),
    ("bold-dollars", "The answer is: **$5$**.", "5", CFG, RIGHT),
    ("bold-whole-sentence", "**The answer is 5**", "5", CFG, RIGHT),
    ("equal-to", "The answer is equal to 5.", "5", CFG, RIGHT),
    ("answer-on-next-line", "The answer is:\n\n$$\n5\n$$", "5", CFG, RIGHT),
    ("box-in-marker-line", "The answer is \\boxed{5}.", "5", CFG, RIGHT),
    ("box-in-equation", "Therefore, $x = \\boxed{5}$.", "5", CFG, RIGHT),
    ("nested-box", "\\boxed{\\boxed{5}}", "5", CFG, RIGHT),
    ("revised-box", "First \\boxed{4}, no wait: \\boxed{5}", "5", CFG, RIGHT),
    ("empty-box-then-box", "\\boxed{} and then \\boxed{5}", "5", CFG, RIGHT),
    ("end-of-turn-token", "The answer is 5.<|im_end|>\n", "5", CFG, RIGHT),
    ("fallback-one-number", "2 + 3 = 5.\nThe result is 5.<|im_end|>", "5", CFG, RIGHT),
    ("fallback-negative", "So it comes to -8", "-8", CFG, RIGHT),
    ("think-then-box", "<think>maybe 4, or 6?</think>\\boxed{5}", "5", THINK, RIGHT),
    ("think-kept-without-after-think", "<think>maybe 4</think>\\boxed{5}", "5", CFG, RIGHT),
    ("huge-nested-box", "\\boxed{" * 7000 + "5" + "}" * 7000, "5", CFG, RIGHT),
    ("huge-prose-then-answer", "x" * BIG + " The answer is 1,000.", "1000", CFG, RIGHT),
]


@pytest.mark.parametrize(
    ("text", "label", "cfg", "expected"),
    [row[1:] for row in ATTACKS + LEGIT],
    ids=[row[0] for row in ATTACKS + LEGIT],
)
def test_score(text, label, cfg, expected):
    assert score(text, label, cfg) == expected


def test_enough_attacks_and_both_ways():
    assert len(ATTACKS) >= 20 and len(LEGIT) >= 10
    assert len({row[0] for row in ATTACKS + LEGIT}) == len(ATTACKS) + len(LEGIT)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("The answer is not 5.", "rejected: negated"),
        ("The answer is maybe 5.", "rejected: hedged"),
        ("The answer is 4 or 5.", "rejected: several answers"),
        ("\\boxed{2 + 3}", "rejected: not a number"),
        ("\\boxed{} 5", NO_ANSWER),
        ("So 2 + 3 = 5.", "last number"),
        ("So 2 + 3 = 4 = 5.", NO_ANSWER),
        ("The answer is 5.", "marked"),
        ("The result is 5.", "last number"),
    ],
)
def test_read_answer_says_why(text, why):
    """``read_answer`` is the rescoring helper: the answer score grades, and why."""
    found = read_answer(text, "5", CFG)
    assert found.why == why
    assert (found.answer is not None) == (why in ("marked", "last number"))


# ---- the equivalence check a policy's answer reaches (math-verify, under kernel.sandbox's
# PARSE_LOCK when scored in worker threads) ------------------------------------------------------

HOSTILE_ANSWERS = [
    "__import__('os').system('touch /tmp/tandem_pwned')",  # sympy's parse_expr evaluates Python
    "(lambda: __import__('os').system('touch /tmp/tandem_pwned'))()",
    "\\text{__import__('os').system('touch /tmp/tandem_pwned')}",
    "\\boxed{",  # unbalanced: closes the wrapper's own brace early
    "}}}}\\boxed{7",
    "7}\\boxed{7",  # two boxes out of one answer
    "7}{5",  # closes the box it is read in: was read as 7
    "5}\\boxed{7",
    "\x00" * 10,
    "7" * 1001,  # over max_chars: refused before any parse
    "9**9**9",  # a Python tower: math-verify reads it as text, not as a power
    "\\frac{1}{" * 150 + "2" + "}" * 150,
    "(" * 300 + "8" + ")" * 300,
]


@pytest.mark.parametrize("answer", HOSTILE_ANSWERS)
def test_a_hostile_answer_is_wrong_runs_nothing_and_leaves_the_parse_lock_free(answer, tmp_path):
    """Scored where the reward hook runs, in a worker thread (no SIGALRM there): the answer is
    not equal to 7, nothing it names runs, and the lock every parse of model-written Python holds
    is free afterwards, so one reply cannot block the next scorer."""
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from kernel.sandbox import PARSE_LOCK
    from recipes.math_solver_verifier.reward import is_equivalent

    with ThreadPoolExecutor(1) as pool:
        same = pool.submit(is_equivalent, answer, "7").result(timeout=60)
    assert same is False
    assert not Path("/tmp/tandem_pwned").exists()
    assert not PARSE_LOCK.locked()


TOWERS = [
    "9^{9^{9^{9}}}",
    "10^{10^{10}}",
    "99999999^{99999999}",
    "(2^{100})!",
    "\\binom{10^9}{10^8}",
]


@pytest.mark.parametrize("answer", TOWERS)
def test_an_integer_tower_costs_the_scorer_its_timeout_not_the_run(answer):
    """math-verify evaluates integer powers, factorials and binomials while it parses, in C
    holding the GIL (hours for these): the comparison's worker is killed at ``timeout_s``, the
    answer is wrong, and the next comparison gets a fresh worker and is right."""
    from recipes.math_solver_verifier.reward import _VERIFIER, is_equivalent

    killed = _VERIFIER.killed
    assert is_equivalent(answer, "7", timeout_s=1) is False
    assert _VERIFIER.killed == killed + 1
    assert is_equivalent("7", "7", timeout_s=1) is True


def test_the_scorer_runs_from_a_script_without_a_main_guard(tmp_path):
    """The worker is a fresh interpreter: a script that scores at its top level (no ``if
    __name__ == "__main__"``) is not run again to start it."""
    import subprocess
    import sys

    script = tmp_path / "score_me.py"
    script.write_text(
        "from recipes.math_solver_verifier.reward import is_equivalent\n"
        "print('scored', is_equivalent('1/2', '0.5'), is_equivalent('3', '0.5'))\n"
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.stdout.splitlines() == ["scored True False"], (run.stdout, run.stderr[-2000:])
