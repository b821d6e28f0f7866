"""The tool-use environment (kernel.env.tools): the calculator evaluates arithmetic and refuses
anything else; the Python REPL runs in the sandbox, keeps earlier cells' names and mutes their
output, and the sandbox's refusals reach the agent as errors; the scratch folder keeps files
within the episode and refuses paths that leave it; answers end the episode and are scored;
every call and error is counted in ``info``; settings that cannot work are refused; an action
is read in one linear pass, exactly as the regular expressions it replaced read it, and the
calculator refuses what would overflow, recurse or take long."""

from __future__ import annotations

import asyncio
import os
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.env import BadAction
from kernel.env.tools import ToolEnv, answer_stands, calculate, parse_action, same_answer

SANDBOX = {"timeout_s": 5, "cpu_s": 5}
ITEM = {"prompt": "What is 4821 * 937?", "label": "4517277"}


def play(actions: list[str], **settings):
    async def episode():
        env = ToolEnv(sandbox=SANDBOX, **settings)
        seen = [await env.reset(ITEM)]
        folder = env.folder
        for action in actions:
            seen.append(await env.step(action))
        await env.close()
        return seen, folder

    return asyncio.run(episode())


def test_the_calculator_computes_arithmetic_and_refuses_everything_else():
    assert calculate("4821 * 937") == 4517277 and calculate("-(2 + 3) ** 2") == -25
    assert calculate("7 // 2") == 3 and calculate("7 / 2") == 3.5 and calculate("2 ** -1") == 0.5
    for bad, why in [
        ("__import__('os').system('x')", "only numbers"),
        ("x + 1", "only numbers"),
        ("2 ** 1000", "exponent 1000"),
        ("10 ** 30 * 10 ** 30", "too large"),
        ("1 / 0", "division by zero"),
        ("1 +", "not an arithmetic expression"),
        ("'a' * 3", "only numbers"),
        ("1e300 ** 2", "a number in it is too large"),
        ("1e39 ** 64", "the result is too large"),  # OverflowError, said as a refusal
        ("-" * 2000 + "1", "nested too deeply"),  # RecursionError
        ("1+" * 1900 + "1", "nested too deeply"),
        ("(-8) ** 0.5", "not a real number"),
        ("0x" + "f" * 130_000 + " ** 64", "at most 4000 characters"),
        ("0x" + "f" * 40 + " ** 64", "a number in it is too large"),
    ]:
        with pytest.raises(ValueError, match=why):
            calculate(bad)


def test_answers_compare_as_numbers_or_as_text():
    assert same_answer("4,517,277", "4517277") and same_answer(" 4517277.0 ", "4517277")
    assert not same_answer("4517278", "4517277") and same_answer("Lima ", "lima")


def test_an_episode_with_every_local_tool():
    seen, folder = play(
        [
            "Let me compute. <calculator>4821 * 937</calculator>",
            "<python>x = 41\nprint('muted later')</python>",
            "<python>print(x + 1)</python>",
            "<python>import socket\nsocket.socket()</python>",
            '<write path="work/notes.txt">4517277</write>',
            "<read>work/notes.txt</read>",
            "I think so.",
            "<search>multiplication</search>",
            "<answer>4,517,277</answer>",
        ]
    )
    texts = [o.text for o in seen]
    assert seen[0].reward is None
    assert texts[0].endswith(  # the episode's own tools only
        "Use one tag per turn: <calculator>EXPR</calculator>, <python>CODE</python>, "
        '<write path="FILE">TEXT</write>, <read>FILE</read> or <answer>ANSWER</answer>.'
    )
    assert texts[1] == "4517277" and texts[2] == "muted later\n" and texts[3] == "42\n"
    assert "PermissionError" in texts[4] and "socket" in texts[4]  # the sandbox refused it
    assert texts[5] == "wrote 7 characters to work/notes.txt" and texts[6] == "4517277"
    assert texts[7].startswith("Use one tag per turn") and seen[7].reward == -0.1
    assert texts[8].startswith("search is not available here")
    assert [o.done for o in seen] == [False] * 9 + [True] and seen[-1].reward == 1.0
    assert seen[-1].info == {
        "calls_calculator": 1.0,
        "calls_python": 3.0,
        "errors": 2.0,
        "calls_write": 1.0,
        "calls_read": 1.0,
        "no_tag": 1.0,
        "calls_search": 1.0,
        "correct": True,
    }
    assert not os.path.exists(folder)  # the scratch folder is gone with the episode


def test_the_scratch_folder_refuses_paths_that_leave_it(tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    seen, _ = play(
        [
            f"<read>{outside}</read>",
            "<read>../../../../etc/passwd</read>",
            f'<write path="{tmp_path}/x.txt">no</write>',
            '<write path="a/../../b.txt">no</write>',
            "<read>missing.txt</read>",
            "<python>open('/etc/passwd', 'w')</python>",
            "<answer>12</answer>",
        ]
    )
    assert all("outside the scratch folder" in o.text for o in seen[1:5])
    assert "no file 'missing.txt'" in seen[5].text and "python error" in seen[6].text
    assert seen[-1].done and seen[-1].reward == 0.0 and seen[-1].info["errors"] == 6.0
    assert not (tmp_path / "x.txt").exists() and outside.read_text() == "secret"


def test_files_are_bounded_and_settings_are_checked():
    seen, _ = play(['<write path="a">1</write>', '<write path="b">2</write>'], max_files=1)
    assert "at most 1 files" in seen[2].text
    seen, _ = play(['<write path="a">12345</write>'], max_file_chars=4)
    assert "at most 4 characters" in seen[1].text
    with pytest.raises(ValueError, match="unknown \\['browser'\\]"):
        ToolEnv(tools=["calculator", "browser"])
    with pytest.raises(ValueError, match="search needs a retriever_url"):
        ToolEnv(tools=["search"])

    async def misuse():
        env = ToolEnv()
        with pytest.raises(BadAction, match="before reset"):
            await env.step("<answer>1</answer>")
        with pytest.raises(BadAction, match="needs 'prompt' and 'label'"):
            await env.reset({"prompt": "x"})

    asyncio.run(misuse())


def test_an_unclosed_last_tag_runs_to_the_end_and_calls_can_pay_or_cost():
    actions = ["<calculator>6 * 7", "<calculator>6 * ", "no tag", "<answer>4517277"]
    seen, _ = play(actions, call_reward=0.5)
    assert [o.text[:20] for o in seen[1:3]] == ["42", "calculator error: no"]
    assert [o.reward for o in seen[1:]] == [0.5, 0.0, -0.1, 1.0] and seen[-1].done
    seen, _ = play([*actions[:2], "<python>1</python>"], tools=["calculator"], error_penalty=-0.2)
    assert [o.reward for o in seen[1:]] == [0.0, -0.2, -0.2]  # a failed call, a missing tool


def test_the_task_shows_only_the_episodes_tools_and_the_example():
    example = "Example: <calculator>12 * 34</calculator>, then <answer>408</answer>."
    seen, _ = play(["<python>1</python>"], tools=["calculator"], example=example)
    assert seen[0].text == (
        "What is 4821 * 937?\n\nUse one tag per turn: <calculator>EXPR</calculator> or "
        f"<answer>ANSWER</answer>. {example}"
    )
    assert seen[1].text.startswith("python is not available here. Use one tag per turn: <calc")


# The regular expressions parse_action replaced (quadratic on many unclosed tags): it must read
# every action as they did, but for a write path holding '<' (no longer a path).
OLD_ACTION = re.compile(
    r"<(?P<tag>calculator|python|search|read|answer)>(?P<body>.*?)</(?P=tag)>"
    r'|<write\s+path="(?P<path>[^"]*)">(?P<text>.*?)</write>',
    re.DOTALL,
)
OLD_UNCLOSED = re.compile(
    r"<(?P<tag>calculator|python|search|read|answer)>(?P<body>.*)\Z", re.DOTALL
)
PIECES = [
    "<calculator>",
    "</calculator>",
    "<python>",
    "</python>",
    "<answer>",
    "</answer>",
    "<read>",
    "</read>",
    "<search>",
    "</search>",
    '<write path="',
    '<write  path="a/b',
    '">',
    "</write>",
    '"',
    "1+2",
    " ",
    "\n",
    "x",
    "<",
    ">",
    "/",
]


def _old(action: str):
    m = OLD_ACTION.search(action) or OLD_UNCLOSED.search(action)
    if m is None:
        return None
    if m["tag"]:
        return m["tag"], m["body"], None
    return "write", m["text"], m["path"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=14))
def test_parse_action_reads_actions_as_the_old_expressions_did(pieces):
    action = "".join(pieces)
    new = parse_action(action)
    old = _old(action)
    if old is not None and old[2] is not None and "<" in old[2]:
        return  # a path with '<' in it: no longer a write
    assert (tuple(new) if new else None) == old, action


def test_parse_action_is_linear_in_the_action():
    """60 KB of unclosed tags cost the old expression seconds (one scan to the end per tag)."""
    for action in ["<calculator>" * 5000, "<python>" * 7500, '<write path="' * 4600]:
        began = time.perf_counter()
        parse_action(action)
        assert time.perf_counter() - began < 0.1, action[:20]


@pytest.mark.parametrize(
    ("answer", "label", "same"),
    [
        ("4,517,277", "4517277", True),
        ("4517277.0", "4517277", True),
        ("4,5", "45", False),  # a list, not a thousands separator
        ("12345665650000", "12345665654322", False),  # whole numbers compare exactly
        ("0.1", "0.10000000001", True),
        (" Paris ", "paris", True),
    ],
)
def test_same_answer_goldens(answer, label, same):
    assert same_answer(answer, label) is same


@pytest.mark.parametrize(
    ("action", "stands"),
    [
        ("<answer>5</answer>", True),
        ("The product is <answer>5</answer>", True),
        ("It is not <answer>5</answer>", False),
        ("Maybe <answer>5</answer>", False),
        ("<answer>5 or 6</answer>", False),
        ("<answer>5</answer><answer>6</answer>", False),
        ("<answer>5", True),  # unclosed at the end of the turn: still its one answer
    ],
)
def test_an_answer_stands_only_alone_and_undoubted(action, stands):
    assert answer_stands(action) is stands
