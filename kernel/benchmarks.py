"""Standard math benchmarks as data sets: ``data.path`` or ``eval.path`` = ``benchmark:NAME``.

Each is read with ``datasets`` from its hub dataset and turned into the rows every recipe
reads, ``{"prompt", "label", "source", "id"}`` (the math recipe's format):

| name     | hub dataset (config), split           | prompt   | label                          |
|----------|---------------------------------------|----------|--------------------------------|
| gsm8k    | openai/gsm8k (main), test             | question | the number after ``####``      |
| math500  | HuggingFaceH4/MATH-500, test          | problem  | answer                         |
| aime2024 | math-ai/aime24, test                  | problem  | answer                         |
| aime2025 | math-ai/aime25, test                  | problem  | answer                         |
| amc      | AI-MO/aimo-validation-amc, train      | problem  | answer (``142.0`` -> ``142``)  |

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


@dataclass(frozen=True)
class Benchmark:
    hub: str
    split: str
    prompt: str
    label: str
    config: str | None = None
    parse: Callable[[Any], str] = _number


BENCHMARKS = {
    "gsm8k": Benchmark("openai/gsm8k", "test", "question", "answer", "main", _gsm8k_answer),
    "math500": Benchmark("HuggingFaceH4/MATH-500", "test", "problem", "answer"),
    "aime2024": Benchmark("math-ai/aime24", "test", "problem", "answer"),
    "aime2025": Benchmark("math-ai/aime25", "test", "problem", "answer"),
    "amc": Benchmark("AI-MO/aimo-validation-amc", "train", "problem", "answer"),
}


def is_benchmark(path: str) -> bool:
    return path.startswith(PREFIX)


def load_benchmark(path: str):
    """``benchmark:NAME`` or ``benchmark:NAME=FILE`` -> a ``datasets.Dataset`` of prompt,
    label, source and id (errors name the benchmark, the file, the row and the column)."""
    import datasets

    name, _, file = path.removeprefix(PREFIX).partition("=")
    if name not in BENCHMARKS:
        raise ValueError(f"{path}: unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}")
    b = BENCHMARKS[name]
    if file:
        file = package_file(file)
        ext = os.path.splitext(file)[1].lower()
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
    for column in (b.prompt, b.label):
        if column not in raw.column_names:
            raise ValueError(f"{path}: {where} has no column {column!r} ({raw.column_names})")
    rows = []
    for i, r in enumerate(raw):
        try:
            label = b.parse(r[b.label])
        except ValueError as e:
            raise ValueError(f"{path}: {where} row {i + 1}, column {b.label!r}: {e}") from None
        rows.append({"prompt": r[b.prompt], "label": label, "source": name, "id": f"{name}-{i}"})
    return datasets.Dataset.from_list(rows)
