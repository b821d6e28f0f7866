"""scripts/rescore.py: stored held-out replies scored again by today's scorers -- the logged
value kept beside (``passed_as_run``), episodes matched across agents' lines by their order."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from scripts import rescore  # noqa: E402

END = "<|im_end|>\n"


def _held(*labels: str):
    """The held-out items' reader a rescorer takes: the items as SeedRun.held_out gives them."""
    return lambda: [SimpleNamespace(label=label) for label in labels]


def _line(row: int, agent: str, texts: list[str], passed: list[bool]) -> dict:
    return {"row": row, "agent": agent, "texts": texts, "passed": passed}


def test_turns_are_the_agents_own():
    text = "First.<|im_end|>\n<|im_start|>user\nNo.<|im_end|>\n<|im_start|>assistant\nSecond."
    assert rescore.turns(text + END) == ["First.", "Second."]


def test_math_solver_answers_are_scored_again_and_the_logged_value_kept():
    config = {"recipe": "math_solver_verifier", "recipe_args": {"workflow": "solver"}}
    fix = rescore.rescorer(config, _held("5", "7"))
    lines = [
        _line(0, "solver", ["The answer is not 5." + END, "So 2 + 3 = 5." + END], [True, True]),
        _line(1, "solver", ["It is 6 or 7." + END], [True]),
    ]
    fix(lines)
    assert [x["passed"] for x in lines] == [[False, True], [False]]
    assert [x["passed_as_run"] for x in lines] == [[True, True], [True]]


def test_the_selectors_pick_is_read_from_the_offered_rewrites_in_episode_order():
    config = {
        "recipe": "math_solver_verifier",
        "recipe_args": {"workflow": "solver_rewriter_selector", "num_parallel": 2},
    }
    fix = rescore.rescorer(config, _held("4"))
    rewrites = ["The answer is 3.", "The answer is 4.", "The answer is 4.", "Maybe 4."]
    selector = ["Judgment: 2" + END, "Judgment: 2" + END]  # episode 0 picks right, 1 a hedge
    lines = [_line(0, "rewriter", rewrites, [False] * 4), _line(0, "selector", selector, [0, 0])]
    lines[1]["metrics"] = [{"rewrite_accuracy": 0.5}, {"rewrite_accuracy": 1.0}]  # as logged
    fix(lines)
    assert lines[1]["passed"] == [True, False]
    # a random pick among the offered, today: 1 of 2 right in episode 0, 1 of 2 in episode 1
    assert [m["rewrite_accuracy"] for m in lines[1]["metrics"]] == [0.5, 0.5]


def test_debate_verdict_of_two_who_disagree_is_none():
    config = {"recipe": "debate", "recipe_args": {"debaters": ["alice", "bob"]}}
    fix = rescore.rescorer(config, _held("3", "3"))
    lines = [
        _line(0, "alice", ["Answer: 3" + END], [True]),  # bob says 4: a tie, no verdict
        _line(0, "bob", ["Answer: 4" + END], [True]),
        _line(1, "alice", ["Answer: 3" + END], [True]),
        _line(1, "bob", ["First 4.<|im_end|>\n<|im_start|>assistant\nAnswer: 3" + END], [True]),
    ]
    fix(lines)
    assert [x["passed"] for x in lines] == [[False], [False], [True], [True]]


def test_deep_research_answers_are_matched_again():
    fix = rescore.rescorer({"recipe": "deep_research"}, _held(["Oslo"], ["Rome"]))
    tool = "<|im_start|>user\n<information><answer>Rome</answer></information><|im_end|>\n"
    lines = [
        _line(
            0, "agent", ["<search>q</search>" + END + "<|im_start|>assistant\n<answer>Oslo?"], [1]
        ),
        _line(1, "agent", ["<search>q</search>" + END + tool], [True]),  # a passage is no answer
        _line(0, "searcher", ["<summary>Oslo</summary>"], [True]),
    ]
    fix(lines)
    assert [x["passed"] for x in lines] == [[False], [False], [True]]
    assert rescore.research_answer("<answer>Oslo</answer>" + END) == "Oslo"


def test_gym_tools_answers_are_checked_again():
    held = [
        SimpleNamespace(label="45", metadata={"env": "tools"}),
        SimpleNamespace(label="7", metadata={"env": "math"}),
    ]
    fix = rescore.rescorer({"recipe": "gym", "recipe_args": {}}, lambda: held)
    call = "<calculator>9 * 5</calculator>" + END + "<|im_start|>user\n45<|im_end|>\n"
    lines = [
        _line(
            0,
            "default",
            [
                call + "<|im_start|>assistant\n<answer>45</answer>" + END,
                "<answer>45</answer><answer>46</answer>" + END,
            ],
            [True, True],
        ),
        _line(1, "default", ["The answer is 7." + END], [True]),  # another environment: as logged
    ]
    fix(lines)
    assert [x["passed"] for x in lines] == [[True, False], [True]]


def test_workflows_whose_scorer_did_not_change_have_no_rescorer():
    unread = lambda: pytest.fail("the held-out items are read only to rescore")  # noqa: E731
    assert rescore.rescorer({"recipe": "takes_two"}, unread) is None
    assert (
        rescore.rescorer({"recipe": "debate", "recipe_args": {"style": "procon"}}, unread) is None
    )
    assert rescore.rescorer({"model": "m"}, unread) is None  # a config naming no recipe
