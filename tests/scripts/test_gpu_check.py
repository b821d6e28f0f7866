"""scripts/gpu_check.py runs every check of the GPU path for real; CI runs it on CPU (the same
code with the device set to cpu) so the one command a GPU machine runs cannot rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_on_cpu_passes_every_check_and_prints_the_table():
    cmd = [sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--skip", "sync_bench"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    table = p.stdout[p.stdout.index("| check |") :].splitlines()[2:]
    results = {row.split("|")[1].strip(): row.split("|")[2].strip() for row in table}
    assert results == {
        "torch": "PASS",
        "megatron": "PASS",
        "logprob": "PASS",
        "payload": "PASS",
        "distributed": "PASS",
        "release": "PASS",
        "prefix_cache": "PASS",
        "lora": "PASS",
        "limit": "PASS",
    }


def test_gpu_check_without_cuda_says_so():
    p = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--device", "cuda"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    assert p.returncode == 2 and "no CUDA device here" in p.stdout
