"""recipes/code_pair/read_replies.py reads a run's held-out replies: main's passes, checks and
statuses as logged, whether its entry point calls the helper's aux (among the passes too), and
whether the helper wrote aux or main's function instead; plain and gzipped evaluation files."""

from __future__ import annotations

from kernel.run.results import SeedRun
from recipes.code_pair import read_replies
from tests.recipes.conftest import write_learning_run

CONFIG = {  # what the run's evaluation reads the held-out problems by (HumanEval rows 0 and 1)
    "data": {"metadata_keys": ["entry_point"]},
    "eval": {"path": "benchmark:humaneval[:2]", "n_samples": 2, "max_prompts": None},
}
FENCE = "```python\n{}\n```<|im_end|>\n"
CLOSE = "def has_close_elements(numbers, threshold):\n    return {}"
SPLIT = "def separate_paren_groups(paren_string):\n    return {}"


def _status(name: str, checks: float) -> dict:
    return {"status_" + name: 1.0, "checks_passed": checks}


EPISODES = [
    {  # one pair passes by calling aux, the other main alone fails
        "row": 0,
        "agent": "main",
        "passed": [True, False],
        "texts": [FENCE.format(CLOSE.format("aux(numbers, threshold)")), FENCE.format("x = (")],
        "metrics": [_status("passed", 1.0), _status("syntax_error", 0.0)],
    },
    {  # passes without aux
        "row": 1,
        "agent": "main",
        "passed": [True, False],
        "texts": [FENCE.format(SPLIT.format("[]")), "I would split the string."],
        "metrics": [_status("passed", 1.0), _status("missing", 0.0)],
    },
    {  # aux written once; main's function written instead once
        "row": 0,
        "agent": "helper",
        "passed": [True, False],
        "texts": [FENCE.format("def aux(a, b):\n    return False"), FENCE.format(CLOSE.format(1))],
        "metrics": [{}, {}],
    },
]


def test_read_counts_passes_aux_calls_and_what_the_helper_wrote(tmp_path):
    seed = SeedRun.read(write_learning_run(tmp_path, CONFIG, EPISODES) / "seed0")
    entry_points = [s.metadata["entry_point"] for s in seed.held_out()]
    assert entry_points == ["has_close_elements", "separate_paren_groups"]
    figures = read_replies.read(seed.last, entry_points)
    main, helper = figures["main"], figures["helper"]
    assert main["n"] == 4 and main["passed"] == 2 / 4 and main["checks"] == 2 / 4
    assert main["calls_aux"] == 1 / 4 and main["of_passes"] == 1 / 2 and main["wrapper"] == 1 / 4
    assert main["status"] == {"passed": 2 / 4, "syntax_error": 1 / 4, "missing": 1 / 4}
    assert main["solved"] == [0, 1]
    assert helper["defines_aux"] == 1 / 2 and helper["writes_entry"] == 1 / 2
    assert helper["opening"] == ("def aux(a, b):", 1)


def test_cli_prints_every_evaluation_of_every_seed(tmp_path, capsys):
    run = write_learning_run(tmp_path, CONFIG, EPISODES)
    read_replies.main([str(run)])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 2 * 2  # header, then (step_0, step_32) x (helper, main)
    main_last = next(line for line in lines if "step_32" in line and " main " in line)
    assert "passed 0.500" in main_last and "calls aux 0.250 (of passes 0.500)" in main_last
    assert "solved rows [0, 1]" in main_last
