"""Write the recipe's data files: QA rows for the buffer, or a corpus for the retriever.

    python -m recipes.deep_research.prepare_data qa --source search_r1 --n 5000 --out train.jsonl
    python -m recipes.deep_research.prepare_data qa --source hotpotqa --split validation \\
        --out test.jsonl
    python -m recipes.deep_research.prepare_data qa --source file --path raw.parquet \\
        --question-key query --answer-key answers --out mine.jsonl
    python -m recipes.deep_research.prepare_data corpus --path wiki-18.jsonl \\
        --contents-key contents --out corpus.jsonl
    python -m retriever build --corpus corpus.jsonl --out index/

The loaders live in data.py; this file parses flags, samples and writes. The small offline set
shipped in data/ is made by make_data.py instead.
"""

from __future__ import annotations

import argparse
import random
import sys

from kernel.buffer import dedup, write_jsonl
from recipes.deep_research import data


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m recipes.deep_research.prepare_data",
        description="Write QA rows {prompt, label: [answers], source} for the buffer, or "
        "corpus rows {id, title, text} for `python -m retriever build`.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    qa = sub.add_parser("qa", help="a QA set -> JSONL buffer rows")
    qa.add_argument(
        "--source",
        choices=[*data.KNOWN_QA, "file"],
        required=True,
        help="nq, hotpotqa, search_r1 (Hugging Face Hub, or a local copy with --path), or file",
    )
    qa.add_argument("--path", default=None, help="hub name or local .jsonl/.json/.parquet")
    qa.add_argument("--split", default="train", help="hub split")
    qa.add_argument("--question-key", default="question", help="file: the question column")
    qa.add_argument(
        "--answer-key",
        default="answer",
        help="file: the answer column (a string or a list; dots reach into nested columns)",
    )
    qa.add_argument("--n", type=int, default=None, help="sample this many rows (default: all)")
    qa.add_argument("--seed", type=int, default=0, help="sampling seed")
    corpus = sub.add_parser("corpus", help="a wiki-style corpus -> retriever JSONL")
    corpus.add_argument("--path", required=True, help="hub name or local .jsonl/.json/.parquet")
    corpus.add_argument("--split", default="train", help="hub split")
    corpus.add_argument("--id-key", default="id", help="the document id column")
    corpus.add_argument("--title-key", default="title", help="the title column")
    corpus.add_argument("--text-key", default="text", help="the text column")
    corpus.add_argument(
        "--contents-key",
        default=None,
        help="one column holding '\"Title\"\\ntext' (Search-R1's wiki-18); overrides "
        "--title-key/--text-key",
    )
    corpus.add_argument("--n", type=int, default=None, help="keep the first N documents")
    for s in (qa, corpus):
        s.add_argument("--out", required=True, help="output .jsonl (parent folders are made)")
    return p


def collect(args: argparse.Namespace) -> list[data.Row]:
    """The rows the flags ask for."""
    if args.n is not None and args.n < 1:
        raise ValueError(f"--n must be >= 1, got {args.n}")
    if args.command == "corpus":
        docs = data.load_corpus(
            args.path, args.id_key, args.title_key, args.text_key, args.contents_key, args.split
        )
        return docs[: args.n]
    if args.source == "file":
        if not args.path:
            raise ValueError("--path: --source file needs a .jsonl/.json/.parquet file")
        rows = data.load_qa(args.path, args.question_key, args.answer_key, args.split)
    else:
        rows = data.load_known_qa(args.source, args.path, args.split)
    rows = dedup(rows)
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
