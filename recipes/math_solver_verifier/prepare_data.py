"""Write a JSONL file of math problems in the buffer's row format ({"prompt", "label", ...}).

    python -m recipes.math_solver_verifier.prepare_data --source reasoning_gym --n 256 \\
        --seed 0 --out recipes/math_solver_verifier/data/train.jsonl
    python -m recipes.math_solver_verifier.prepare_data --source gsm8k --split test \\
        --out gsm8k.jsonl
    python -m recipes.math_solver_verifier.prepare_data --source file --path raw.parquet \\
        --input-key question --label-key answer --out mine.jsonl

reasoning_gym works offline; gsm8k, math and dapo read the Hugging Face Hub (or, with --path,
a local copy of the set). The loaders live in data.py; this file only parses flags, samples,
and writes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

from kernel.buffer import write_jsonl
from recipes.math_solver_verifier import data

SOURCES = ("reasoning_gym", "gsm8k", "math", "dapo", "file")
_DEFAULT_PATHS = {"gsm8k": data.GSM8K_NAME, "math": data.MATH_NAME, "dapo": data.DAPO_NAME}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m recipes.math_solver_verifier.prepare_data",
        description="Write math problems as JSONL rows {prompt, label, source, ...} for the "
        "recipe's DataBuffer (DataConfig input_key=prompt, label_key=label).",
    )
    p.add_argument(
        "--source",
        choices=SOURCES,
        required=True,
        help="reasoning_gym (offline, generated), gsm8k, math, dapo (Hugging Face "
        "Hub or --path), or file (a local JSONL/Parquet with --input-key/--label-key)",
    )
    p.add_argument("--out", required=True, help="output .jsonl path (parent folders are made)")
    p.add_argument(
        "--n",
        type=int,
        default=None,
        help="rows to write: reasoning_gym generates this many (default 256); other "
        "sources sample this many with --seed (default: all, in order)",
    )
    p.add_argument("--seed", type=int, default=0, help="generation / sampling seed")
    p.add_argument(
        "--tasks",
        default="basic_arithmetic,chain_sum",
        help="reasoning_gym: comma-separated task names, spread evenly",
    )
    p.add_argument(
        "--tier",
        choices=sorted(data.TIERS),
        default=None,
        help="reasoning_gym: one difficulty tier (a task and its config, see data.TIERS) "
        "instead of --tasks with the easy configs",
    )
    p.add_argument("--split", default="train", help="hub split (gsm8k/math: train|test)")
    p.add_argument(
        "--path",
        default=None,
        help="hub name or local .parquet/.jsonl/.json copy (default: the set's hub "
        "name; required for --source file)",
    )
    p.add_argument(
        "--subjects",
        default=",".join(data.MATH_SUBJECTS),
        help="math: comma-separated subject configs of EleutherAI/hendrycks_math",
    )
    p.add_argument("--input-key", default="prompt", help="file: column holding the problem")
    p.add_argument("--label-key", default="label", help="file: column holding the answer")
    p.add_argument(
        "--exclude",
        default=None,
        help="a JSONL file whose problems must not appear, compared by data.canonical_key "
        "(brackets, operand order and signs do not make a new problem): e.g. the held-out "
        "set when writing a training set",
    )
    p.add_argument(
        "--skip-operand-answers",
        action="store_true",
        help="reasoning_gym: leave out problems whose answer is one of their own numbers "
        "('0 * -5', '7 + 0'), which a reply restating the problem gets right",
    )
    return p


def _split_names(text: str, flag: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError(f"{flag}: give at least one name")
    return names


def read_keys(path: str) -> set[str]:
    """The ``canonical_key`` of every problem in a JSONL file written by this tool."""
    with open(path, encoding="utf-8") as f:
        return {data.canonical_key(json.loads(line)) for line in f if line.strip()}


def collect(args: argparse.Namespace) -> list[data.Row]:
    """The rows the flags ask for."""
    if args.n is not None and args.n < 1:
        raise ValueError(f"--n must be >= 1, got {args.n}")
    exclude = read_keys(args.exclude) if args.exclude else set()
    if args.source == "reasoning_gym":
        tasks, configs = _split_names(args.tasks, "--tasks"), None
        if args.tier is not None:
            task, config = data.TIERS[args.tier]
            tasks, configs = [task], {task: config}
        rows = data.generate_reasoning_gym(
            tasks=tasks,
            n=256 if args.n is None else args.n,
            seed=args.seed,
            exclude=exclude,
            task_configs=configs,
            skip_operand_answers=args.skip_operand_answers,
        )
        return [r | {"tier": args.tier} for r in rows] if args.tier else rows
    path = args.path or _DEFAULT_PATHS.get(args.source)
    if path is None:
        raise ValueError("--path: --source file needs a .jsonl/.json/.parquet file")
    if args.source == "gsm8k":
        rows = data.load_gsm8k(path, args.split)
    elif args.source == "math":
        rows = data.load_math(path, args.split, _split_names(args.subjects, "--subjects"))
    elif args.source == "dapo":
        rows = data.load_dapo(path, args.split)
    else:
        rows = data.load_file(path, args.input_key, args.label_key)
    rows = [r for r in rows if data.canonical_key(r) not in exclude]
    if args.n is not None and args.n < len(rows):
        rows = random.Random(args.seed).sample(rows, args.n)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rows = collect(args)
    except ValueError as e:  # includes DataError: bad flags or unusable data, said plainly
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_jsonl(rows, args.out)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
