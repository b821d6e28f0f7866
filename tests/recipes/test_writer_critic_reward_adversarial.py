"""Adversarial goldens for writer_critic's score (recipes/writer_critic/program.py ``score``, which
the gateway run and the recipe version, reward.py, both pay): final texts a writer could learn to
be credited for keywords it does not use in a sentence, and legitimate texts that must still be
credited, so the test fails both ways.

The rule: the share of the row's keywords the text uses (whole words, any case, each counted
once). A keyword in quotes is mentioned, not used; a text of fewer than 4 or more than 60 words,
or one that repeats 6 words of the task in a row, scores 0. Rows without keywords (the tiny
preset) score the share of digits, the toy task by design.

Fast tier: pure functions, no model.
"""

from __future__ import annotations

import pytest

from kernel.hooks import RolloutContext
from kernel.sample import Sample
from recipes.writer_critic.program import score
from recipes.writer_critic.reward import reward

TASK = "Describe a river in one sentence using the words 'red' and 'dark'."
ROW = {"prompt": TASK, "keywords": ["red", "dark"]}

CASES = [
    # legitimate uses, credited
    ("The dark river runs red under the old bridge.", 1.0),
    ("A RED, DARK river flows past the mill.", 1.0),
    ("It's dark, and the river's red tonight.", 1.0),  # apostrophes are not quotes
    ("The red-dark river flows past the town.", 1.0),
    ("The river is dark under the trees.", 0.5),
    ("The river is not red and not dark at all.", 1.0),  # a negated word is still used
    ("red red red river of the north", 0.5),  # a keyword counts once
    # gamed: no credit for what is not a use of the keyword in a sentence
    ("red dark", 0.0),  # a bare list
    ("red", 0.0),
    ("", 0.0),
    ("   \n\t ", 0.0),
    (TASK, 0.0),  # the task copied
    ("Describe a river in one sentence using the words red and dark", 0.0),  # copied, unquoted
    ("Sure! Describe a river in one sentence using the words: red, dark.", 0.0),
    ("The river, in two words: 'red' and 'dark'.", 0.0),  # mentioned, not used
    ('The river is "red" and "dark" as they say.', 0.0),
    ("The river is \u201cred\u201d and \u201cdark\u201d tonight.", 0.0),  # curly quotes
    ("The redder river darkens slowly at night.", 0.0),  # not the words
    ("The r\u0435d river is d\u0430rk tonight.", 0.0),  # Cyrillic look-alikes
    ("The reddark river flows.", 0.0),
    (" ".join(["red", "dark", *["river"] * 59]), 0.0),  # past 60 words: a dump
    ("red dark " * 5000, 0.0),  # 10k words, answered at once (linear)
]


@pytest.mark.parametrize("text, expected", CASES)
def test_a_final_text_is_credited_only_for_keywords_it_uses(text, expected):
    assert score(text, ROW) == expected


def test_keywords_match_in_any_case_and_the_tiny_rows_score_digits():
    assert score("The Red river is Dark.", {"prompt": TASK, "keywords": ["RED", "Dark"]}) == 1.0
    no_keywords = {"prompt": "Write a short line of text, number 3.", "keywords": []}
    assert score("1234", no_keywords) == 1.0
    assert score("ab12", no_keywords) == 0.5
    assert score("", no_keywords) == 0.0


@pytest.mark.xfail(strict=True, reason="a dump of many descriptive words under 60 is credited")
def test_a_list_of_many_adjectives_holding_the_keywords_is_not_credited():
    dump = "green cold old busy quiet small bright wooden stone blue warm tall red dark open"
    assert score(dump, ROW) == 0.0


def test_the_recipe_version_pays_both_agents_the_writers_final_text():
    keywords = {"keywords": ROW["keywords"]}  # the row's metadata; the task is the prompt
    final = {"final": "The dark river runs red."}
    writer = Sample(agent="writer", prompt=TASK, metadata=keywords | final)
    critic = Sample(agent="critic", prompt=TASK, metadata=dict(keywords))
    assert reward(RolloutContext(), [writer, critic]) == 1.0
    writer.metadata["final"] = TASK  # the task copied: caught with the prompt from the sample
    assert reward(RolloutContext(), [writer, critic]) == 0.0
