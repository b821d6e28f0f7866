"""scripts/bench_partial.py end to end on takes_two's tiny preset for 2 steps: both arms (waiting
for every group, and over-sampling with carried groups) train as a user runs them (kernel
train --preset tiny), and the printed line and the JSON carry the figures (measured, not
judged)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_partial_three_steps(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_partial.py"), "--recipe", "takes_two"]
    cmd += ["--preset", "tiny", "--steps", "2", "--leftover", "carry", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "partial ÷ full" in proc.stdout
    record = json.loads(out.read_text())
    assert set(record["runs"]) == {"full", "carry"}
    assert record["runs"]["carry"]["flags"] == [
        "--rollout.over_sample",
        "2",
        "--rollout.leftover",
        "carry",
    ]
    for r in record["runs"].values():
        assert r["episodes_per_s"] > 0 and r["step_s"] > 0
        assert [s["rollout/groups"] for s in r["steps"]] == [2.0, 2.0]  # prompts_per_step
    assert record["commit"] and len(record["headline"]) == 1


def test_bench_partial_refuses_a_preset_that_is_not_there():
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_partial.py"), "--recipe", "takes_two"]
    proc = subprocess.run([*cmd, "--preset", "nope"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "no recipes/takes_two/presets/nope.yaml" in proc.stderr
