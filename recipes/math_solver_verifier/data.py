"""Math data for this recipe: the usual sets mapped to the buffer's row format, and problems
generated offline by reasoning-gym.

Every loader returns ``list[dict]`` rows ``{"prompt": str, "label": str, "source": str, ...}``
(extra keys are metadata the buffer can copy with ``DataConfig.metadata_keys``). The prompt is
the bare problem: the recipe's prompts.py adds the instructions (e.g. "put the answer in
\\boxed{}"), so data from different sets looks the same to the model.

Sources (all read through ``datasets``; a hub name needs network or a warm HF cache, and
``path`` may instead point at a local .parquet/.jsonl/.json copy of the same columns):

- DAPO-Math-17k (``BytedTsinghua-SIA/DAPO-Math-17k``): ``prompt`` is a chat list whose user
  message wraps the problem in DAPO's "Answer:" instructions (stripped here);
  ``reward_model.ground_truth`` is the label.
- GSM8K (``openai/gsm8k``, config ``main``): ``question``; the label is the number after
  ``####`` in ``answer``.
- MATH (``EleutherAI/hendrycks_math``, one config per subject): ``problem``; the label is the
  last ``\\boxed{}`` of ``solution``.
- any JSONL/Parquet file with a prompt and a label column.
- reasoning-gym: procedurally generated, fully offline; the default tasks are easy enough for
  a 135M model to get some right (``EASY_TASK_CONFIGS``).
"""

from __future__ import annotations

import ast
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kernel.buffer import DataError, RowError, dedup, is_data_file, open_dataset
from kernel.sandbox import parse_python
from recipes.math_solver_verifier.reward import extract_answer, score

OFFLINE = ", or use the offline source 'reasoning_gym'"
"""What a hub load that failed suggests besides a local file."""

logger = logging.getLogger(__name__)

Row = dict[str, Any]

DAPO_NAME = "BytedTsinghua-SIA/DAPO-Math-17k"
GSM8K_NAME = "openai/gsm8k"
MATH_NAME = "EleutherAI/hendrycks_math"
MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)
# DAPO's user message is this prefix + problem + suffix (verl's "Answer:" format).
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be "
    "of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'

EASY_TASK_CONFIGS: dict[str, dict[str, Any]] = {
    # 2-3 one-digit terms, no division (reasoning-gym's "/" is floor division): answers like
    # "-12" or "6" that a 135M model can sometimes get. allow_parentheses must stay True: with
    # False, reasoning-gym 0.1.25 computes "7 - 5 * 9" left to right and labels it 18, not -38
    # (its parenthesised generator evaluates with Python's precedence, and may add brackets).
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 3,
        "min_digits": 1,
        "max_digits": 1,
        "operators": ("+", "-", "*"),
        "allow_parentheses": True,
        "allow_negation": False,
    },
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
}
"""reasoning-gym config per task used by ``generate_reasoning_gym``; other tasks get
reasoning-gym's defaults"""


def _terms_digits(terms: int, digits: tuple[int, int]) -> dict[str, int]:
    return {
        "min_terms": terms,
        "max_terms": terms,
        "min_digits": digits[0],
        "max_digits": digits[1],
    }


TIERS: dict[str, tuple[str, dict[str, Any]]] = {
    "add2-1d": ("chain_sum", _terms_digits(2, (1, 1))),
    "arith2-1d": (
        "basic_arithmetic",
        EASY_TASK_CONFIGS["basic_arithmetic"] | _terms_digits(2, (1, 1)),
    ),
    "arith3-1d": ("basic_arithmetic", EASY_TASK_CONFIGS["basic_arithmetic"]),
    "ops2-1d": (
        "basic_arithmetic",
        EASY_TASK_CONFIGS["basic_arithmetic"] | _terms_digits(3, (1, 1)),
    ),
    "arith2-12d": (
        "basic_arithmetic",
        EASY_TASK_CONFIGS["basic_arithmetic"] | _terms_digits(2, (1, 2)),
    ),
    "sum2-12d": ("chain_sum", _terms_digits(2, (1, 2))),
    "sum3-2d": ("chain_sum", EASY_TASK_CONFIGS["chain_sum"]),
    "sum2-2d": ("chain_sum", _terms_digits(2, (2, 2))),
    "arith2-2d": (
        "basic_arithmetic",
        EASY_TASK_CONFIGS["basic_arithmetic"] | _terms_digits(2, (2, 2)),
    ),
}
"""Difficulty tiers: name -> (reasoning-gym task, its config). The shipped train/test sets mix
arith3-1d and sum3-2d; ``python -m recipes.math_solver_verifier.tiers`` measures a model on each."""


# ---- row mappers: one real row -> one buffer row ---------------------------------------------


def map_dapo(row: Mapping[str, Any]) -> Row:
    """A DAPO-Math-17k row: the user message without DAPO's instructions, the ground truth."""
    messages = row["prompt"]
    user = [m["content"] for m in messages if m.get("role") == "user"]
    if not user:
        raise RowError("prompt has no user message")
    text = user[-1]
    text = text.removeprefix(DAPO_PREFIX).removesuffix(DAPO_SUFFIX).strip()
    extra = row.get("extra_info") or {}
    return {
        "prompt": text,
        "label": str(row["reward_model"]["ground_truth"]).strip(),
        "source": "dapo",
        "index": str(extra.get("index", "")),
    }


def map_gsm8k(row: Mapping[str, Any]) -> Row:
    """A GSM8K row: the question, and the final number after '####' in the worked answer."""
    answer = row["answer"]
    if "####" not in answer:
        raise RowError("answer has no '####' final answer")
    return {
        "prompt": row["question"].strip(),
        "label": answer.rsplit("####", 1)[1].strip(),
        "source": "gsm8k",
    }


def map_math(row: Mapping[str, Any]) -> Row:
    """A MATH row: the problem, and the last \\boxed{} (or \\fbox{}) of the solution."""
    label = extract_answer(row["solution"], markers=("\\boxed", "\\fbox"))
    if label is None:
        raise RowError("solution has no \\boxed{} answer")
    return {
        "prompt": row["problem"].strip(),
        "label": label,
        "source": "math",
        "level": row.get("level", ""),
        "type": row.get("type", ""),
    }


def file_mapper(input_key: str = "prompt", label_key: str = "label") -> Callable[[Any], Row]:
    """A mapper for a plain file: ``input_key`` -> prompt, ``label_key`` -> label."""

    def map_file(row: Mapping[str, Any]) -> Row:
        prompt, label = row[input_key], row[label_key]
        if not isinstance(prompt, str) or not prompt.strip():
            raise RowError(f"{input_key!r} must be a non-empty string, got {prompt!r:.60}")
        if label is None or not str(label).strip():
            raise RowError(f"{label_key!r} is empty")
        return {"prompt": prompt.strip(), "label": str(label).strip(), "source": "file"}

    return map_file


def map_rows(
    rows: Iterable[Mapping[str, Any]],
    mapper: Callable[[Mapping[str, Any]], Row],
    where: str,
    skip_bad: bool = False,
) -> list[Row]:
    """Apply ``mapper`` to every row; a bad row raises DataError naming ``where`` and its 1-based
    number; with ``skip_bad`` a row the mapper rejects (RowError, e.g. no boxed answer) is dropped
    and counted in one warning instead."""
    out, skipped = [], []
    for i, row in enumerate(rows, start=1):
        try:
            out.append(mapper(row))
        except (RowError, KeyError, TypeError, AttributeError, IndexError) as e:
            if not (skip_bad and isinstance(e, RowError)):  # a missing column always fails
                why = f"missing key {e.args[0]!r}" if isinstance(e, KeyError) else str(e)
                raise DataError(f"{where}: row {i}: {why}") from e
            skipped.append(i)
    if skipped:
        logger.warning(
            "%s: skipped %d row(s) without a usable answer (first: row %d)",
            where,
            len(skipped),
            skipped[0],
        )
    if not out:
        raise DataError(f"{where}: no usable rows")
    return out


# ---- loaders ---------------------------------------------------------------------------------


def load_dapo(path: str = DAPO_NAME, split: str = "train") -> list[Row]:
    """DAPO-Math-17k rows (only a train split exists), de-duplicated: the hub copy repeats each
    of its ~17k problems many times (1.79M rows)."""
    rows = map_rows(open_dataset(path, split, None, OFFLINE), map_dapo, f"{path} [{split}]")
    unique = dedup(rows)
    logger.info("%s: %d rows, %d distinct problems", path, len(rows), len(unique))
    return unique


def load_gsm8k(path: str = GSM8K_NAME, split: str = "train") -> list[Row]:
    """GSM8K rows (splits train and test)."""
    return map_rows(open_dataset(path, split, "main", OFFLINE), map_gsm8k, f"{path} [{split}]")


def load_math(
    path: str = MATH_NAME, split: str = "train", subjects: Sequence[str] = MATH_SUBJECTS
) -> list[Row]:
    """MATH rows of ``subjects`` (splits train and test). The rare solution without a boxed
    answer is skipped, with a warning."""
    if is_data_file(path):
        return map_rows(open_dataset(path, split, None, OFFLINE), map_math, path, skip_bad=True)
    rows = []
    for subject in subjects:
        where = f"{path}/{subject} [{split}]"
        dataset = open_dataset(path, split, subject, OFFLINE)
        rows += map_rows(dataset, map_math, where, skip_bad=True)
    return rows


def load_file(path: str, input_key: str = "prompt", label_key: str = "label") -> list[Row]:
    """Rows of a local .jsonl/.json/.parquet file with a prompt and a label column."""
    if not is_data_file(path):
        raise DataError(f"{path}: expected a .jsonl, .json or .parquet file")
    dataset = open_dataset(path, "train", None, OFFLINE)
    for key in (input_key, label_key):
        if key not in dataset.column_names:
            raise DataError(f"{path}: no column {key!r} (columns: {dataset.column_names})")
    return map_rows(dataset, file_mapper(input_key, label_key), path)


# ---- reasoning-gym ---------------------------------------------------------------------------


def is_gradable(label: str) -> bool:
    """Whether a response that writes exactly ``label`` in ``\\boxed{}`` scores 1.0 against it:
    the answer survives extraction and math-verify accepts it as equal to itself.

    math-verify falls back to exact string comparison for what it cannot parse, so word
    answers pass too; what fails are labels that cannot be boxed (empty, unbalanced braces).
    """
    return score(f"\\boxed{{{label}}}", label) == 1.0


# ---- what makes two problems the same ---------------------------------------------------------

# The arithmetic in a prompt: "Calculate ( -9 - 8 )." or "...problem: 98 + 93 - 77 =".
_ARITHMETIC = re.compile(r"[-+*/()\d\s.]*\d[-+*/()\d\s.]*")
# A prompt is an arithmetic problem when the words around its expression are an instruction
# ("State the final answer to the following arithmetic problem:"), not a word problem.
_MAX_INSTRUCTION_WORDS = 12


def _signed(node: ast.AST) -> tuple[bool, str]:
    """A value-preserving normal form of an arithmetic syntax tree, as ``(negative, form)``:
    the expression equals ``-form`` when ``negative``, else ``form``.

    - Brackets are gone (the tree has none) and a signed literal is one number.
    - A sum is flattened into signed terms, a - b being a + (-b) and -(a + b) being -a + -b,
      and the terms sorted. A sum and its negation are one form with opposite signs (the one
      whose sorted terms read first), so "3 - 5" is -(5 - 3).
    - A product is flattened and its factors sorted; a quotient keeps its order. Both pull
      every minus sign of their factors (of a sum as above) out into one sign, so "8 * -4",
      "-8 * 4", "-(8 * 4)" and "4 * -8" are one form, negative, and "-8 * -4" is "8 * 4".
      "/" is true division, (-a) / b = a / -b = -(a / b) (reasoning-gym's "/" is floor
      division, but it picks divisors that divide exactly).
    - Other operators (power, floor division) keep their operands' signs where they are:
      (-2) ** 2 is not -(2 ** 2).

    Every rewrite is an identity, so two expressions of different values never meet.
    """
    if isinstance(node, ast.Expression):
        return _signed(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return False, repr(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        negative, form = _signed(node.operand)
        return negative != isinstance(node.op, ast.USub), form
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
        terms: list[tuple[bool, str]] = []
        _terms(node, False, terms)
        up = sorted(_text(negative, form) for negative, form in terms)
        down = sorted(_text(not negative, form) for negative, form in terms)
        return up > down, "(+ " + " ".join(min(up, down)) + ")"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        factors: list[str] = []
        negative = _factors(node, factors)
        return negative, "(* " + " ".join(sorted(factors)) + ")"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        (left_negative, left), (right_negative, right) = _signed(node.left), _signed(node.right)
        return left_negative != right_negative, f"(/ {left} {right})"
    if isinstance(node, ast.BinOp):  # power, floor division...: signs stay where they are
        left, right = _text(*_signed(node.left)), _text(*_signed(node.right))
        return False, f"({type(node.op).__name__} {left} {right})"
    raise ValueError(f"not arithmetic: {ast.dump(node)}")


def _text(negative: bool, form: str) -> str:
    return f"-{form}" if negative else form


def _terms(node: ast.AST, negative: bool, out: list[tuple[bool, str]]) -> None:
    """Append the signed terms of a sum (through '-', unary signs and brackets) to ``out``;
    ``negative``: the sum is subtracted."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
        _terms(node.left, negative, out)
        _terms(node.right, negative != isinstance(node.op, ast.Sub), out)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        _terms(node.operand, negative != isinstance(node.op, ast.USub), out)
    else:
        term_negative, form = _signed(node)
        out.append((term_negative != negative, form))


def _factors(node: ast.AST, out: list[str]) -> bool:
    """Append the unsigned factors of a product (through unary signs and brackets) to ``out``;
    return whether they carry an odd number of minus signs."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left, out) != _factors(node.right, out)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        return _factors(node.operand, out) != isinstance(node.op, ast.USub)
    negative, form = _signed(node)
    out.append(form)
    return negative


def canonical_key(row: Mapping[str, Any]) -> str:
    """What makes two problems the same, for keeping held-out sets apart from training sets:
    a bare arithmetic problem's expression in a value-preserving normal form (``_signed``:
    brackets, operand order, "a - b" against "a + -b" and where the minus signs of a product or
    quotient sit do not matter), else (word problems) the prompt with its case and white space
    normalised. tests/recipes/test_data_leaks.py checks every shipped split by it."""
    prompt = str(row["prompt"])
    spans = [m.group(0).strip() for m in _ARITHMETIC.finditer(prompt)]
    expr = max(spans, key=len, default="").rstrip(".").strip()
    words_around = len(prompt.replace(expr, " ").split()) if expr else 0
    if any(op in expr for op in "+-*/") and words_around <= _MAX_INSTRUCTION_WORDS:
        try:
            return "arith:" + _text(*_signed(parse_python(expr, mode="eval")))
        except (SyntaxError, ValueError):
            pass
    return "text:" + " ".join(prompt.lower().split())


def leaked_rows(
    held_out_rows: Iterable[Mapping[str, Any]],
    train_rows: Iterable[Mapping[str, Any]],
    *,
    key: Callable[[Mapping[str, Any]], str] = canonical_key,
) -> list[int]:
    """The 0-based indices of the held-out rows whose problem (by ``key``) is a training
    problem: what a held-out score measured on ``held_out_rows`` partly trained on."""
    trained = {key(r) for r in train_rows}
    return [i for i, r in enumerate(held_out_rows) if key(r) in trained]


def answer_is_an_operand(row: Mapping[str, Any]) -> bool:
    """Whether the answer is one of the numbers the problem states ("0 * -5" is 0, "7 + 0" is
    7): a reply restating the problem then ends in the right number, so such problems measure
    nothing (``generate_reasoning_gym(skip_operand_answers=True)`` leaves them out)."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", str(row["prompt"]))
    label = str(row["label"]).strip()
    return any(n == label or n.lstrip("-") == label for n in numbers)


def generate_reasoning_gym(
    tasks: Sequence[str] = ("basic_arithmetic", "chain_sum"),
    n: int = 256,
    seed: int = 0,
    exclude: Iterable[str] = (),
    task_configs: Mapping[str, Mapping[str, Any]] | None = None,
    skip_operand_answers: bool = False,
) -> list[Row]:
    """``n`` distinct reasoning-gym problems, spread evenly over ``tasks`` and interleaved.

    Rows are ``{"prompt": question, "label": answer, "source": "reasoning_gym", "task": name}``.
    Deterministic in ``seed``. Problems whose ``canonical_key`` is in ``exclude`` (e.g. the
    test set's keys, when making a training set) and repeats by key are skipped, and with
    ``skip_operand_answers`` so are problems whose answer is one of their own numbers
    (``answer_is_an_operand``). Every label is checked with ``is_gradable`` (ValueError if not:
    the task is unsuitable for this reward).
    """
    import reasoning_gym

    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not tasks:
        raise ValueError("tasks: give at least one reasoning-gym task name")
    configs = EASY_TASK_CONFIGS if task_configs is None else task_configs
    seen = set(exclude)
    per_task: list[list[Row]] = []
    for k, task in enumerate(tasks):
        quota = n // len(tasks) + (k < n % len(tasks))
        # Items are generated lazily by index, so a large virtual size costs nothing; it bounds
        # the search for distinct problems when the task's problem space is small.
        size = 50 * quota + 100
        try:
            dataset = reasoning_gym.create_dataset(
                task, size=size, seed=seed, **configs.get(task, {})
            )
        except (ValueError, TypeError, AssertionError) as e:
            raise ValueError(f"tasks: reasoning-gym task {task!r}: {e}") from e
        rows: list[Row] = []
        for idx in range(size):
            if len(rows) == quota:
                break
            item = dataset[idx]
            prompt, label = str(item["question"]).strip(), str(item["answer"]).strip()
            row = {"prompt": prompt, "label": label, "source": "reasoning_gym", "task": task}
            key = canonical_key(row)
            if key in seen or (skip_operand_answers and answer_is_an_operand(row)):
                continue
            if not is_gradable(label):
                raise ValueError(
                    f"tasks: reasoning-gym task {task!r} item {idx}: a response boxing its "
                    f"answer {label!r} would not be graded correct; pick another task"
                )
            seen.add(key)
            rows.append(row)
        if len(rows) < quota:
            raise ValueError(
                f"n: task {task!r} has only {len(rows)} distinct new problems in its first {size}, "
                f"{quota} asked"
            )
        per_task.append(rows)
    # Interleave so any prefix of the file mixes the tasks.
    return [rows[i] for i in range(max(map(len, per_task))) for rows in per_task if i < len(rows)]
