"""kernel.tags: the tags of model-written text, as the regular expression finds them, without
its quadratic scan. The goldens are the pattern's own matches: 20,000 random texts built from
tag fragments (nested, unclosed, stray brackets, mixed names) must give exactly what
re.finditer gives, and the think-stripping sub exactly what re.sub gives."""

from __future__ import annotations

import random
import re

from kernel.tags import Tag, find_tags, outside_tags

NAMES = ["search", "read", "answer"]
PATTERN = re.compile(r"<(search|read|answer)>(.*?)</\1>", re.DOTALL)
THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
PIECES = [
    *(f"<{n}>" for n in [*NAMES, "think"]),
    *(f"</{n}>" for n in [*NAMES, "think"]),
    *("a", "b c", "\n", "<", ">", "</", "<search", "search>", "<<read>>", "</ answer>", "<SEARCH>"),
]


def test_the_same_tags_as_the_regular_expression_on_random_texts():
    rng = random.Random(0)
    for _ in range(20000):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 30)))
        expected = [(m.group(1), m.group(2), m.start(), m.end()) for m in PATTERN.finditer(text)]
        found = [(t.name, t.inner, t.start, t.end) for t in find_tags(text, NAMES)]
        assert found == expected, text
        assert outside_tags(text, find_tags(text, ["think"])) == THINK.sub(" ", text), text


def test_goldens():
    text = "x <search>a <read>b</read></search> <answer>c</answer> <read>never closed"
    assert find_tags(text, NAMES) == [
        Tag("search", "a <read>b</read>", 2, 35),
        Tag("answer", "c", 36, 54),
    ]
    assert find_tags(text, []) == [] and find_tags("", NAMES) == []
    assert outside_tags("a<think>b</think>c", find_tags("a<think>b</think>c", ["think"])) == "a c"


def test_many_unclosed_openings_then_one_closed_tag():
    """What a policy can write to stall the pattern (16,000 unclosed openings took it 14 s):
    the one closed tag at the end is still found, and the openings before it are not tags."""
    text = "<search>" * 16000 + "<answer>42</answer>"
    assert [(t.name, t.inner) for t in find_tags(text, NAMES)] == [("answer", "42")]
    nested = "<search>" * 16000 + "</search>"  # the first opening takes the rest as its text
    (tag,) = find_tags(nested, NAMES)
    assert tag.start == 0 and tag.inner == "<search>" * 15999
