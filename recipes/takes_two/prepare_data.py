"""Write takes_two cases as JSONL rows (see data.py for the format) for the kernel's DataBuffer.

The shipped files (the training files on the training conditions only; each held-out file
excludes its training file's cases by ``data.canonical_key`` and marks ``unseen_condition``)::

    python -m recipes.takes_two.prepare_data --source synthetic --conditions train --n 60 \\
        --seed 0 --out recipes/takes_two/data/train.jsonl
    python -m recipes.takes_two.prepare_data --source synthetic --n 128 --seed 1 \\
        --exclude recipes/takes_two/data/train.jsonl --out recipes/takes_two/data/test.jsonl
    python -m recipes.takes_two.prepare_data --source synthetic --complaints shared \\
        --conditions train --n 60 --seed 0 --out recipes/takes_two/data/train_shared.jsonl
    python -m recipes.takes_two.prepare_data --source synthetic --complaints shared --n 128 \\
        --seed 1 --exclude recipes/takes_two/data/train_shared.jsonl \\
        --out recipes/takes_two/data/test_shared.jsonl
    python -m recipes.takes_two.prepare_data --source synthetic --balanced --n 88 --seed 0 \\
        --out recipes/takes_two/data/train_balanced.jsonl
    python -m recipes.takes_two.prepare_data --source synthetic --balanced --n 132 --seed 1 \\
        --exclude recipes/takes_two/data/train_balanced.jsonl \\
        --out recipes/takes_two/data/test_balanced.jsonl
    python -m recipes.takes_two.prepare_data --source mtmeddialog \\
        --path MTMedDialog_RL.parquet --out mtmeddialog.jsonl

The converters live in data.py; this file only parses flags, samples and writes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

from kernel.buffer import write_jsonl
from recipes.takes_two import data

SOURCES = ("synthetic", "mtmeddialog")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m recipes.takes_two.prepare_data",
        description="Write doctor/patient cases as JSONL rows {prompt (chief complaint), label "
        "{diagnosis, recommendation}, facts, self_report, ...} for the DataBuffer "
        "(data.metadata_keys: [facts, self_report]).",
    )
    p.add_argument(
        "--source",
        choices=SOURCES,
        required=True,
        help="synthetic (seeded, offline) or mtmeddialog (DoctorAgent-RL's MTMedDialog "
        ".parquet/.jsonl/.json given with --path)",
    )
    p.add_argument("--out", required=True, help="output .jsonl path (parent folders are made)")
    p.add_argument(
        "--n",
        type=int,
        default=None,
        help="rows: synthetic makes this many (default 60); mtmeddialog samples this many "
        "with --seed (default: all, in order)",
    )
    p.add_argument("--seed", type=int, default=0, help="generation / sampling seed")
    p.add_argument(
        "--facts-per-case", type=int, default=4, help="synthetic: self-report facts per case"
    )
    p.add_argument(
        "--complaints",
        choices=data.COMPLAINTS,
        default=None,
        help="synthetic: 'specific' (each condition its own opening complaint, which names it "
        "all but; the default) or 'shared' (conditions of a group open alike; only the "
        "patient's facts tell them apart; the default with --balanced)",
    )
    p.add_argument(
        "--balanced",
        action="store_true",
        help="synthetic: cases only their facts decide (data.balanced_cases): each condition "
        "equally often (--n a multiple of the conditions' number), the true condition at each "
        "place of the candidates equally often, facts that tell it from the rest of its group",
    )
    p.add_argument(
        "--conditions",
        choices=("all", "train"),
        default="all",
        help="synthetic: 'all' (every condition of data.CONDITIONS, e.g. for a held-out set) "
        "or 'train' (data.TRAIN_CONDITIONS: all but data.HELD_OUT_CONDITIONS, which a held-out "
        "set then has and its training set lacks)",
    )
    p.add_argument("--path", default=None, help="mtmeddialog: the input file")
    p.add_argument(
        "--exclude",
        default=None,
        help="a JSONL file (e.g. the training set, for a held-out set) whose cases must not "
        "recur (same data.canonical_key: condition and set of facts); each written row then "
        "gets unseen_condition (its condition is absent from that file)",
    )
    return p


def read_rows(path: str) -> list[data.Row]:
    """The rows of a JSONL file written by this tool."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def collect(args: argparse.Namespace) -> list[data.Row]:
    """The rows the flags ask for."""
    if args.n is not None and args.n < 1:
        raise ValueError(f"--n must be >= 1, got {args.n}")
    exclude = read_rows(args.exclude) if args.exclude else []
    if args.source == "synthetic":
        n = 60 if args.n is None else args.n
        conditions = data.TRAIN_CONDITIONS if args.conditions == "train" else None
        complaints = args.complaints or ("shared" if args.balanced else "specific")
        return data.generate_synthetic(
            n, args.seed, args.facts_per_case, exclude, complaints, conditions, args.balanced
        )
    if not args.path:
        raise ValueError("--path: --source mtmeddialog needs a .parquet/.jsonl/.json file")
    taken = {data.canonical_key(r) for r in exclude}
    rows = [r for r in data.load_mtmeddialog(args.path) if data.canonical_key(r) not in taken]
    if args.n is not None and args.n < len(rows):
        rows = random.Random(args.seed).sample(rows, args.n)
    return data.mark_unseen(rows, exclude) if exclude else rows


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
