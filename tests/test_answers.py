"""Golden values for kernel/answers.py, the reading of a reply's one final answer that the math
and debate recipes share. The recipes' adversarial sets (tests/recipes/test_*_adversarial.py)
pin the whole readings; these rows pin the kernel's API on its own."""

import re

import pytest

from kernel.answers import (
    NUMBER,
    clause_after_marker,
    clause_from,
    doubt,
    last_sentence_number,
    right_side,
    strip_end_token,
)

MARKER = "answer is"


def _text_doubt(text: str, **kw) -> str | None:
    """``doubt`` of the text marker "answer is" in ``text``, as a recipe calls it."""
    start = text.index(MARKER)
    words, end = clause_after_marker(text, start + len(MARKER))
    return doubt(text, start, words, end, **kw)


@pytest.mark.parametrize(
    "text, why",
    [
        ("The answer is 5", None),
        ("The answer is 5, not 6.", None),  # a negation in a later clause is fine
        ("It is not 4, so the answer is 5", None),  # the negation is before the connective
        ("The number that is not a factor: the answer is 4", None),  # not next to the answer
        ("The answer is not 5", "rejected: negated"),
        ("It is not true that the answer is 5", "rejected: negated"),
        ("I think the answer is 5", "rejected: hedged"),
        ("The answer is about 5", "rejected: hedged"),
        ("The answer is 5?", "rejected: hedged"),
        ("The answer is 5, maybe.", "rejected: hedged"),
        ("4 or the answer is 5", "rejected: several answers"),
        ("The answer is 4 and 5", "rejected: several answers"),
        ("The answer is 5, 6.", "rejected: several answers"),
    ],
)
def test_doubt_of_a_text_answer(text, why):
    assert _text_doubt(text) == why


def test_doubt_of_an_enclosed_answer_and_the_words_after_it():
    def box(text: str, content: str) -> str | None:
        after, end = clause_from(text, text.index("}") + 1)
        return doubt(text, 0, content, end, after=after, enclosed=True)

    assert box("\\boxed{5}.", "5") is None
    assert box("\\boxed{no}.", "no") is None  # an enclosed "no" is what it says
    assert box("\\boxed{4 and 5}.", "4 and 5") is None
    assert box("\\boxed{maybe 5}.", "maybe 5") == "rejected: hedged"
    assert box("\\boxed{5} is wrong.", "5") == "rejected: negated"
    assert box("\\boxed{5} or 6.", "5") == "rejected: several answers"
    assert box("\\boxed{5} apples or 6.", "5") == "rejected: several answers"


def test_later_not_equal_counts_a_not_equal_sign_in_a_later_clause():
    assert _text_doubt("The answer is 5, ≠ 6.") is None
    assert _text_doubt("The answer is 5, ≠ 6.", later_not_equal=True) == "rejected: negated"
    assert last_sentence_number("It is 5, ≠ x") == "5"
    assert last_sentence_number("It is 5, ≠ x", later_not_equal=True) is None


@pytest.mark.parametrize(
    "text, number",
    [
        ("So the result is 7.", "7"),
        ("We get 1,000 apples.", "1,000"),
        ("Step 1: add.\nThe total is -8", "-8"),
        ("It is 5.\nMaybe 6", None),  # hedged
        ("So 3 + 4 = 7.", "7"),  # an equation: its result
        ("4 - 1 = 3", "3"),
        ("So 9 - 3 equals 6.", "6"),
        ("So, -2 * 3 is -6.", "-6"),
        ("6 - 5 is equal to 1.", "1"),
        ("(2 * 3) = 6", "6"),
        ("So 3 + 4 = 7 or 8.", None),  # several results
        ("So 3 + 4 = 6 = 7.", None),  # a chain names two
        ("3 + 4 is 7, not 6.", None),  # two numbers after the last "is"
        ("3 + 4 = maybe 7.", None),  # hedged
        ("3 + 4 = 7?", None),  # a question
        ("Either 3 + 4 = 7", None),
        ("1, 2, 3, 4, 5, 6, 7", None),  # a list: no equation
        ("The values are 3, 4 and 7.", None),  # "are" states no result
        ("So, 2 * 7 is indeed 14.", "14"),  # filler words aside
        ("5 + 2 = 7 is correct.", "7"),  # "is correct" states no number: the "=" before
        ("So 5 + 2 = 6 is wrong.", None),  # negated
        ("So 5 + 2 = 6 = 7 is correct.", None),  # a chain
        ("This is because 3 is a multiple of 5, and any", None),  # "a multiple of" is no result
        ("No number here.", None),
        ("The result is not 7.", None),
        ("The result is 7 or 8.", None),
        ("x is 5, 6.", None),
    ],
)
def test_last_sentence_number(text, number):
    assert last_sentence_number(text) == number


def test_last_sentence_number_takes_the_recipes_number_pattern():
    frac = re.compile(r"\\frac\{\d+\}\{\d+\}|" + NUMBER.pattern)
    assert last_sentence_number("We get \\frac{1}{2}.") is None  # "1" and "2"
    assert last_sentence_number("We get \\frac{1}{2}.", frac) == "\\frac{1}{2}"


@pytest.mark.parametrize(
    "text, stripped",
    [
        ("5<|im_end|>", "5"),
        ("five </s>\n", "five"),
        ("x <|eot_id|><|end_of_text|>  ", "x"),
        ("a <b>", "a <b>"),
        ("plain \n", "plain"),
    ],
)
def test_strip_end_token(text, stripped):
    assert strip_end_token(text) == stripped


@pytest.mark.parametrize(
    "after, clause, answer",
    [
        (": 5.", "5", "5"),
        (" **42**", "42", "42"),
        (":\n\n$$\n7\n$$", "7", "7"),  # the next line with text
        (" 3 + 4 = 7.", "3 + 4 = 7", "7"),
        (" x = 5, so done", "x = 5", "5"),
        (" $12$ apples", "12$ apples", "12$ apples"),
    ],
)
def test_clause_after_marker_and_right_side(after, clause, answer):
    text = "The answer is" + after
    found, end = clause_after_marker(text, len("The answer is"))
    assert (found, right_side(found)) == (clause, answer)
    assert text[end : end + 1] in ("", ",", ".", "\n")


def test_clause_after_marker_finds_nothing_after_a_truncated_marker():
    assert clause_after_marker("The answer is", 13) is None
    assert clause_after_marker("The answer is:\n\n  \n", 13) is None
