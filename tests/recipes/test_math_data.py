"""Tests for recipes/math_solver_verifier/data.py and prepare_data.py: the row mappers on rows
shaped like the real sets (built in memory with datasets.Dataset.from_list, no network),
reasoning-gym generation, the CLI, and the shipped data files."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from kernel.buffer import DataBuffer, DataConfig, DataError
from recipes.math_solver_verifier import data
from recipes.math_solver_verifier.prepare_data import main
from recipes.math_solver_verifier.reward import is_equivalent, score

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "recipes" / "math_solver_verifier" / "data"

# ---- rows shaped like the real sets ----------------------------------------------------------

GSM8K_ROWS = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as "
        "many clips in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
    },
    {
        "question": "A shop sells 1,250 pens a day. How many in 2 days?",
        "answer": "1,250 * 2 = <<1250*2=2500>>2,500\n#### 2,500",
    },
]

MATH_ROWS = [
    {
        "problem": "Rationalize $\\frac{1}{\\sqrt{2}}$.",
        "level": "Level 2",
        "type": "Algebra",
        "solution": "Multiply by $\\frac{\\sqrt{2}}{\\sqrt{2}}$ to get "
        "$\\boxed{\\frac{\\sqrt{2}}{2}}$.",
    },
    {
        "problem": "What is $1+1$? Not $\\boxed{3}$.",
        "level": "Level 1",
        "type": "Prealgebra",
        "solution": "First guess $\\boxed{3}$, but $1+1=\\boxed{2}$.",  # the last box is the answer
    },
    {
        "problem": "Compute $2^3$.",
        "level": "Level 1",
        "type": "Prealgebra",
        "solution": "$2^3 = 8$, so the answer is $\\fbox{8}$.",
    },
]

DAPO_PROBLEM = (
    "In triangle $ABC$, $\\sin \\angle A = \\frac{4}{5}$. If $AB + AC$ can be expressed in the "
    "form $\\frac{a\\sqrt{b}}{c}$, find $a + b + c$."
)
DAPO_ROWS = [
    {
        "data_source": "math_dapo",
        "prompt": [{"content": data.DAPO_PREFIX + DAPO_PROBLEM + data.DAPO_SUFFIX, "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": "34", "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"},
    },
    {  # the hub copy repeats every problem; load_dapo keeps the first
        "data_source": "math_dapo",
        "prompt": [{"content": data.DAPO_PREFIX + DAPO_PROBLEM + data.DAPO_SUFFIX, "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": "34", "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"},
    },
    {
        "data_source": "math_dapo",
        "prompt": [{"content": "What is $3 \\cdot 4$?", "role": "user"}],  # no DAPO wrapper
        "ability": "MATH",
        "reward_model": {"ground_truth": "12", "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": "b"},
    },
]


def test_gsm8k_label_is_the_number_after_the_hashes():
    rows = data.map_rows(datasets.Dataset.from_list(GSM8K_ROWS), data.map_gsm8k, "gsm8k")
    assert [r["label"] for r in rows] == ["72", "2,500"]
    assert rows[0]["prompt"] == GSM8K_ROWS[0]["question"]
    assert rows[0]["source"] == "gsm8k"
    # the thousands separator is left to math-verify: 1,250 * 2 = 2500
    assert is_equivalent("2500", rows[1]["label"])


def test_gsm8k_row_without_final_answer_names_the_row():
    bad = [GSM8K_ROWS[0], {"question": "q", "answer": "no final answer"}]
    with pytest.raises(DataError, match=r"gsm8k: row 2: answer has no '####'"):
        data.map_rows(datasets.Dataset.from_list(bad), data.map_gsm8k, "gsm8k")
    with pytest.raises(DataError, match=r"gsm8k: row 1: missing key 'answer'"):
        data.map_rows([{"question": "q"}], data.map_gsm8k, "gsm8k")


def test_math_label_is_the_last_box_of_the_solution(caplog):
    rows = [
        *MATH_ROWS,
        {"problem": "p", "level": "Level 1", "type": "Algebra", "solution": "no box here"},
    ]
    with caplog.at_level(logging.WARNING):
        out = data.map_rows(datasets.Dataset.from_list(rows), data.map_math, "math", skip_bad=True)
    assert [r["label"] for r in out] == ["\\frac{\\sqrt{2}}{2}", "2", "8"]
    assert out[0]["level"] == "Level 2" and out[0]["type"] == "Algebra"
    assert "skipped 1 row(s)" in caplog.text and "row 4" in caplog.text


def test_math_from_a_local_parquet_copy(tmp_path):
    path = tmp_path / "algebra.parquet"
    datasets.Dataset.from_list(MATH_ROWS).to_parquet(str(path))
    rows = data.load_math(str(path))
    assert [r["prompt"] for r in rows] == [r["problem"] for r in MATH_ROWS]


def test_dapo_strips_the_instructions_and_deduplicates(tmp_path):
    path = tmp_path / "dapo.parquet"
    datasets.Dataset.from_list(DAPO_ROWS).to_parquet(str(path))
    rows = data.load_dapo(str(path))
    assert rows == [
        {
            "prompt": DAPO_PROBLEM,
            "label": "34",
            "source": "dapo",
            "index": "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079",
        },
        {"prompt": "What is $3 \\cdot 4$?", "label": "12", "source": "dapo", "index": "b"},
    ]


def test_file_source_maps_the_given_keys(tmp_path):
    path = tmp_path / "raw.jsonl"
    path.write_text(
        json.dumps({"question": " What is 2+3? ", "answer": 5})
        + "\n"
        + json.dumps({"question": "What is 2*3?", "answer": 6})
        + "\n"
    )
    rows = data.load_file(str(path), input_key="question", label_key="answer")
    assert rows == [
        {"prompt": "What is 2+3?", "label": "5", "source": "file"},
        {"prompt": "What is 2*3?", "label": "6", "source": "file"},
    ]
    with pytest.raises(DataError, match="no column 'problem'"):
        data.load_file(str(path), input_key="problem", label_key="answer")


def test_file_source_bad_row_names_file_and_row(tmp_path):
    path = tmp_path / "raw.jsonl"
    path.write_text(
        json.dumps({"q": "ok", "a": "1"}) + "\n" + json.dumps({"q": "", "a": "2"}) + "\n"
    )
    with pytest.raises(DataError, match=r"raw.jsonl: row 2: 'q' must be a non-empty string"):
        data.load_file(str(path), input_key="q", label_key="a")


def test_hub_source_offline_gives_a_clear_error():
    # tests/conftest.py sets HF_HUB_OFFLINE=1: the hub is refused at once, never waited on.
    with pytest.raises(DataError, match=r"cannot load 'openai/gsm8k'.*reasoning_gym"):
        data.load_gsm8k()


# ---- reasoning-gym ---------------------------------------------------------------------------


def test_reasoning_gym_rows_are_gradable_and_deterministic():
    rows = data.generate_reasoning_gym(("basic_arithmetic", "chain_sum"), n=21, seed=7)
    assert len(rows) == 21
    # 21 = 11 + 10, interleaved: basic, chain, basic, ...
    assert [r["task"] for r in rows[:4]] == ["basic_arithmetic", "chain_sum"] * 2
    assert sum(r["task"] == "basic_arithmetic" for r in rows) == 11
    assert len({r["prompt"] for r in rows}) == 21
    for r in rows:
        assert r["source"] == "reasoning_gym"
        assert is_equivalent(r["label"], r["label"]), r
        assert score(f"The result is \\boxed{{{r['label']}}}.", r["label"]) == 1.0, r
        wrong = str(int(r["label"]) + 1)  # every easy answer is an integer
        assert not is_equivalent(wrong, r["label"]), r
    assert data.generate_reasoning_gym(("basic_arithmetic", "chain_sum"), n=21, seed=7) == rows
    assert data.generate_reasoning_gym(("basic_arithmetic", "chain_sum"), n=21, seed=8) != rows


def test_reasoning_gym_exclude_and_bad_input():
    first = data.generate_reasoning_gym(("chain_sum",), n=5, seed=0)
    key = data.canonical_key(first[0])
    again = data.generate_reasoning_gym(("chain_sum",), n=5, seed=0, exclude=[key])
    assert key not in {data.canonical_key(r) for r in again}
    assert again[:4] == first[1:]  # the rest of the sequence moves up by one
    # excluded by key: the same problem with other brackets or operand order is gone too
    assert all(data.canonical_key(r) != key for r in again)
    skipped = data.generate_reasoning_gym(
        ("basic_arithmetic",), n=40, seed=0, skip_operand_answers=True
    )
    assert not any(data.answer_is_an_operand(r) for r in skipped)
    assert len({data.canonical_key(r) for r in skipped}) == 40  # no problem twice
    with pytest.raises(ValueError, match="tasks: reasoning-gym task 'no_such_task'"):
        data.generate_reasoning_gym(("no_such_task",), n=2)
    with pytest.raises(ValueError, match="n must be >= 1"):
        data.generate_reasoning_gym(n=0)


def test_is_gradable():
    assert data.is_gradable("-12")
    assert data.is_gradable("\\frac{1}{2}")
    assert not data.is_gradable("")  # an empty box is no answer
    assert not data.is_gradable("{")  # \boxed{{} never closes


# ---- the CLI ---------------------------------------------------------------------------------


def test_cli_help_runs():
    out = subprocess.run(
        [sys.executable, "-m", "recipes.math_solver_verifier.prepare_data", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    for flag in ("--source", "--out", "--n", "--seed", "--tasks", "--split", "--input-key"):
        assert flag in out.stdout


def test_cli_writes_reasoning_gym_rows(tmp_path):
    out = tmp_path / "sub" / "rg.jsonl"
    assert main(["--source", "reasoning_gym", "--n", "6", "--seed", "3", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == data.generate_reasoning_gym(n=6, seed=3)


def test_cli_file_source_samples_n_rows(tmp_path):
    src = tmp_path / "raw.jsonl"
    src.write_text("".join(json.dumps({"q": f"{i} + 1 = ?", "a": i + 1}) + "\n" for i in range(10)))
    out = tmp_path / "out.jsonl"
    args = ["--source", "file", "--path", str(src), "--input-key", "q", "--label-key", "a"]
    assert main([*args, "--n", "4", "--seed", "0", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and len({r["prompt"] for r in rows}) == 4
    for r in rows:  # still the right label for its own prompt after sampling
        assert int(r["prompt"].split(" ")[0]) + 1 == int(r["label"])


def test_cli_bad_flags_exit_2_with_the_reason(tmp_path, capsys):
    out = str(tmp_path / "x.jsonl")
    assert main(["--source", "file", "--out", out]) == 2
    assert "--path" in capsys.readouterr().err
    assert main(["--source", "reasoning_gym", "--n", "0", "--out", out]) == 2
    assert "--n must be >= 1" in capsys.readouterr().err
    assert not Path(out).exists()


# ---- the shipped files -----------------------------------------------------------------------


def _shipped(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()]


def test_shipped_files_regenerate_from_the_documented_commands(tmp_path):
    readme = (DATA / "README.md").read_text()
    commands = re.findall(r"# python -m recipes\.math_solver_verifier\.prepare_data (.+)", readme)
    assert len(commands) == 4  # train, test, and the arith2-12d tier's test and train
    for command in commands:
        args = command.split()
        shipped = Path(args[args.index("--out") + 1]).name
        args[args.index("--out") + 1] = str(tmp_path / shipped)
        args = [str(ROOT / a) if a.startswith("recipes/") else a for a in args]
        assert main(args) == 0
        assert (tmp_path / shipped).read_text() == (DATA / shipped).read_text(), shipped


def test_shipped_files_are_right_and_load_in_the_buffer():
    train, test = _shipped("train.jsonl"), _shipped("test.jsonl")
    assert (len(train), len(test)) == (256, 64)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    for r in train + test:
        # Recompute every answer independently from "Calculate <expr>." / "...: <expr> ="
        expr = re.search(r"(?:Calculate |problem: )(.+?)(?:\.| =)$", r["prompt"]).group(1)
        assert re.fullmatch(r"[-+* ()0-9]+", expr), r
        assert str(eval(expr)) == r["label"], r  # only digits, + - * and brackets: safe
        assert len(r["label"].lstrip("-")) <= 3, r  # short answers for a small model
    buffer = DataBuffer(DataConfig(path=str(DATA / "train.jsonl"), metadata_keys=["task"]))
    assert len(buffer) == 256
    group = buffer.next_groups(1)[0]
    assert group[0].metadata["task"] in ("basic_arithmetic", "chain_sum")


def test_answer_is_an_operand():
    assert data.answer_is_an_operand({"prompt": "Calculate 0 * -5.", "label": "0"})
    assert data.answer_is_an_operand({"prompt": "Calculate -9 + 0.", "label": "-9"})
    assert data.answer_is_an_operand({"prompt": "Calculate 1 * -9.", "label": "-9"})
    assert not data.answer_is_an_operand({"prompt": "Calculate 5 - 3.", "label": "2"})
    assert not data.answer_is_an_operand({"prompt": "Calculate 12 + 3.", "label": "15"})


def test_the_headline_tier_is_far_larger_than_its_training_set():
    """arith2-12d has tens of thousands of distinct problems (by canonical_key): 4000 draws
    are almost all new, so 2048 training problems are a small part of it, and a held-out
    problem is a new problem, not a training one rewritten."""
    task, config = data.TIERS["arith2-12d"]
    rows = data.generate_reasoning_gym((task,), n=4000, seed=10**6, task_configs={task: config})
    train = {data.canonical_key(r) for r in _shipped("arith2-12d_train.jsonl")}
    seen = sum(data.canonical_key(r) in train for r in rows)
    assert seen / len(rows) < 0.1, seen  # a random problem is rarely a training problem
