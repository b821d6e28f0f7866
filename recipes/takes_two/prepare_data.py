"""Write takes_two cases as JSONL rows (see data.py for the format) for the kernel's DataBuffer.

    python -m recipes.takes_two.prepare_data --source synthetic --n 60 --seed 0 \\
        --out recipes/takes_two/data/train.jsonl
    python -m recipes.takes_two.prepare_data --source synthetic --n 128 --seed 1 \\
        --exclude recipes/takes_two/data/train.jsonl --out recipes/takes_two/data/test.jsonl
    python -m recipes.takes_two.prepare_data --source synthetic --complaints shared --n 60 \\
        --seed 0 --out recipes/takes_two/data/train_shared.jsonl   # and test_shared.jsonl alike
    python -m recipes.takes_two.prepare_data --source mtmeddialog \\
        --path MTMedDialog_RL.parquet --out mtmeddialog.jsonl

The converters live in data.py; this file only parses flags, samples and writes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

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
        default="specific",
        help="synthetic: 'specific' (each condition its own opening complaint, which names it "
        "all but) or 'shared' (conditions of a group open alike; only the patient's facts tell "
        "them apart)",
    )
    p.add_argument("--path", default=None, help="mtmeddialog: the input file")
    p.add_argument(
        "--exclude",
        default=None,
        help="a JSONL file whose prompts must not appear (e.g. the train set for a test set)",
    )
    return p


def read_prompts(path: str) -> set[str]:
    """The prompts of a JSONL file written by this tool."""
    with open(path, encoding="utf-8") as f:
        return {json.loads(line)["prompt"] for line in f if line.strip()}


def collect(args: argparse.Namespace) -> list[data.Row]:
    """The rows the flags ask for."""
    if args.n is not None and args.n < 1:
        raise ValueError(f"--n must be >= 1, got {args.n}")
    exclude = read_prompts(args.exclude) if args.exclude else set()
    if args.source == "synthetic":
        n = 60 if args.n is None else args.n
        return data.generate_synthetic(n, args.seed, args.facts_per_case, exclude, args.complaints)
    if not args.path:
        raise ValueError("--path: --source mtmeddialog needs a .parquet/.jsonl/.json file")
    rows = [r for r in data.load_mtmeddialog(args.path) if r["prompt"] not in exclude]
    if args.n is not None and args.n < len(rows):
        rows = random.Random(args.seed).sample(rows, args.n)
    return rows


def write_jsonl(rows: list[data.Row], out: str) -> None:
    """Write ``rows`` to ``out`` atomically (a crash leaves no half-written file)."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, out)


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
