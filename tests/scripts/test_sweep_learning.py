"""scripts/sweep_learning.py: its runs train with the lr and warm-up of their grid cell, a
finished run is kept on a rerun (an interrupted sweep resumes), the table holds every finished
run of the folder (a grid widened later), and bad flags are refused
before anything trains. The run is math's learn preset cut to one step and two held-out
items."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SWEEP = [sys.executable, "scripts/sweep_learning.py", "--recipe", "math_solver_verifier"]
SHORT = ["--steps", "1", "--", "--eval.max_prompts", "2", "--rollout.max_response_len", "8"]
SHORT += ["--data.n_samples_per_prompt", "2", "--data.prompts_per_step", "1"]


def sweep(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SWEEP, *flags], cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_a_sweep_trains_with_its_grid_and_resumes(tmp_path):
    flags = ["--lr", "3e-5", "--warmup", "2", "--out", str(tmp_path), *SHORT]
    p = sweep(*flags)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    run = tmp_path / "lr3e-05-w2"
    optim = json.loads((run / "seed0" / "config.json").read_text())["optim"]
    assert optim["lr"] == 3e-5 and optim["warmup_steps"] == 2
    rows = json.loads((tmp_path / "sweep.json").read_text())
    assert [(r["run"], r["lr"], r["warmup"], r["steps"]) for r in rows] == [
        ("lr3e-05-w2", 3e-5, 2, 1)
    ]
    assert rows[0]["ci_low"] <= rows[0]["diff"] <= rows[0]["ci_high"]
    assert "| **3e-05** | **2** | **1** |" in p.stdout  # the table, its best row in bold
    assert (tmp_path / "sweep.png").stat().st_size > 0

    # a run of an earlier grid in the same folder (its copy, said to have trained at 1e-5)
    earlier = tmp_path / "lr1e-05-w0"
    shutil.copytree(run, earlier)
    config = json.loads((earlier / "seed0" / "config.json").read_text())
    config["optim"] |= {"lr": 1e-5, "warmup_steps": 0}
    (earlier / "seed0" / "config.json").write_text(json.dumps(config))

    before = (run / "learning.json").stat().st_mtime_ns
    again = sweep(*flags)
    assert again.returncode == 0 and "lr3e-05-w2: done before, kept" in again.stdout
    assert (run / "learning.json").stat().st_mtime_ns == before
    rows = json.loads((tmp_path / "sweep.json").read_text())
    assert [r["run"] for r in rows] == ["lr1e-05-w0", "lr3e-05-w2"]  # every run, by lr


def test_dry_run_prints_one_command_per_grid_cell(tmp_path):
    flags = ["--lr", "1e-5", "2e-5", "--warmup", "0", "5", "--steps", "3", "--dry-run"]
    p = sweep(*flags, "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 4
    assert "--optim.lr 2e-05 --optim.warmup_steps 5" in lines[3]
    assert f"--out {tmp_path}/lr1e-05-w0" in lines[0]
    assert not any(tmp_path.iterdir())  # nothing ran


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--lr", "0", "--steps", "2"], "need lr > 0"),
        (["--lr", "1e-5", "--warmup", "-1", "--steps", "2"], "--warmup -1"),
        (["--lr", "1e-5", "--steps", "0"], "steps >= 1"),
        (["--lr", "1e-5"], "--steps"),
        (["--lr", "1e-5", "--steps", "2", "--", "--optim.lr", "2e-5"], "--optim.lr is what"),
    ],
)
def test_bad_flags_are_refused_by_name(flags, message, tmp_path):
    p = sweep(*flags, "--out", str(tmp_path))
    assert p.returncode != 0 and message in p.stderr
    assert not any(tmp_path.iterdir())


def test_unknown_recipe_is_refused():
    p = subprocess.run(
        [sys.executable, "scripts/sweep_learning.py", "--recipe", "nope", "--lr", "1e-5",
         "--steps", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode != 0 and "--recipe must be one of" in p.stderr
