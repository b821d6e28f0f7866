"""recipes/math_solver_verifier/read_replies.py reads a run's held-out replies: each role's own
final answers rescored, first answers against revised ones, the verifier's verdicts (a reply
opening with neither Yes nor No counted apart) and the selector's picks; plain and gzipped
evaluation files."""

from __future__ import annotations

import json
from pathlib import Path

from kernel.run.results import SeedRun
from recipes.math_solver_verifier import read_replies, verdicts
from recipes.math_solver_verifier.config import as_config
from tests.recipes.conftest import write_learning_run

TEST = "recipes/math_solver_verifier/data/arith2-12d_test.jsonl"  # row 0: 5 - 3, row 1: -9 - 8
CONFIG = {  # the parts of a run's config.json its evaluation reads the held-out problems by
    "data": {},
    "eval": {"path": TEST, "n_samples": 2, "max_prompts": 4},
    "recipe_args": {"answer": {"format_penalty": -0.5}},
}
REVISE = "<|im_end|>\n<|im_start|>user\nA verifier rejected your solution.<|im_end|>\n"
REVISE += "<|im_start|>assistant\n"


def _episodes() -> list[dict]:
    return [
        {  # wrong, then revised to the right answer; the one without a number never revised
            "row": 0,
            "agent": "solver",
            "passed": [True, False],
            "texts": [
                "5 - 3 = 1." + REVISE + "5 - 3 = 2. So it is 2.<|im_end|>\n",
                "I cannot say.<|im_end|>\n",
            ],
            "metrics": [{"solved": 1.0, "approved_correct": 1.0}, {"solved": 0.0}],
        },
        {  # right at once; approved
            "row": 1,
            "agent": "solver",
            "passed": [True, True],
            # the strict rule: an equation alone states no answer (three numbers)
            "texts": ["-9 - 8 = -17.\nIt is -17.<|im_end|>\n", "The answer is -17.<|im_end|>\n"],
            "metrics": [{"approved_correct": 1.0}, {"approved_correct": 1.0}],
        },
        {  # one reply rejects, then approves; the other opens with no verdict
            "row": 0,
            "agent": "verifier",
            "passed": [True, False],
            "texts": [
                "No, 5 - 3 is 2." + REVISE + "Yes.<|im_end|>\n",
                "Verdict: approve<|im_end|>\n",
            ],
            "metrics": [{}, {}],
        },
        {  # the selector picks rewrite 2; then no valid pick (12 of 2); then two picks
            "row": 0,
            "agent": "selector",
            "passed": [True, False, False],
            "texts": [
                "Judgment: 2<|im_end|>\n",
                "Judgment: 12<|im_end|>\n",
                "Judgment: 1, or Judgment: 2<|im_end|>\n",
            ],
            "metrics": [{}, {}, {}],
        },
    ]


def _run(tmp_path: Path) -> Path:
    return write_learning_run(tmp_path, CONFIG, _episodes())


def test_turns_splits_a_role_dialogue_at_the_other_speakers_messages():
    assert read_replies.turns("a<|im_end|>\n") == ["a"]
    assert read_replies.turns("a" + REVISE + "b<|im_end|>\n") == ["a", "b"]


def test_read_rescores_answers_and_counts_verdicts(tmp_path):
    run = _run(tmp_path)
    rows = [json.loads(line) for line in Path(TEST).read_text().splitlines()]
    assert [r["label"] for r in rows[:2]] == ["2", "-17"]
    labels = [str(sample.label) for sample in SeedRun.read(run / "seed0").held_out()]
    assert labels == [r["label"] for r in rows[:4]]
    recipe = as_config(CONFIG["recipe_args"])
    figures = read_replies.read(run / "seed0" / "eval" / "step_32.jsonl.gz", labels, recipe)
    solver, verifier, selector = figures["solver"], figures["verifier"], figures["selector"]
    assert solver["n"] == 4 and solver["right"] == 3 / 4  # the revised answer counts
    assert solver["answered"] == 3 / 4 and solver["first"] == 2 / 4 and solver["revised"] == 1 / 4
    assert solver["approved_right"] == 1.0
    assert solver["opening"] == ("5 - 3 = 1.", 1)
    assert verifier["n"] == 2 and verifier["right"] == 1 / 2  # the logged outcome
    assert verifier["decisions"] == {"reject": 1 / 3, "approve": 1 / 3, "none": 1 / 3}
    assert selector["n"] == 3 and selector["right"] == 1 / 3  # the logged outcome
    assert selector["decisions"] == {"picks 2": 1 / 3, "none": 1 / 3, "two": 1 / 3}


def test_main_prints_each_role_of_the_first_and_last_evaluation(tmp_path, capsys):
    run = _run(tmp_path)
    read_replies.main([str(run)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:6] == ["run", "seed", "eval", "role", "n", "right;"]
    assert [line.split()[:4] for line in lines[1:]] == [
        ["run", "seed0", "step_0", "selector"],
        ["run", "seed0", "step_0", "solver"],
        ["run", "seed0", "step_0", "verifier"],
        ["run", "seed0", "step_32", "selector"],
        ["run", "seed0", "step_32", "solver"],
        ["run", "seed0", "step_32", "verifier"],
    ]
    assert "none 0.333 picks 2 0.333 two 0.333" in lines[1]
    assert "first 0.500 revised 0.250" in lines[2]
    assert "approve 0.333 none 0.333 reject 0.333" in lines[3]


def test_verdict_parsers_of_both_protocols():
    assert verdicts.tag_verdict("Verdict: \nVerdict: approve") is True
    assert verdicts.tag_verdict("Verdict: approve\nVerdict: reject") is None  # two: none
    assert verdicts.tag_verdict("Verdict: Yes") is None
    ask, prefix, parse = verdicts.PROTOCOLS["verdict_tag"]
    assert ask("Calculate 5 - 3.", "2", 400).endswith("'Verdict: reject'.") and prefix
    ask, prefix, parse = verdicts.PROTOCOLS["yes_no"]
    assert ask("Calculate 5 - 3.", "2", 400).endswith("Yes or No.") and not prefix
    assert parse("No, it is 2.") is False


def test_verdicts_probe_runs_both_protocols_on_a_runs_solutions(tmp_path, tiny_model_dir, capsys):
    run = _run(tmp_path)  # the solvers' first answers: row 0 (5 - 3) wrong, row 1 right
    picked = verdicts.solutions(run, 1, seed=0)
    assert [(q, ok) for q, _, ok in picked] == [
        ("Calculate ( -9 - 8 ).", True),
        ("Calculate 5 - 3.", False),
    ]
    flags = ["--solutions", str(run), "--n", "1", "--samples", "2", "--max-new-tokens", "4"]
    assert verdicts.main([*flags, "--model", str(tiny_model_dir)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[:2] for line in table[2:]] == [
        ["| yes_no", "4"],
        ["| verdict_tag", "4"],
    ]
