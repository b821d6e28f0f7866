"""Adversarial goldens for the debate's reward (recipes/debate/reward.py): turns a debater (or a
model judge) could write to be credited for an answer it does not commit to, and legitimate
turns that must still be read, so the test fails both ways; then the verdict: a strict
plurality, where two debaters who disagree give no verdict.

The rule: a turn is credited only for the ONE final answer it states. Once a marker occurs
("Answer: X", "answer is X") the last marked answer is the answer; negated, hedged, naming
several candidates or not a number it is a stated but invalid answer (``read_answer``: answer
None, stated True): never equal to the label, never a vote, no format penalty. A turn without
any marker answers with the one number of its last sentence, when that sentence has exactly
one and does not negate or hedge it; otherwise it stated nothing (format penalty).

Fast tier: pure functions, no model. The ~50k-character rows guard linear time (no timing is
asserted).
"""

from __future__ import annotations

import pytest

from kernel.hooks import RolloutContext
from kernel.sample import Sample
from recipes.debate.config import RecipeConfig
from recipes.debate.reward import extract_answer, majority, read_answer, reward, verdict_of

INVALID = (None, True)  # stated, but not an answer that stands
NOTHING = (None, False)  # no answer stated at all

BIG = 50_000

# (id, turn, (answer, stated))
ATTACKS = [
    # ---- negation
    ("negated-colon", "Answer: not 5", INVALID),
    ("negated-is-not", "The answer is not 5.", INVALID),
    ("negated-isnt", "The answer isn't 5.", INVALID),
    ("negated-no", "Answer: no 5", INVALID),
    ("negated-bold", "Answer: **not** 5", INVALID),
    ("negated-dont-think", "I don't think the answer is 5.", INVALID),
    ("negated-wrong-after", "Answer: 5 is wrong", INVALID),
    ("negated-box", "Answer: not \\boxed{5}", INVALID),
    ("negated-not-equal-sign", "Answer: x ≠ 5", INVALID),
    ("negated-not-true-that", "It is not true that the answer is 5.", INVALID),
    ("negated-no-marker", "It is not 5.", NOTHING),
    # ---- hedges
    ("hedge-maybe", "Answer: maybe 5", INVALID),
    ("hedge-probably", "Answer: probably 5", INVALID),
    ("hedge-about", "Answer: about 5", INVALID),
    ("hedge-approximately", "Answer: approximately 5", INVALID),
    ("hedge-around", "The answer is around 1000.", INVALID),
    ("hedge-approx-sign", "Answer: ≈5", INVALID),
    ("hedge-tilde", "Answer: ~5", INVALID),
    ("hedge-question-mark", "Answer: 5?", INVALID),
    ("hedge-word-after-number", "Answer: 5 maybe", INVALID),  # not a unit
    ("hedge-later-clause", "Answer: 5, I think.", INVALID),
    ("hedge-before-marker", "Maybe the answer is 5.", INVALID),
    ("hedge-not-sure", "I'm not sure the answer is 5.", INVALID),
    ("hedge-no-marker", "Probably 5.", NOTHING),
    ("hedge-question-no-marker", "Is it 5?", NOTHING),
    # ---- several candidates
    ("several-or", "Answer: 4 or 5", INVALID),
    ("several-same-value-twice", "Answer: 5 or 5", INVALID),  # still "or": several named
    ("several-comma", "Answer: 4, 5", INVALID),
    ("several-comma-first-right", "Answer: 5, 4", INVALID),
    ("several-no-space-comma", "Answer: 4,5", INVALID),  # not 45: no thousands separator
    ("several-and", "Answer: 4 and 5", INVALID),
    ("several-either", "Answer: either 4 or 5", INVALID),
    ("several-between", "Answer: between 4 and 6", INVALID),
    ("several-range-dash", "Answer: 4-5", INVALID),
    ("several-range-to", "Answer: 4 to 5", INVALID),
    ("several-or-maybe-later", "Answer: 5, or maybe 6.", INVALID),
    ("several-bold-or", "**Answer: 5** or **6**", INVALID),
    ("several-plus-minus", "Answer: ±5", INVALID),
    ("several-unit-then-or", "Answer: 5 apples or 6 apples", INVALID),
    ("several-or-before-marker", "4 or the answer is 5", INVALID),
    # ---- lists of numbers ending in the label, no marker
    ("list-commas", "1, 2, 3, 4, 5", NOTHING),
    ("list-spaces", "Candidates: 3 4 5", NOTHING),
    ("list-and", "It is 1, 2, 3, 4 and 5", NOTHING),
    ("equation-two-results", "So 2 + 3 = 4 or 5.", NOTHING),
    ("equation-chain", "So 2 + 3 = 4 = 5.", NOTHING),
    # ---- a rejected marked answer, then the right number
    ("words-then-number", "Answer: five. 5", INVALID),
    ("prose-then-number-line", "Answer: unknown\n5", INVALID),
    ("expression-then-number", "Answer: 2 + 3\nSo 5", INVALID),
    ("restated-problem", "Calculate 2 + 3. Answer: 2 + 3", INVALID),
    # ---- several markers: the last one is the answer
    ("markers-earlier-right-last-wrong", "Answer: 5. Answer: 6", ("6", True)),
    ("markers-earlier-right-last-hedged", "Answer: 5\nAnswer: maybe 6", INVALID),
    ("empty-marker-far-from-number", "Answer:" + "\n" * 6 + "5", NOTHING),
    # ---- unicode, words
    ("unicode-minus", "Answer: −5", ("-5", True)),
    ("en-dash-minus", "Answer: –5", ("-5", True)),
    ("label-in-words", "Answer: five", INVALID),
    # ---- huge inputs (~50k characters)
    ("huge-repeated-then-wrong", "Answer: 5. " * 4500 + "Answer: 6", ("6", True)),
    ("huge-bare-markers", "Answer: " * 6000, INVALID),
    ("huge-number-list", "5, " * (BIG // 3), NOTHING),
    ("huge-negations", "not " * (BIG // 4) + "5", NOTHING),
    ("huge-hedged-marker", "maybe " * (BIG // 6) + "the answer is 5", INVALID),
]

LEGIT = [
    ("plain", "5 - 3 = 2. Answer: 2", ("2", True)),
    ("equation-result", "So 2 + 3 = 5.", ("5", True)),  # no marker: the equation's result
    ("answer-is", "First 7, then the answer is -4.", ("-4", True)),
    ("revised", "Answer: 3, no wait. Answer: **12**", ("12", True)),
    ("negation-of-another-after", "The answer is 5, not 6.", ("5", True)),
    ("negative-is-no-negation", "Answer: -8", ("-8", True)),
    ("no-inside-a-word", "Nonetheless, the answer is 5.", ("5", True)),
    ("negation-in-earlier-clause", "It is not 4, so the answer is 5.", ("5", True)),
    # a negation or "or" that is not next to the answer is not about it
    ("not-about-another-thing", "The least that is not a factor is the answer = 4", ("4", True)),
    ("or-about-another-thing", "The number of red or blue balls is 5.", ("5", True)),
    ("no-in-earlier-clause", "There is no remainder, so it is 5.", ("5", True)),
    ("thousands", "Answer: 1,250", ("1250", True)),
    ("fraction", "Answer: 3/4", ("3/4", True)),
    ("latex-fraction", "Answer: \\frac{3}{4}", ("3/4", True)),
    ("unit-word", "Answer: 12 apples", ("12", True)),
    ("bold-marker", "**Answer:** 7", ("7", True)),
    ("dollars", "Answer: $5$.", ("5", True)),
    ("boxed", "Answer: \\boxed{5}", ("5", True)),
    ("equation", "Answer: x = 5", ("5", True)),
    ("next-line", "Answer:\n**5**", ("5", True)),
    ("truncated-last-marker", "Answer: 5\nAnswer:", ("5", True)),
    ("end-of-turn-token", "Answer: 5<|im_end|>\n", ("5", True)),
    ("fallback-one-number", "5 - 3 = 2.\nSo it is 2.", ("2", True)),
    ("fallback-thousands", "It is 1,250 in total", ("1250", True)),
    ("fallback-fraction", "half: 1/2", ("1/2", True)),
    ("nothing", "I do not know.", NOTHING),
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [row[1:] for row in ATTACKS + LEGIT],
    ids=[row[0] for row in ATTACKS + LEGIT],
)
def test_read_answer(text, expected):
    assert tuple(read_answer(text)) == expected
    assert extract_answer(text) == expected[0]


def test_enough_attacks_and_both_ways():
    assert len(ATTACKS) >= 20 and len(LEGIT) >= 10
    assert len({row[0] for row in ATTACKS + LEGIT}) == len(ATTACKS) + len(LEGIT)


# ---- the verdict: a strict plurality of the valid final answers ----------------------------

TWO = ["alice", "bob"]
THREE = ["alice", "bob", "carol"]
VERDICTS = [
    # (id, final turns, order, verdict)
    ("two-disagree-no-verdict", {"alice": "Answer: 8", "bob": "Answer: 2"}, TWO, None),
    ("two-disagree-other-order", {"alice": "Answer: 2", "bob": "Answer: 8"}, TWO, None),
    ("two-agree", {"alice": "Answer: 2", "bob": "The answer is 2.0."}, TWO, "2"),
    ("hedged-is-no-vote", {"alice": "Answer: 2", "bob": "Answer: maybe 8"}, TWO, "2"),
    ("both-hedged", {"alice": "Answer: 2 or 8", "bob": "Answer: about 2"}, TWO, None),
    ("list-is-no-vote", {"alice": "2, 8", "bob": "Answer: 8"}, TWO, "8"),
    (
        "three-tie-after-invalid",
        {"alice": "Answer: 4 or 2", "bob": "Answer: 2", "carol": "Answer: 8"},
        THREE,
        None,
    ),
    (
        "three-plurality",
        {"alice": "Answer: 8", "bob": "Answer: 2", "carol": "Answer: 2"},
        THREE,
        "2",
    ),
    (
        "three-all-different",
        {"alice": "Answer: 1", "bob": "Answer: 2", "carol": "Answer: 3"},
        THREE,
        None,
    ),
    ("nobody-valid", {"alice": "Answer: not 2", "bob": "no idea"}, TWO, None),
]


@pytest.mark.parametrize(
    ("finals", "order", "verdict"),
    [row[1:] for row in VERDICTS],
    ids=[row[0] for row in VERDICTS],
)
def test_verdict_of_final_turns(finals, order, verdict):
    assert verdict_of(finals, order) == verdict
    answers = {name: extract_answer(text) for name, text in finals.items()}
    assert majority(answers, order) == verdict


def _debate(turns: dict[str, list[str]], verdict: str | None = None, label: str = "2"):
    meta = {"debate": turns, "verdict": verdict}
    return [
        Sample(prompt="Calculate 5 - 3.", label=label, agent=name, metadata=dict(meta))
        for name in turns
    ]


REWARDS = [
    # (id, final turns, judge's verdict text or None (majority), rewards, verdict right)
    # correct 1.0, verdict 0.5, format penalty 0.5 (RecipeConfig's defaults)
    (
        "hedge-scores-zero-no-penalty",
        {"alice": ["Answer: 2"], "bob": ["Answer: maybe 2"]},
        None,
        {"alice": 1.5, "bob": 0.0},
        True,
    ),
    (
        "several-candidates-score-zero",
        {"alice": ["Answer: 2 or 8"], "bob": ["I cannot tell"]},
        None,
        {"alice": 0.0, "bob": -0.5},
        False,
    ),
    (
        "negated-right-answer-no-credit",
        {"alice": ["The answer is not 2."], "bob": ["Answer: 8"]},
        None,
        {"alice": 0.0, "bob": 0.0},
        False,
    ),
    (
        "two-disagree-first-is-not-favoured",
        {"alice": ["Answer: 2"], "bob": ["Answer: 8"]},
        None,
        {"alice": 1.0, "bob": 0.0},
        False,
    ),
    (
        "list-ending-in-label",
        {"alice": ["6, 4, 2"], "bob": ["Answer: 2"]},
        None,
        {"alice": -0.5, "bob": 1.5},
        True,
    ),
    (
        "judge-hedged-verdict",
        {"alice": ["Answer: 2"], "bob": ["Answer: 8"]},
        "Answer: probably 2",
        {"alice": 1.0, "bob": 0.0, "judge": 0.0},
        False,
    ),
    (
        "judge-two-candidates",
        {"alice": ["Answer: 2"], "bob": ["Answer: 8"]},
        "Answer: 2 or 8",
        {"alice": 1.0, "bob": 0.0, "judge": 0.0},
        False,
    ),
    (
        "judge-negated-other",
        {"alice": ["Answer: 2"], "bob": ["Answer: 8"]},
        "Bob is wrong. Answer: 2, not 8",
        {"alice": 1.5, "bob": 0.0, "judge": 1.0},
        True,
    ),
]


@pytest.mark.parametrize(
    ("turns", "judged", "rewards", "right"),
    [row[1:] for row in REWARDS],
    ids=[row[0] for row in REWARDS],
)
def test_rewards(turns, judged, rewards, right):
    cfg = RecipeConfig(judge="model" if judged is not None else "majority").validate()
    samples = _debate(turns, verdict=judged)
    assert reward(RolloutContext(config=cfg), samples) == rewards
    assert all(s.metadata["correct"] is right for s in samples)
    assert samples[0].metadata["metrics"]["verdict_correct"] == float(right)


def test_per_turn_credit_reads_each_round_strictly():
    """credit: turn: an earlier round's hedged answer earns nothing and costs no penalty;
    a round without any answer costs the penalty."""
    cfg = RecipeConfig(credit="turn").validate()
    turns = {"alice": ["Answer: maybe 2", "Answer: 2"], "bob": ["hmm", "Answer: 2"]}
    samples = [
        Sample(prompt="Calculate 5 - 3.", label="2", agent=name, turn=t, metadata={"debate": turns})
        for name in turns
        for t in range(2)
    ]
    assert reward(RolloutContext(config=cfg), samples) == [0.0, 1.5, -0.5, 1.5]
