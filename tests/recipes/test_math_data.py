"""Tests for recipes/math_solver_verifier/data.py and prepare_data.py: the row mappers on rows
shaped like the real sets (built in memory with datasets.Dataset.from_list, no network),
reasoning-gym generation, the CLI, and the shipped data files."""

from __future__ import annotations

import ast
import json
import logging
import operator
import random
import re
import subprocess
import sys
from fractions import Fraction
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


# ---- what makes two problems the same --------------------------------------------------------


WORD_PROBLEM = "Janet has 3 apples and buys 2 - 1 more at the market on a sunny day. How many now?"


def _key(expr: str) -> str:
    return data.canonical_key({"prompt": f"Calculate {expr}."})


def _value(node: ast.AST) -> Fraction:
    """An expression's exact value (true division), to check that one key means one value."""
    if isinstance(node, ast.Expression):
        return _value(node.body)
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp):
        return -_value(node.operand) if isinstance(node.op, ast.USub) else _value(node.operand)
    ops = {
        ast.Add: operator.add,
        ast.Sub: operator.sub,
        ast.Mult: operator.mul,
        ast.Div: operator.truediv,
    }
    return ops[type(node.op)](_value(node.left), _value(node.right))


@pytest.mark.parametrize(
    ("prompt", "key"),
    [
        ("Calculate 2 - 1.", "arith:(+ -1 2)"),
        ("Calculate 3 - 5.", "arith:-(+ -3 5)"),  # -(5 - 3): a sum's sign comes out too
        ("Calculate 8 * -4.", "arith:-(* 4 8)"),
        ("Calculate -8 * -4.", "arith:(* 4 8)"),
        ("Calculate ( -9 * 2 ) + 7.", "arith:-(+ (* 2 9) -7)"),  # -(18 - 7)
        ("Calculate 2 * -3 * 4.", "arith:-(* 2 3 4)"),
        ("Calculate ( 2 - 1 ) * -3.", "arith:-(* (+ -1 2) 3)"),
        ("Calculate -8 / 4.", "arith:-(/ 8 4)"),
        ("Calculate (-2) ** 2.", "arith:(Pow -2 2)"),  # not -(2 ** 2): signs stay in a power
        ("Calculate -2 ** 2.", "arith:-(Pow 2 2)"),
        (
            "State the final answer to the following arithmetic problem: 98 + 93 - 77 =",
            "arith:(+ -77 93 98)",
        ),
        (WORD_PROBLEM, "text:" + WORD_PROBLEM.lower()),  # its text, not its arithmetic
    ],
)
def test_canonical_key_golden_values(prompt, key):
    assert data.canonical_key({"prompt": prompt}) == key


@pytest.mark.parametrize(
    "same",
    [
        # brackets, operand order, a - b against a + -b (unchanged)
        ["( 2 + -1 )", "-1 + 2", "2 - 1", "((2 - 1))", "+2 - +1"],
        # where a product's minus signs sit: the reviewer's case first
        ["8 * -4", "4 * -8", "-8 * 4", "-4 * 8", "-(8 * 4)", "( -( 4 * 8 ) )", "-(-(-8 * 4))"],
        ["-8 * -4", "8 * 4", "-(-8 * 4)", "4 * 8", "-(4 * -8)"],  # signs that cancel
        # chains and nesting: one overall sign for the whole product
        ["2 * -3 * 4", "-2 * 3 * 4", "2 * 3 * -4", "(2 * -3) * 4", "2 * (-3 * 4)", "-(2*3*4)"],
        ["2 * -3 * -4", "-2 * -3 * 4", "(-2 * 3) * (-4)", "2 * 3 * 4"],
        # quotients: (-a) / b = a / -b = -(a / b)
        ["-8 / 4", "8 / -4", "-(8 / 4)", "(-8) / (4)", "-(-8 / -4)"],
        ["-8 / -4", "8 / 4"],
        ["-12 / 3 * 2", "2 * (12 / -3)", "-(12 / 3) * 2", "12 / 3 * -2"],
        # a bracketed sum as a factor: its sign comes out too
        ["( 2 - 1 ) * -3", "( 1 - 2 ) * 3", "-(3 * (2 - 1))", "3 * -( 2 - 1 )"],
        ["8 / ( 3 - 5 )", "-8 / ( 5 - 3 )", "8 / -(5 - 3)"],
        # unary minus on a bracketed sum: distributed over its terms
        ["-( 3 - 5 )", "5 - 3", "-3 + 5", "-(-5 + 3)"],
        ["5 - ( 3 + 2 )", "5 - 3 - 2", "-2 + (5 - 3)", "-(3 + 2 - 5)"],
        ["( 2 * -7 ) + 7", "7 - 2 * 7", "7 + -(7 * 2)", "-(7 * 2 - 7)"],
    ],
)
def test_canonical_key_sees_through_brackets_order_and_signs(same):
    assert len({_key(e) for e in same}) == 1, {e: _key(e) for e in same}
    assert len({_value(ast.parse(e, mode="eval")) for e in same}) == 1  # and they are equal


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("5 - 3", "3 - 5"),  # -2 against 2
        ("8 / 4", "4 / 8"),
        ("-8 * 4", "8 * 4"),  # a minus sign more is another value, wherever it sits
        ("2 * -3 * 4", "2 * 3 * 4"),
        ("-8 / 4", "8 / 4"),
        ("( 2 * 7 ) + -7", "2 * ( 7 + -7 )"),  # structure: no distributing
        ("-( 2 * 7 ) + 7", "-( 2 * 7 + 7 )"),
        ("( 2 - 1 ) * -3", "( 2 - 1 ) * 3"),
        ("(-2) ** 2", "-2 ** 2"),
        ("7 // -2", "-(7 // 2)"),  # floor division: -4 against -3
    ],
)
def test_canonical_key_keeps_different_problems_apart(a, b):
    assert _key(a) != _key(b)


def test_one_key_is_one_value_over_random_expressions():
    """Every rewrite is an identity: over many random expressions of few small numbers (so
    that keys often meet), all expressions sharing a key have the same value."""
    rng = random.Random(0)

    def expr(depth: int) -> str:
        if depth == 0 or rng.random() < 0.3:
            return rng.choice(["", "-"]) + str(rng.randint(1, 3))
        text = f"{expr(depth - 1)} {rng.choice('+-*/')} {expr(depth - 1)}"
        return rng.choice(["", "-"]) + f"( {text} )" if rng.random() < 0.5 else text

    values: dict[str, set[Fraction]] = {}
    texts = set()
    for _ in range(4000):
        e = expr(3)
        try:
            value = _value(ast.parse(e, mode="eval"))
        except ZeroDivisionError:
            continue
        values.setdefault(_key(e), set()).add(value)
        texts.add(e)
    assert all(len(v) == 1 for v in values.values()), [k for k, v in values.items() if len(v) > 1]
    assert len(values) < len(texts) - 100  # keys do meet: the check above is not vacuous


def test_leaked_rows_are_the_held_out_rows_whose_problem_is_trained():
    train = [{"prompt": "Calculate 4 * -8."}, {"prompt": "Calculate 5 - 3."}]
    held = [
        {"prompt": "Calculate 8 * -4."},  # 0: trained, signs moved
        {"prompt": "Calculate 3 - 5."},  # 1: another value
        {"prompt": "Calculate ( 5 - 3 )."},  # 2: trained, brackets
        {"prompt": "Calculate 8 * 4."},  # 3: another value
    ]
    assert data.leaked_rows(held, train) == [0, 2]
    assert data.leaked_rows(held, []) == []
    by_text = data.leaked_rows(held, train, key=lambda r: r["prompt"])
    assert by_text == []  # the key decides what is the same problem


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


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _shipped(name: str) -> list[dict]:
    return _read(DATA / name)


# Rows of each shipped file that today's canonical_key counts as a repeat or as a problem of the
# --exclude file: the arith2-12d files were written before the key saw through the minus signs
# of a product ("8 * -4", "4 * -8"), and stay as they are (published results were measured on
# them; tests/recipes/test_data_leaks.py pins their leaks).
SEEN_BY_TODAYS_KEY = {"arith2-12d_test.jsonl": 3, "arith2-12d_train.jsonl": 69}


def test_shipped_files_regenerate_from_the_documented_commands(tmp_path):
    """Each documented command writes its shipped file again: exactly, or for a file written
    before the sign rule, its rows less those the generator now skips (then new rows)."""
    readme = (DATA / "README.md").read_text()
    commands = re.findall(r"# python -m recipes\.math_solver_verifier\.prepare_data (.+)", readme)
    assert len(commands) == 4  # train, test, and the arith2-12d tier's test and train
    for command in commands:
        args = command.split()
        shipped = Path(args[args.index("--out") + 1]).name
        args[args.index("--out") + 1] = str(tmp_path / shipped)
        args = [str(ROOT / a) if a.startswith("recipes/") else a for a in args]
        assert main(args) == 0
        written = (tmp_path / shipped).read_text().splitlines()
        excluded = _read(Path(args[args.index("--exclude") + 1])) if "--exclude" in args else []
        seen, kept = {data.canonical_key(r) for r in excluded}, []
        for line in (DATA / shipped).read_text().splitlines():
            key = data.canonical_key(json.loads(line))
            if key not in seen:
                kept.append(line)
            seen.add(key)
        assert len(written) - len(kept) == SEEN_BY_TODAYS_KEY.get(shipped, 0), shipped
        assert written[: len(kept)] == kept, shipped
        assert data.leaked_rows(_read(tmp_path / shipped), excluded) == [], shipped


def test_a_freshly_made_split_has_no_sign_moved_leak(tmp_path):
    """prepare_data makes the held-out set, then a training set that excludes its problems by
    canonical_key: no held-out problem is trained, signs moved or not. The seeds are the
    shipped arith2-12d files', whose training file (made before the key saw signs) holds
    sign-moved copies of these held-out problems."""
    test, train = tmp_path / "test.jsonl", tmp_path / "train.jsonl"
    common = ["--source", "reasoning_gym", "--tier", "arith2-12d", "--skip-operand-answers"]
    assert main([*common, "--n", "64", "--seed", "1", "--out", str(test)]) == 0
    assert (
        main([*common, "--n", "256", "--seed", "0", "--exclude", str(test), "--out", str(train)])
        == 0
    )
    held, trained = _read(test), _read(train)
    assert data.leaked_rows(held, trained) == []
    for rows in (held, trained):
        assert len({data.canonical_key(r) for r in rows}) == len(rows)  # no problem twice
    old = _shipped("arith2-12d_train.jsonl")[:256]  # the same seed, written by the old key
    assert data.leaked_rows(held, old)  # e.g. "8 * -4" held out, "4 * -8" trained
    assert not {r["prompt"] for r in held} & {r["prompt"] for r in old}  # and none by text


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
