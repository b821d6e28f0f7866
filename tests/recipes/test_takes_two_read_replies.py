"""recipes/takes_two/read_replies.py reads a run's held-out replies: correct diagnoses (in
agreement with the logged ones), diagnoses naming one candidate, right or wrong, the chance of
naming one at random, and the doctor's first turns; plain and gzipped evaluation files."""

from __future__ import annotations

import json
from pathlib import Path

from kernel.run.results import SeedRun
from recipes.takes_two import read_replies
from tests.recipes.conftest import write_learning_run

TEST = "recipes/takes_two/data/test_shared.jsonl"  # row 0: migraine, row 1: influenza
CONFIG = {  # the parts of a run's config.json its evaluation reads the held-out cases by
    "data": {"metadata_keys": ["facts", "self_report", "candidates"]},
    "eval": {"path": TEST, "n_samples": 1, "max_prompts": 4},
}


def _episodes() -> list[dict]:
    final = "<|im_end|>\n<|im_start|>assistant\nDiagnosis: {}\nRecommendation: rest<|im_end|>\n"
    asked = "Can you please?<|im_end|>\n<|im_start|>user\nI see zigzag lines." + final
    return [
        {  # names a candidate (gout), the wrong one
            "row": 0,
            "agent": "doctor",
            "texts": [asked.format("Gout")],
            "metrics": [{"diagnosis_correct": 0.0, "facts_revealed": 0.25}],
        },
        {  # right; then a list of two candidates: names none, scores 0
            "row": 1,
            "agent": "doctor",
            "texts": [asked.format("Influenza"), asked.format("influenza, strep throat")],
            "metrics": [
                {"diagnosis_correct": 1.0, "facts_revealed": 0.5},
                {"diagnosis_correct": 0.0, "facts_revealed": 0.0},
            ],
        },
        {"row": 1, "agent": "patient", "texts": ["It came on suddenly."], "metrics": [{}]},
    ]


def _run(tmp_path: Path) -> Path:
    return write_learning_run(tmp_path, CONFIG, _episodes())


def test_read_counts_candidates_named_and_checks_the_logged_diagnoses(tmp_path):
    run = _run(tmp_path)
    rows = [json.loads(line) for line in Path(TEST).read_text().splitlines()]
    assert rows[0]["label"]["diagnosis"] == "migraine" and "gout" in rows[0]["candidates"]
    assert rows[1]["label"]["diagnosis"] == "influenza" and "strep throat" in rows[1]["candidates"]
    cases = read_replies.held_out_cases(SeedRun.read(run / "seed0"))
    assert [c.diagnosis for c in cases] == [r["label"]["diagnosis"] for r in rows[:4]]
    figures = read_replies.read(run / "seed0" / "eval" / "step_32.jsonl.gz", cases)
    assert figures["n"] == 3 and figures["agree"] == 3  # the patient's entry is not counted
    assert figures["correct"] == 1 / 3 and figures["named"] == 2 / 3
    assert figures["correct_if_named"] == 0.5
    assert figures["first_if_named"] == 0.5  # influenza is listed first, gout second
    assert figures["chance"] == 1 / len(rows[0]["candidates"])
    assert figures["facts"] == 0.75 / 3
    assert figures["first_turns"] == {"Can you please?": 3}


def test_main_prints_the_first_and_last_evaluation_of_each_seed(tmp_path, capsys):
    run = _run(tmp_path)
    read_replies.main([str(run)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["run", "seed", "eval", "n", "correct"]
    assert [line.split()[:3] for line in lines[1:]] == [
        ["run", "seed0", "step_0"],
        ["run", "seed0", "step_32"],
    ]
    assert "1 different: 'Can you please?' x3" in lines[1]
