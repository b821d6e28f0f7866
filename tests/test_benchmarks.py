"""Standard math benchmarks as data (``benchmark:NAME``), on small fixtures in each hub
dataset's own columns (no hub here): the rows every recipe reads, labels parsed as the
benchmark writes them, and errors that name the benchmark, file, row and column."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel.benchmarks import BENCHMARKS, load_benchmark
from kernel.buffer import DataBuffer, DataConfig, DataError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "benchmarks"


@pytest.mark.parametrize(
    "name, labels",
    [
        ("gsm8k", ["7", "1236", "30"]),  # after '####', thousands separators dropped
        ("math500", ["32", "\\frac{3}{4}"]),
        ("aime2024", ["1", "30"]),
        ("aime2025", ["53", "10"]),
        ("amc", ["136", "1.4142"]),  # 136.0 -> 136
    ],
)
def test_each_benchmark_becomes_prompt_and_label_rows(name, labels):
    rows = load_benchmark(f"benchmark:{name}={FIXTURES / name}.jsonl").to_list()
    assert [r["label"] for r in rows] == labels
    raw = [json.loads(x) for x in (FIXTURES / f"{name}.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == [x[BENCHMARKS[name].prompt] for x in raw]
    assert all(r["source"] == name and r["id"] == f"{name}-{i}" for i, r in enumerate(rows))


def test_a_benchmark_feeds_the_data_buffer():
    path = f"benchmark:math500={FIXTURES / 'math500.jsonl'}"
    buf = DataBuffer(DataConfig(path=path, shuffle=False))
    group = buf.next_groups(1)[0]
    assert group[0].prompt == "What is $2^5$?" and group[0].label == "32"
    assert group[0].metadata["row"] == 0


def test_errors_name_benchmark_file_row_and_column(tmp_path):
    with pytest.raises(DataError, match=r"unknown benchmark 'gsm9k'.*gsm8k"):
        DataBuffer(DataConfig(path="benchmark:gsm9k"))
    bad = tmp_path / "g.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q", "answer": "2"}\n')
    with pytest.raises(DataError, match=r"g\.jsonl row 2, column 'answer': no '####'"):
        DataBuffer(DataConfig(path=f"benchmark:gsm8k={bad}"))
    wrong = tmp_path / "m.jsonl"
    wrong.write_text('{"question": "q", "answer": "1"}\n')
    with pytest.raises(DataError, match="has no column 'problem'"):
        DataBuffer(DataConfig(path=f"benchmark:math500={wrong}"))
    with pytest.raises(DataError, match="must be an existing"):
        DataBuffer(DataConfig(path=f"benchmark:amc={tmp_path / 'none.jsonl'}"))


def test_without_a_hub_the_error_names_the_dataset_and_the_way_out():
    code = (
        "from kernel.buffer import DataBuffer, DataConfig\n"
        "DataBuffer(DataConfig(path='benchmark:aime2025'))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode != 0
    assert "math-ai/aime25" in r.stderr and "benchmark:aime2025=FILE" in r.stderr
