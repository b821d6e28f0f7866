"""Adversarial goldens for deep_research's answer scorer (recipes/deep_research/reward.py): final
answers a policy could write to be credited without finding the answer -- several candidates,
the gold inside a negation or a hedge, passages dumped as the answer, empty and unicode tricks
-- each with the (exact_match, f1, gold_in_answer) it gets, and legitimate answers that must
still score, so the test fails both ways; then whole turns through the tag parser
(tools.parse_action) to the agent's reward.

The rule: EM and F1 are SQuAD's, except that an answer that takes itself back, hedges or names
several (``answer_doubt``: a negation, a hedge, "or"/"and", a range, "?", "~" that the gold
answer does not hold itself) scores 0 against that gold, F1 and gold_in_answer included. F1's
partial credit for extra words is by design (a sentence, "Santa Clara, California"), so the
rows a comma list or a copied passage would need are strict xfails: they document what F1
still pays.

Fast tier: pure functions, no model. The ~50k-character rows guard linear time (no timing is
asserted).
"""

from __future__ import annotations

import pytest

from kernel.hooks import RolloutContext
from kernel.sample import Sample
from recipes.deep_research.config import RecipeConfig
from recipes.deep_research.reward import answer_doubt, answer_metrics, reward
from recipes.deep_research.tools import Action, parse_action

TOWN = ["Nyquoholm"]  # a learn_test.jsonl gold: "In which town was Dorbek Garul born?"
YEAR = ["1842"]
NONE = (0.0, 0.0, 0.0)
RIGHT = (1.0, 1.0, 1.0)
BIG = 50_000

F1_ONLY = "F1's partial credit for extra words is by design"


def xfail(reason: str):
    return pytest.mark.xfail(strict=True, reason=reason)


def params(rows):
    """Rows as pytest params: a plain row is (id, *values); a pytest.param (an xfail) stays."""
    return [row if hasattr(row, "marks") else pytest.param(*row[1:], id=row[0]) for row in rows]


# (id, answer, golds, (exact_match, f1, gold_in_answer))
ATTACKS = [
    # ---- several candidates in one answer (each paid F1 2/(n+1) and gold_in_answer 1 before)
    ("several-or", "Nyquoholm or Pelford", TOWN, NONE),
    ("several-or-same-twice", "Nyquoholm or Nyquoholm", TOWN, NONE),
    ("several-either", "either Nyquoholm or Pelford", TOWN, NONE),
    ("several-and", "Nyquoholm and Pelford", TOWN, NONE),
    pytest.param(
        "Nyquoholm & Pelford", TOWN, NONE,
        id="several-ampersand",
        marks=xfail(f"{F1_ONLY}: '&' is no doubt sign, since this world's company names hold "
                    "it ('Wexer & Sons', also inside sentence answers); F1 2/3"),
    ),
    ("several-slash-joins", "Nyquoholm/Pelford", TOWN, NONE),  # punctuation joins: no token
    ("several-in-a-sentence", "It is one of Nyquoholm, Pelford and Erstead.", TOWN, NONE),
    ("several-otherwise", "Nyquoholm, otherwise Pelford", TOWN, NONE),
    ("several-between-years", "between 1842 and 1850", YEAR, NONE),
    ("several-range-en-dash", "1842 – 1850", YEAR, NONE),  # "–" was a token of its own
    ("several-range-to", "1842 to 1850", YEAR, NONE),
    pytest.param(
        "Nyquoholm, Pelford, Erstead", TOWN, NONE,
        id="several-comma-list",
        marks=xfail(f"{F1_ONLY}: a comma also brings a qualifier ('Santa Clara, California', "
                    "a golden in test_deep_research_reward.py), so a comma list keeps F1 2/4"),
    ),
    pytest.param(
        "Nyquoholm\nPelford", TOWN, NONE,
        id="several-line-list",
        marks=xfail(f"{F1_ONLY}: lines are read as words, F1 2/3"),
    ),
    # ---- the gold inside a negation (F1 2/3 and gold_in_answer 1 before)
    ("negated-not", "not Nyquoholm", TOWN, NONE),
    ("negated-isnt", "It isn't Nyquoholm", TOWN, NONE),
    ("negated-isnt-curly-apostrophe", "It isn’t Nyquoholm", TOWN, NONE),
    ("negated-never", "never Nyquoholm", TOWN, NONE),
    ("negated-wrong-after", "Nyquoholm is wrong", TOWN, NONE),
    ("negated-in-brackets", "Nyquoholm (not)", TOWN, NONE),
    ("negated-neither-nor", "neither Nyquoholm nor Pelford", TOWN, NONE),
    ("negated-not-equal-sign", "≠ Nyquoholm", TOWN, NONE),
    ("negated-logical-not", "¬ Nyquoholm", TOWN, NONE),
    ("negated-full-width-not", "ｎｏｔ Nyquoholm", TOWN, NONE),  # NFKC folds it to "not"
    pytest.param(
        "nоt Nyquoholm", TOWN, NONE,  # a Cyrillic "о"
        id="negated-homoglyph-not",
        marks=xfail(f"{F1_ONLY}: a homoglyph 'nоt' is just another extra word, F1 2/3"),
    ),
    # ---- hedges
    ("hedge-maybe", "maybe Nyquoholm", TOWN, NONE),
    ("hedge-probably", "probably Nyquoholm", TOWN, NONE),
    ("hedge-most-likely", "most likely Nyquoholm", TOWN, NONE),
    ("hedge-i-think", "I think Nyquoholm", TOWN, NONE),
    ("hedge-not-sure", "not sure, Nyquoholm", TOWN, NONE),
    ("hedge-question-mark", "Nyquoholm?", TOWN, NONE),  # exact match 1.0 before
    ("hedge-full-width-question-mark", "Nyquoholm？", TOWN, NONE),
    ("hedge-tilde-year", "~1842", YEAR, NONE),  # exact match 1.0 before
    ("hedge-approx-sign-year", "≈ 1842", YEAR, NONE),
    ("hedge-about-year", "about 1842", YEAR, NONE),
    ("hedge-around-year", "around 1842", YEAR, NONE),
    ("hedge-circa-year", "circa 1842", YEAR, NONE),
    ("question-copied-as-answer", "In which town was Dorbek Garul born?", TOWN, NONE),
    # ---- retrieved text dumped as the answer
    pytest.param(
        "Dorbek Garul was a weaver born in 1812 in the town of Nyquoholm.", TOWN, NONE,
        id="dump-one-passage",
        marks=xfail(f"{F1_ONLY}: a passage is a long sentence answer, F1 2/(n+1) = 2/12 and "
                    "gold_in_answer 1; a length cap would be a new setting"),
    ),
    pytest.param(
        "[Dorbek Garul] Dorbek Garul was a weaver born in 1812 in the town of Nyquoholm.\n\n"
        "[Nyquoholm] Nyquoholm is a town in the Ostmark region on the river Shavel. It is known "
        "for its blue cheese.", TOWN, NONE,
        id="dump-search-result",
        marks=xfail(f"{F1_ONLY}: F1 2/(n+1), about 0.06; gold_in_answer 1"),
    ),
    # a dump with a negation or a list in it is no answer at all
    ("dump-with-negation", "Nyquoholm is not in the Suldra Valley region.", TOWN, NONE),
    ("dump-with-list", "Nyquoholm is known for wind chimes and blue cheese.", TOWN, NONE),
    # ---- empty, punctuation, articles, invisible characters
    ("punctuation-only", "?!.", TOWN, NONE),
    ("articles-only", "The a an", TOWN, NONE),
    ("ideographic-space", "\u3000", TOWN, NONE),
    ("zero-width-space", "\u200b", TOWN, NONE),
    ("zero-width-inside-gold", "Nyquo\u200bholm", TOWN, NONE),
    ("full-width-gold", "Ｎｙｑｕｏｈｏｌｍ", TOWN, NONE),  # not folded for EM: not the gold
    ("gold-inside-a-longer-word", "Nyquoholmsen", TOWN, NONE),
    ("support-id-as-answer", "p070", TOWN, NONE),
    # ---- very long answers: F1's precision makes them worthless; linear time
    ("huge-repeated-gold", "Nyquoholm " * (BIG // 10), TOWN, (0.0, 2 / (BIG // 10 + 1), 1.0)),
    ("huge-prose-then-gold", "word " * (BIG // 5) + "Nyquoholm", TOWN,
     (0.0, 2 / (BIG // 5 + 2), 1.0)),
    ("huge-negations-then-gold", "not " * (BIG // 4) + "Nyquoholm", TOWN, NONE),
    ("huge-or-list", "Pelford or " * (BIG // 10) + "Nyquoholm", TOWN, NONE),
]  # fmt: skip

LEGIT = [
    ("exact", "Nyquoholm", TOWN, RIGHT),
    ("article-case-period", "the nyquoholm.", TOWN, RIGHT),
    ("exclamation", "Nyquoholm!", TOWN, RIGHT),
    ("year", "1842", YEAR, RIGHT),
    ("thousands-separator", "1,842", YEAR, RIGHT),
    # a sentence keeps F1's partial credit: [he was born in nyquoholm], P 1/5, R 1 -> 1/3
    ("sentence", "He was born in Nyquoholm.", TOWN, (0.0, 1 / 3, 1.0)),
    ("year-in-words", "born in 1842", YEAR, (0.0, 0.5, 1.0)),
    ("month-is-no-hedge", "May 1842", YEAR, (0.0, 2 / 3, 1.0)),
    # a comma qualifier is no list: [fenfioford town in suldra valley], P 1/5 -> 1/3
    ("comma-qualifier", "Fenfioford, a town in the Suldra Valley", ["Fenfioford"],
     (0.0, 1 / 3, 1.0)),
    ("comma-qualifier-squad", "Santa Clara, California", ["Levi's Stadium", "Santa Clara"],
     (0.0, 0.8, 1.0)),
    ("state-abbreviation-is-no-circa", "Santa Clara, CA", ["Santa Clara"], (0.0, 0.8, 1.0)),
    # a doubt word or sign the gold answer holds itself stands
    ("gold-is-no", "No.", ["no"], RIGHT),
    ("gold-holds-a-negation", "No Man's Land", ["No Man's Land"], RIGHT),
    ("gold-holds-and", "Pride and Prejudice", ["Pride and Prejudice"], RIGHT),
    ("gold-holds-ampersand", "Wexer & Sons", ["Wexer & Sons"], RIGHT),
    # [wexer and sons] vs [wexer sons]: common 2, P 2/3, R 1 -> 0.8; not the gold's tokens
    ("and-for-the-golds-ampersand", "Wexer and Sons", ["Wexer & Sons"], (0.0, 0.8, 0.0)),
    ("gold-holds-a-range", "1842-1850", ["1842-1850"], RIGHT),
    ("gold-holds-a-question-mark", "Why?", ["Why?"], RIGHT),
    ("not-inside-a-word", "Nottingham", ["Nottingham"], RIGHT),
    ("or-inside-a-word", "Oregon", ["Oregon"], RIGHT),
    ("any-gold-counts", "Ann Lee", ["Lee", "Ann Lee"], RIGHT),
]  # fmt: skip


@pytest.mark.parametrize(("answer", "golds", "expected"), params(ATTACKS + LEGIT))
def test_answer_metrics(answer, golds, expected):
    m = answer_metrics(answer, golds)
    assert (m["exact_match"], m["f1"], m["gold_in_answer"]) == pytest.approx(expected)


def test_enough_attacks_and_both_ways():
    ids = [row.id for row in params(ATTACKS + LEGIT)]
    assert len(ATTACKS) >= 20 and len(LEGIT) >= 10 and len(set(ids)) == len(ids)


def _agent(final_answer, golds, format_ok=None, **meta) -> Sample:
    ok = final_answer is not None if format_ok is None else format_ok
    return Sample(
        label=golds, agent="agent", metadata={"final_answer": final_answer, "format_ok": ok, **meta}
    )


def _reward(samples, **cfg):
    # the learn preset's weights
    config = RecipeConfig(em_weight=1.0, f1_weight=0.5, format_weight=0.1, **cfg).validate()
    return reward(RolloutContext(config=config), samples)


@pytest.mark.parametrize(("answer", "golds", "expected"), params(ATTACKS + LEGIT))
def test_the_reward_is_em_f1_and_format_of_the_same_reading(answer, golds, expected):
    """agent = 1.0 * EM + 0.5 * F1 + 0.1 * format: the metrics above are what is paid."""
    em, f1, _ = expected
    (got,) = _reward([_agent(answer, golds)])
    assert got == pytest.approx(1.0 * em + 0.5 * f1 + 0.1)


# ---- whole turns: the tag parser, then the reward (1.0 EM + 0.5 F1 + 0.1 format) -------------

TURNS = [
    # no answer stands: no format credit either
    ("answer-outside-tags", "The answer is Nyquoholm.", 0.0),
    ("two-answer-tags", "<answer>Pelford</answer><answer>Nyquoholm</answer>", 0.0),
    ("two-answer-tags-same", "<answer>Nyquoholm</answer><answer>Nyquoholm</answer>", 0.0),
    ("answer-only-inside-think", "<think><answer>Nyquoholm</answer></think> done", 0.0),
    ("unclosed-answer", "<answer>Nyquoholm", 0.0),
    ("empty-answer-tag", "<answer>  </answer>", 0.0),
    ("search-and-answer-in-one-turn", "<search>Dorbek Garul</search><answer>Nyquoholm</answer>",
     0.0),
    # an answer, but a doubted one: the format term only
    ("hedged-inside-the-tag", "<answer>Nyquoholm?</answer>", 0.1),
    ("several-inside-the-tag", "<answer>Nyquoholm or Pelford</answer>", 0.1),
    ("negated-inside-the-tag", "<answer>not Nyquoholm</answer>", 0.1),
    pytest.param(
        "It is not <answer>Nyquoholm</answer>", 0.1,
        id="negated-outside-the-tag",
        marks=xfail("the text around the tag is not read (tools.parse_action takes the tag's "
                    "content; outside this change); with stop_at_tags nothing follows the tag"),
    ),
    # legitimate turns
    ("right", "<answer>Nyquoholm</answer>", 1.6),
    ("doubts-inside-think-only",
     "<think>maybe Pelford or Erstead?</think><answer>Nyquoholm</answer>", 1.6),
    ("reasoning-before-the-tag", "Dorbek Garul was born in Nyquoholm.\n<answer>Nyquoholm</answer>",
     1.6),
]  # fmt: skip


@pytest.mark.parametrize(("turn", "expected"), params(TURNS))
def test_a_turn_through_the_parser_to_the_reward(turn, expected):
    action = parse_action(turn)
    answer = action.arg if isinstance(action, Action) and action.kind == "answer" else None
    (got,) = _reward([_agent(answer, TOWN)])
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("answer", "gold", "why"),
    [
        ("not Nyquoholm", "Nyquoholm", "rejected: negated"),
        ("Nyquoholm?", "Nyquoholm", "rejected: hedged"),
        ("about 1842", "1842", "rejected: hedged"),
        ("Nyquoholm or Pelford", "Nyquoholm", "rejected: several answers"),
        ("1842 – 1850", "1842", "rejected: several answers"),
        ("Nyquoholm", "Nyquoholm", None),
        ("No Man's Land", "No Man's Land", None),
    ],
)
def test_answer_doubt_says_why(answer, gold, why):
    assert answer_doubt(answer, gold) == why


def test_summaries_and_evidence_are_not_read_as_answers():
    """The searcher's answer_in_summary reads evidence, where a negation is a fact ("Nyquoholm,
    not Pelford"); the evidence term counts retrieved documents, whatever the answer says: a
    doubted answer earns format and evidence only."""
    searcher = Sample(
        label=TOWN, agent="searcher", metadata={"summary": "Nyquoholm, not Pelford [p070]"}
    )
    agent = _agent("not Nyquoholm", TOWN, support=["p070"], retrieved=["p070"])
    got = _reward([agent, searcher], searcher_reward="answer_in_summary", evidence_weight=0.5)
    # agent: 0 (doubted) + 0.1 format + 0.5 * 1/1 evidence; searcher: 1 + 0.5 * 0 (none of its own)
    assert got == pytest.approx([0.6, 1.0])
