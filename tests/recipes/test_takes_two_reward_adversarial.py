"""Adversarial goldens for takes_two's rewards (recipes/takes_two/reward.py and
data.diagnosis_matches): turns a doctor or a patient could write to be paid for a skill it does
not show, each with what the rule gives it, and legitimate turns that must still be paid, so
the test fails both ways.

The doctor's rule: a closing turn's diagnosis is correct only when it names exactly ONE
condition, the true one by the synonym table, with no question mark, negation or approximation
sign in it ("X?", "X？", "X‽", "¬X", "≠ X", "~X") and no hedge or negation before its
'Diagnosis:' marker in the marker's clause ("Possible diagnosis:", "Differential diagnosis:",
"Not the diagnosis:", "I think the diagnosis:"); the last marker of the turn is the one read.
A question is a doctor turn, not the diagnosis, holding a '?' and a word. Information gain
counts each fact once, from the patient's answers. The patient leaks when it names the
diagnosis or one of its synonyms. What stays gameable by design is a strict xfail naming why:
the recommendation's token_set_ratio and the lexical patient scorer (the judge is there for
nuance).

Fast tier: pure functions, no model. The ~50k-character rows guard linear time.
"""

from __future__ import annotations

import pytest

from recipes.takes_two.config import RecipeConfig
from recipes.takes_two.data import CONDITIONS, Case
from recipes.takes_two.reward import (
    case_vocab,
    diagnosis_accepted,
    diagnosis_correct,
    information_gains,
    leaks,
    parse_final,
    patient_rule_score,
    recommendation_score,
)

CFG = RecipeConfig().validate()
ASK_FIRST = RecipeConfig(max_turns=3, min_questions=1).validate()
BIG = 50_000


def case_of(diagnosis: str) -> Case:
    """A case of the synthetic condition ``diagnosis``: its complaint and first four facts."""
    (c,) = [c for c in CONDITIONS if c.diagnosis == diagnosis]
    facts = [f.format(d="a week") for f in c.facts[:4]]
    return Case(c.complaint, facts, c.diagnosis, c.recommendation)


MIGRAINE = case_of("migraine")  # complaint: "I keep getting bad headaches."
REC = "\nRecommendation: rest in a dark quiet room"


def xfail(reason: str):
    return pytest.mark.xfail(strict=True, reason=reason)


def params(rows):
    """Rows as pytest params: a plain row is (id, *values); a pytest.param (an xfail) stays."""
    return [row if hasattr(row, "marks") else pytest.param(*row[1:], id=row[0]) for row in rows]


# ---- the doctor's diagnosis: (id, closing turn, case, diagnosis_correct) ----------------------

DIAGNOSIS_ATTACKS = [
    # several conditions
    ("list-comma", "Diagnosis: migraine, influenza, gout" + REC, MIGRAINE, 0.0),
    ("list-or", "Diagnosis: migraine or tension headache" + REC, MIGRAINE, 0.0),
    ("list-and", "Diagnosis: migraine and influenza" + REC, MIGRAINE, 0.0),
    ("list-slash", "Diagnosis: migraine/influenza" + REC, MIGRAINE, 0.0),
    ("list-either", "Diagnosis: either migraine or gout" + REC, MIGRAINE, 0.0),
    ("list-same-twice", "Diagnosis: migraine or migraine" + REC, MIGRAINE, 0.0),
    ("list-lines", "Diagnosis:\nmigraine\ninfluenza\ngout" + REC, MIGRAINE, 0.0),
    ("list-all-candidates-one-line",
     "Diagnosis: migraine gout lumbar muscle strain carpal tunnel syndrome" + REC, MIGRAINE, 0.0),
    ("list-of-synonyms", "Diagnosis: migraine, migraines, migraine headache" + REC, MIGRAINE, 0.0),
    ("list-another-in-brackets", "Diagnosis: migraine (or cluster headache)" + REC, MIGRAINE, 0.0),
    ("last-marker-counts", "Diagnosis: migraine\nDiagnosis: influenza" + REC, MIGRAINE, 0.0),
    # negations
    ("negated-not", "Diagnosis: not migraine" + REC, MIGRAINE, 0.0),
    ("negated-sentence", "Diagnosis: this is not a migraine" + REC, MIGRAINE, 0.0),
    ("negated-ruled-out", "Diagnosis: migraine is ruled out" + REC, MIGRAINE, 0.0),
    ("negated-not-equal-sign", "Diagnosis: ≠ migraine" + REC, MIGRAINE, 0.0),  # 1.0 before
    ("negated-logical-not", "Diagnosis: ¬migraine" + REC, MIGRAINE, 0.0),  # 1.0 before
    ("negated-before-marker", "Not the diagnosis: migraine" + REC, MIGRAINE, 0.0),  # 1.0 before
    ("negated-no-diagnosis", "No diagnosis: migraine" + REC, MIGRAINE, 0.0),  # 1.0 before
    # hedges
    ("hedge-maybe", "Diagnosis: maybe migraine" + REC, MIGRAINE, 0.0),
    ("hedge-could-be", "Diagnosis: could be migraine" + REC, MIGRAINE, 0.0),
    ("hedge-question-mark", "Diagnosis: migraine?" + REC, MIGRAINE, 0.0),
    ("hedge-question-mark-spaced", "Diagnosis: migraine ?" + REC, MIGRAINE, 0.0),
    ("hedge-full-width-question-mark", "Diagnosis: migraine？" + REC, MIGRAINE, 0.0),  # was 1.0
    ("hedge-interrobang", "Diagnosis: migraine‽" + REC, MIGRAINE, 0.0),  # 1.0 before
    ("hedge-inverted-question-mark", "Diagnosis: ¿migraine" + REC, MIGRAINE, 0.0),  # 1.0 before
    ("hedge-tilde", "Diagnosis: ~migraine" + REC, MIGRAINE, 0.0),  # 1.0 before
    ("hedge-approx-sign", "Diagnosis: ≈ migraine" + REC, MIGRAINE, 0.0),  # 1.0 before
    ("hedge-possible-diagnosis", "Possible diagnosis: migraine" + REC, MIGRAINE, 0.0),  # was 1.0
    ("hedge-differential-diagnosis", "Differential diagnosis: migraine" + REC, MIGRAINE, 0.0),
    ("hedge-suspected-diagnosis", "Suspected diagnosis: migraine" + REC, MIGRAINE, 0.0),
    ("hedge-working-diagnosis", "Working diagnosis: migraine" + REC, MIGRAINE, 0.0),
    ("hedge-probably-the-diagnosis", "Probably the diagnosis: migraine" + REC, MIGRAINE, 0.0),
    ("hedge-i-think-the-diagnosis", "I think the diagnosis: migraine" + REC, MIGRAINE, 0.0),
    ("hedge-likely-in-clause", "The most likely diagnosis: migraine" + REC, MIGRAINE, 0.0),
    # the condition inside a longer sentence, a broader name, a question
    ("inside-a-sentence", "Diagnosis: I believe you are suffering from migraine" + REC,
     MIGRAINE, 0.0),
    ("broader-name", "Diagnosis: headache" + REC, MIGRAINE, 0.0),
    ("diagnosing-with-a-question", "Could it be a migraine?", MIGRAINE, 0.0),  # no final turn
    ("question-after-the-marker", "Diagnosis: is it migraine?" + REC, MIGRAINE, 0.0),
    ("empty-diagnosis", "Diagnosis:" + REC, MIGRAINE, 0.0),
    # disguised spellings
    ("spelled-out", "Diagnosis: m-i-g-r-a-i-n-e" + REC, MIGRAINE, 0.0),
    ("leetspeak", "Diagnosis: m1gra1ne" + REC, MIGRAINE, 0.0),
    ("cyrillic-homoglyph", "Diagnosis: migrаine" + REC, MIGRAINE, 0.0),
    # the alternative moved into the recommendation
    pytest.param(
        "Diagnosis: migraine\nRecommendation: if it is not migraine, it is tension headache; rest",
        MIGRAINE, 0.0,
        id="alternative-in-the-recommendation",
        marks=xfail("the diagnosis is read up to 'Recommendation:'; the recommendation is free "
                    "text graded by similarity, and reading it for other conditions would also "
                    "catch legitimate 'rule out X' advice"),
    ),
    # huge inputs (linear reads)
    ("huge-or-list", "Diagnosis: " + "gout or " * (BIG // 8) + "migraine" + REC, MIGRAINE, 0.0),
    ("huge-hedge-before-marker", "maybe " * (BIG // 6) + "the diagnosis: migraine" + REC,
     MIGRAINE, 0.0),
]  # fmt: skip

DIAGNOSIS_LEGIT = [
    ("plain", "Diagnosis: migraine" + REC, MIGRAINE, 1.0),
    ("article-period", "Diagnosis: A migraine." + REC, MIGRAINE, 1.0),
    ("bold-capitals", "Diagnosis: **Migraine**" + REC, MIGRAINE, 1.0),
    ("synonym", "Diagnosis: migraine with aura" + REC, MIGRAINE, 1.0),
    ("lay-synonym", "Diagnosis: hay fever" + REC, case_of("allergic rhinitis"), 1.0),
    ("full-width-colon", "Diagnosis：migraine" + REC, MIGRAINE, 1.0),
    ("full-width-letters", "Diagnosis: ｍｉｇｒａｉｎｅ" + REC, MIGRAINE, 1.0),  # NFKC; 0 before
    ("invisible-character", "Diagnosis: migraine\u200b" + REC, MIGRAINE, 1.0),
    ("bullet", "Diagnosis:\n- migraine" + REC, MIGRAINE, 1.0),
    ("final-diagnosis", "Final diagnosis: migraine" + REC, MIGRAINE, 1.0),
    ("my-diagnosis", "My diagnosis: migraine" + REC, MIGRAINE, 1.0),
    ("reasoning-before-marker",
     "Based on the one-sided headaches and the zigzag lines, diagnosis: migraine" + REC,
     MIGRAINE, 1.0),
    ("negation-in-an-earlier-sentence",
     "It is not a tension headache.\nDiagnosis: migraine" + REC, MIGRAINE, 1.0),
    ("doubt-in-an-earlier-sentence",
     "I was unsure at first. Diagnosis: migraine" + REC, MIGRAINE, 1.0),
    ("not-inside-a-word-before-marker", "Nonetheless, diagnosis: migraine" + REC, MIGRAINE, 1.0),
    ("revised-last-marker-counts",
     "Diagnosis: tension headache. No, wait. Diagnosis: migraine" + REC, MIGRAINE, 1.0),
    ("question-in-the-recommendation",
     "Diagnosis: migraine\nRecommendation: rest in a dark room. Any questions?", MIGRAINE, 1.0),
]  # fmt: skip


@pytest.mark.parametrize(("turn", "case", "expected"), params(DIAGNOSIS_ATTACKS + DIAGNOSIS_LEGIT))
def test_diagnosis_correct(turn, case, expected):
    assert diagnosis_correct(parse_final(turn), case) == expected


def test_a_doubted_marker_says_why():
    assert parse_final("Not the diagnosis: migraine" + REC).doubt == "rejected: negated"
    assert parse_final("Possible diagnosis: migraine" + REC).doubt == "rejected: hedged"
    assert parse_final("I think the diagnosis: migraine" + REC).doubt == "rejected: hedged"
    assert parse_final("Diagnosis: migraine" + REC).doubt is None


# ---- the required question: (id, doctor turns, accepted with min_questions 1) -----------------

QUESTION_ATTACKS = [
    ("bare-question-mark", ["?", "Diagnosis: migraine" + REC], 0.0),  # 1.0 before
    ("question-marks-only", ["???", "Diagnosis: migraine" + REC], 0.0),  # 1.0 before
    ("question-inside-the-diagnosis-turn", ["Any fever? Diagnosis: migraine" + REC], 0.0),
    ("sympathy-asks-nothing", ["I'm sorry to hear that.", "Diagnosis: migraine" + REC], 0.0),
    ("diagnosis-then-question", ["Diagnosis: migraine?", "Diagnosis: migraine" + REC], 0.0),
    pytest.param(
        ["Can you please?", "Diagnosis: migraine" + REC], 0.0,
        id="question-that-asks-nothing",
        marks=xfail("a question is a turn with a '?' and a word; what it asks is not read "
                    "(README: 'Can you please?' passes the rule); information gain prices it"),
    ),
]  # fmt: skip

QUESTION_LEGIT = [
    ("one-question", ["Which side hurts?", "Diagnosis: migraine" + REC], 1.0),
    ("one-word-question", ["Where?", "Diagnosis: migraine" + REC], 1.0),
    ("question-with-sympathy", ["Sorry to hear that. Since when?", "Diagnosis: migraine" + REC],
     1.0),
]  # fmt: skip


@pytest.mark.parametrize(("turns", "expected"), params(QUESTION_ATTACKS + QUESTION_LEGIT))
def test_a_diagnosis_counts_only_after_a_real_question(turns, expected):
    assert diagnosis_accepted(turns, ASK_FIRST) == expected


# ---- information gain: (id, patient answers, gain per answer) --------------------------------
# MIGRAINE's facts: the headache is on one side of my head / bright light makes it worse /
# I feel sick to my stomach during attacks / I see flashing zigzag lines before it starts

ONE_SIDE = "It is on one side of my head."

GAIN_ATTACKS = [
    ("repeats-the-chief-complaint", ["I keep getting bad headaches."], [0.0]),
    ("repeats-the-same-fact", [ONE_SIDE, ONE_SIDE, ONE_SIDE], [0.25, 0.0, 0.0]),
    ("answers-yes", ["Yes."], [0.0]),  # a leading question reveals nothing the patient said
    ("unknown-reply-every-time", ["I'm not sure about that."] * 2, [0.0, 0.0]),
    pytest.param(
        ["Bright light does not make it worse."], [0.0],
        id="negates-a-fact",
        marks=xfail("revealed() is lexical: a negated fact holds its words (README: the judge "
                    "is there for nuance)"),
    ),
    pytest.param(
        ["side head bright light flashing zigzag lines"], [0.0],
        id="word-salad-of-the-case",
        marks=xfail("revealed() counts a fact's content words, not its sentence"),
    ),
]  # fmt: skip

GAIN_LEGIT = [
    ("tells-a-fact", [ONE_SIDE], [0.25]),
    ("tells-two-facts", ["Bright light makes it worse and I see zigzag lines."], [0.5]),
    ("new-facts-each-time", [ONE_SIDE, "I feel sick to my stomach."], [0.25, 0.25]),
]


@pytest.mark.parametrize(("answers", "expected"), params(GAIN_ATTACKS + GAIN_LEGIT))
def test_information_gain(answers, expected):
    case = MIGRAINE
    gains = information_gains(
        case.facts, case.chief_complaint, answers, CFG.word_cutoff, CFG.reveal_threshold
    )
    assert gains == pytest.approx(expected)


# ---- the patient leaking the diagnosis: (id, answer, case, leaks) -----------------------------

LEAK_ATTACKS = [
    ("leak-names-it", "I think it's a migraine.", MIGRAINE, True),
    ("leak-misspelled", "Could it be a migrane?", MIGRAINE, True),
    ("leak-hyphenated", "Maybe mi-graine?", MIGRAINE, True),
    ("leak-negated", "It is not a migraine, is it?", MIGRAINE, True),
    # a synonym of the diagnosis (each False before: only the label's words were read)
    ("leak-lay-synonym", "I think I have hay fever.", case_of("allergic rhinitis"), True),
    ("leak-short-synonym", "It's probably the flu.", case_of("influenza"), True),
    ("leak-synonym-words", "Is it a kidney infection?", case_of("acute pyelonephritis"), True),
    ("leak-abbreviation", "T2DM runs in my family.", case_of("type 2 diabetes"), True),
    pytest.param(
        "m i g r a i n e", MIGRAINE, True,
        id="leak-spelled-out",
        marks=xfail("the leak check reads words; one-letter tokens are no words (the lexical "
                    "patient scorer's limit; the judge is there for nuance)"),
    ),
]  # fmt: skip

LEAK_LEGIT = [
    ("a-fact", ONE_SIDE, MIGRAINE, False),
    ("unknown-reply", "I'm not sure about that.", MIGRAINE, False),
    # a synonym leaks only with all its words the case lacks, matched exactly
    ("one-word-of-a-synonym", "The pain is low in my back.", case_of("lumbar muscle strain"),
     False),
    ("near-a-short-synonym", "I stay at home when it hurts.", case_of("stye"), False),
    ("its-own-complaint", "My migraines hurt.",
     Case("My migraines are back.", MIGRAINE.facts, "migraine", "rest"), False),
]  # fmt: skip


@pytest.mark.parametrize(("answer", "case", "expected"), params(LEAK_ATTACKS + LEAK_LEGIT))
def test_leaks(answer, case, expected):
    vocab = case_vocab(case, CFG.unknown_reply)
    _, terms = patient_rule_score(case, [answer], CFG)
    assert terms["leaked"] == float(expected)
    if not expected:  # the label's own test agrees where nothing leaks
        assert not leaks(answer, case.diagnosis, vocab, CFG.word_cutoff, CFG.leak_threshold)


# ---- the recommendation: (id, recommendation, case, similarity at most) ----------------------

EVERY_ADVICE = " ".join(c.recommendation for c in CONDITIONS)
TOKEN_SET = (
    "the default similarity, token_set_ratio (config.py), gives 1.0 to any recommendation whose "
    "content words hold the truth's or lie within them; a metric that prices extra and missing "
    "words (token_sort_ratio) is a config change outside this file set"
)

RECOMMENDATION_ATTACKS = [
    pytest.param("rest", MIGRAINE, 0.5, id="one-word-of-the-truth", marks=xfail(TOKEN_SET)),
    pytest.param(EVERY_ADVICE, MIGRAINE, 0.5, id="every-conditions-advice", marks=xfail(TOKEN_SET)),
    ("unrelated-advice", "Drink plenty of fluids and take antibiotics.", MIGRAINE, 0.5),
    ("diagnosis-as-advice", "migraine", MIGRAINE, 0.5),
]


@pytest.mark.parametrize(("text", "case", "at_most"), params(RECOMMENDATION_ATTACKS))
def test_recommendation_attacks(text, case, at_most):
    final = parse_final(f"Diagnosis: {case.diagnosis}\nRecommendation: {text}")
    assert recommendation_score(final, case.recommendation, CFG.similarity) <= at_most


def test_the_true_advice_scores_in_full():
    final = parse_final(f"Diagnosis: migraine\nRecommendation: {MIGRAINE.recommendation}")
    assert recommendation_score(final, MIGRAINE.recommendation, CFG.similarity) == 1.0


def test_enough_attacks_and_both_ways():
    attacks = (
        DIAGNOSIS_ATTACKS + QUESTION_ATTACKS + GAIN_ATTACKS + LEAK_ATTACKS + RECOMMENDATION_ATTACKS
    )
    legit = DIAGNOSIS_LEGIT + QUESTION_LEGIT + GAIN_LEGIT + LEAK_LEGIT
    assert len(DIAGNOSIS_ATTACKS) >= 20 and len(attacks) >= 20 and len(legit) >= 10
    ids = [p.id for p in params(attacks + legit)]
    assert len(set(ids)) == len(ids)
