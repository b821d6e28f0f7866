"""scripts/controls.py: the no-skill controls a skill figure stands beside, and the majority
vote of one agent's sampled answers -- goldens on small rows, the published runs' controls
recomputed from their own files, and the command line's table of a shipped case set (takes_two's
balanced files: every no-skill control 1/k, the facts oracle 1.0)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from scripts import controls  # noqa: E402

TAKES_TWO = ROOT / "recipes" / "takes_two" / "data"


def _math(prompt: str, label: str, task: str = "basic_arithmetic") -> dict:
    return {"prompt": prompt, "label": label, "task": task}


def test_most_common_answer_takes_the_groups_answer_and_splits_ties():
    how = controls.GUESSING["math_solver_verifier"]
    train = [_math("a", "3"), _math("b", "3"), _math("c", "4"), _math("d", "7", "chain_sum")]
    train += [_math("e", "8", "chain_sum")]
    held = [_math("x", "3"), _math("y", "4"), _math("z", "7", "chain_sum"), _math("w", "5", "x")]
    scores = controls.most_common_answer(held, train, how)
    # basic: "3" (2 of 3) -> right for x only; chain_sum: a tie of 7 and 8 -> half right for z;
    # an unknown group falls back to the overall most common ("3"): wrong for w
    assert scores == {0: 1.0, 1: 0.0, 2: 0.5, 3: 0.0}


def test_takes_two_candidate_controls():
    how = controls.GUESSING["takes_two"]
    case = {"label": {"diagnosis": "gout"}, "candidates": ["migraine", "gout", "flu", "cold"]}
    first = {"label": {"diagnosis": "flu"}, "candidates": ["flu", "cold"]}
    absent = {"label": {"diagnosis": "flu"}, "candidates": ["cold", "gout"]}
    got = controls.candidate_controls([case, first, absent], how)
    assert got["chance among candidates"] == {0: 0.25, 1: 0.5, 2: 0.0}
    assert got["first candidate"] == {0: 0.0, 1: 1.0, 2: 0.0}
    # the group is the complaint: the set of candidates, whatever their order
    assert how.group(case) == how.group({**case, "candidates": case["candidates"][::-1]})


def test_deep_research_question_form_blanks_the_names():
    form = controls.question_form
    assert form({"prompt": "In which town was Dorbek Garul born?"}) == "In which town was * * born?"
    assert form({"prompt": "Who founded Wexgar & Sons?"}) == "Who founded * & *?"
    how = controls.GUESSING["deep_research"]
    assert how.right("nyquoholm", {"label": ["Nyquoholm", "Nyquo"]})
    assert not how.right("nyquo holm", {"label": ["Nyquoholm"]})


def _eval_file(tmp_path: Path, lines: list[dict]) -> Path:
    path = tmp_path / "eval.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    return path


def test_vote_takes_the_plurality_answer_and_splits_a_tie(tmp_path):
    def line(row, answers, passed, rewards=None):
        texts = [
            f"<search>q</search><|im_end|>\n<|im_start|>assistant\n<answer>{a}</answer>"
            if a is not None
            else "<search>q</search>"
            for a in answers
        ]
        rewards = rewards or [0.0] * len(answers)
        return {"row": row, "agent": "agent", "texts": texts, "passed": passed, "rewards": rewards}

    path = _eval_file(
        tmp_path,
        [
            line(0, ["Oslo", "oslo.", "Rome"], [True, True, False]),  # plurality right
            line(1, ["Rome", "Rome", "Oslo"], [False, False, True]),  # one right, outvoted
            line(2, ["Oslo", "Rome", None], [True, False, False]),  # a tie: half right
            line(3, [None, None, None], [False, False, False]),  # nobody answered
            line(4, ["Oslo", "Rome", "Rome"], [True, False, False], [1.0, None, None]),  # masked
            {"row": 0, "agent": "searcher", "texts": ["x"], "passed": [False], "rewards": [0.0]},
        ],
    )
    scores = controls.vote_scores(path, "agent", controls.ANSWERS["deep_research"])
    assert scores == {0: 1.0, 1: 0.0, 2: 0.5, 3: 0.0, 4: 1.0}


def test_offered_reads_the_episodes_share_of_right_candidates(tmp_path):
    path = _eval_file(
        tmp_path,
        [
            {"row": 0, "agent": "selector", "metrics": [{"rewrite_accuracy": 0.5}, {}]},
            {
                "row": 1,
                "agent": "selector",
                "metrics": [{"rewrite_accuracy": 0.0}, {"rewrite_accuracy": 1.0}],
            },
            {"row": 0, "agent": "solver", "metrics": [{"rewrite_accuracy": 1.0}]},
        ],
    )
    lines = controls.read_jsonl(path)
    assert controls.offered([lines], "selector", "rewrite_accuracy") == [{0: 0.5, 1: 0.5}]


@pytest.mark.parametrize("name", ["takes_two", "math_solver", "deep_research", "debate"])
def test_published_runs_report_their_controls(name):
    """A published report carries each control of its recipe, computed from its files; the
    best control is the one with the highest score."""
    report = json.loads((ROOT / "docs" / "results" / name / "learning.json").read_text())
    assert report["controls"], name
    best = report["above_control"]
    assert best["before"] == max(c["before"] for c in report["controls"].values())
    assert best["after"] == pytest.approx(report["after"], abs=0.02)  # masked items aside


def _takes_two(name: str) -> list[dict]:
    return controls.read_jsonl(TAKES_TWO / name)


def test_takes_two_balanced_controls_are_one_in_k_and_the_facts_oracle_is_right_every_time():
    train, test = _takes_two("train_balanced.jsonl"), _takes_two("test_balanced.jsonl")
    figures = controls.case_set_controls(test, train, "takes_two")
    one_in_k = sum(1 / len(r["candidates"]) for r in test) / len(test)
    assert figures["1/k"] == pytest.approx(one_in_k) == pytest.approx((96 / 4 + 36 / 3) / 132)
    for name in ("chance among candidates", "first candidate", "most common answer"):
        assert abs(figures[name] - one_in_k) <= 0.02, name
    assert figures["facts oracle"] == 1.0
    # the published shared-complaint files: the first candidate and the most common training
    # condition score above 1/k (the reviewer's 0.281)
    shared = controls.case_set_controls(
        _takes_two("test_shared.jsonl"), _takes_two("train_shared.jsonl")
    )
    assert shared["first candidate"] == pytest.approx(36 / 128)
    assert shared["most common answer"] > shared["1/k"] + 0.005
    # without its facts the oracle is a random pick
    blind = [{**r, "facts": []} for r in test]
    assert controls.case_set_controls(blind, train)["facts oracle"] == pytest.approx(one_in_k)
    # rows without candidates and facts (math's): only the most common answer
    math = [_math("x", "3"), _math("y", "4")]
    assert controls.case_set_controls(math, [_math("a", "3")], "math_solver_verifier") == {
        "most common answer": 0.5
    }


TABLE = ["1/k", "chance among candidates", "first candidate", "most common answer"]


def test_command_line_prints_the_balanced_files_controls(capsys):
    controls.main(
        [
            "--held-out",
            str(TAKES_TWO / "test_balanced.jsonl"),
            "--train",
            str(TAKES_TWO / "train_balanced.jsonl"),
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert "132 cases" in out[0] and "88 cases" in out[0]
    assert [line.rsplit(maxsplit=1)[0].strip() for line in out[1:]] == [*TABLE, "facts oracle"]
    assert [line.split()[-1] for line in out[1:]] == ["0.273"] * 4 + ["1.000"]


def test_command_line_runs_as_a_file_and_explains_itself(tmp_path):
    """``python scripts/controls.py`` from another folder (the script puts the repository on
    its path): --help, the table, and a refusal naming --recipe for rows it cannot place."""
    script = str(ROOT / "scripts" / "controls.py")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, script, *args], cwd=tmp_path, capture_output=True, text=True
        )

    help_text = run("--help")
    assert help_text.returncode == 0
    assert "--held-out" in help_text.stdout and "--recipe" in help_text.stdout
    held, train = str(TAKES_TWO / "test_balanced.jsonl"), str(TAKES_TWO / "train_balanced.jsonl")
    table = run("--held-out", held, "--train", train)
    assert table.returncode == 0, table.stderr
    assert [line.split()[-1] for line in table.stdout.splitlines()[1:]] == ["0.273"] * 4 + ["1.000"]
    rows = tmp_path / "math.jsonl"
    rows.write_text(json.dumps(_math("x", "3")) + "\n")
    refused = run("--held-out", str(rows), "--train", str(rows))
    assert refused.returncode != 0 and "--recipe" in refused.stderr
    named = run("--held-out", str(rows), "--train", str(rows), "--recipe", "math_solver_verifier")
    assert named.returncode == 0, named.stderr
    assert named.stdout.splitlines()[1].split() == ["most", "common", "answer", "1.000"]
