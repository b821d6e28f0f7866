"""scripts/bench_algorithms.py: every row of the algorithms table is a command the kernel
accepts, its figures are the first and last steps' means of the run's own metrics, a real toy
run goes through it, and scripts/results_table.py writes the table from what it published."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernel.cli import train_config
from tests.scripts.test_results_table import module

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    return module("bench_algorithms")


def test_every_row_is_a_config_the_kernel_accepts(bench):
    for row in bench.ROWS:
        flags = ["--num_steps", str(row.steps), *row.flags]
        cfg = train_config(["--preset", row.preset, *flags])
        assert cfg.num_steps == row.steps, row.name
        if "--advantage.estimator" in row.flags:
            estimator = row.flags[row.flags.index("--advantage.estimator") + 1]
            assert cfg.advantage.estimator == estimator, row.name
    assert len({r.name for r in bench.ROWS}) == len(bench.ROWS)


def _rows(steps: int, agents: tuple[str, ...], single: bool) -> list[dict]:
    """Metrics rows whose reward is the step number (agent k: + k), the length 10 - step / 10."""
    rows = [{"step": -1, "time/startup_s": 1.0}]
    for step in range(steps):
        row = {"step": step}
        for k, a in enumerate(agents):
            row |= {f"{a}/reward": step + k, f"{a}/response_length": 10 - step / 10}
            row["train/clipfrac" if single else f"train/{a}/clipfrac"] = step / 100 + k
        row["eval/doctor/reward"] = 99.0  # not an agent's training reward
        rows.append(row)
    return rows


def test_figures_are_the_first_and_last_five_steps(bench):
    row = bench.Row("x", "toy_duo", steps=12, length=True, clipfrac=True)
    rows = _rows(12, ("doctor", "patient"), single=False)
    got = bench.figures(row, [r for r in rows if r["step"] >= 0])
    assert got["reward"] == {"doctor": (2.0, 9.0), "patient": (3.0, 10.0)}
    assert got["length"]["doctor"] == pytest.approx((9.8, 9.1))
    assert got["clipfrac_max"] == {"doctor": 0.11, "patient": 1.11}
    single = bench.figures(row, [r for r in _rows(12, ("default",), True) if r["step"] >= 0])
    assert single["clipfrac_max"] == {"default": 0.11}
    with pytest.raises(ValueError, match="default/reward: 6 steps"):
        bench.figures(row, [r for r in _rows(6, ("default",), True) if r["step"] >= 0])


def test_read_metrics_keeps_the_last_row_of_a_repeated_step(bench, tmp_path):
    path = tmp_path / "metrics.jsonl.gz"
    rows = [{"step": -1}, {"step": 0, "a/reward": 1}, {"step": 0, "a/reward": 2}, {"step": 1}]
    with gzip.open(path, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    assert bench.read_metrics(path) == [{"step": 0, "a/reward": 2}, {"step": 1}]


def test_a_toy_row_runs_and_its_published_table_renders(bench, tmp_path, monkeypatch):
    """Two seeds of GRPO on the toy for 10 steps, through the script as a user runs it; then
    the same figures published into a scratch results folder and rendered as the table."""
    out = tmp_path / "runs"
    cmd = [sys.executable, "scripts/bench_algorithms.py", "--only", "grpo", "--steps", "10"]
    cmd += ["--seeds", "2", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "grpo" in proc.stdout.splitlines()[-1]
    row = bench.Row("grpo", "toy", steps=10)
    per_seed = []
    for seed in (0, 1):
        metrics = bench.read_metrics(out / "grpo" / f"seed{seed}" / "metrics.jsonl")
        assert len(metrics) == 10 and all(0 <= m["default/reward"] <= 1 for m in metrics)
        per_seed.append(bench.figures(row, metrics))
    assert per_seed[0] != per_seed[1]  # the seeds differ
    record = bench.summarize(row, per_seed, [0, 1], ["abc", "abc"])
    assert record["commits"] == ["abc"]
    assert record["command"] == "--preset toy --num_steps 10"
    last = [s["reward"]["default"][1] for s in per_seed]
    assert record["reward"]["default"]["last"] == pytest.approx(sum(last) / 2)

    # again: the finished runs are kept, not retrained
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout.count("finished before") == 2

    results = tmp_path / "results"
    monkeypatch.setattr(bench, "PUBLISHED", results / "algorithms")
    path = bench.publish([record], out)
    assert (results / "algorithms" / "grpo" / "seed1" / "metrics.jsonl.gz").exists()
    table = module("results_table")
    monkeypatch.setattr(table, "RESULTS", results)
    text = table.render("<!-- results:algorithms -->\n<!-- /results -->\n", Path("docs/x.md"))
    first, last_mean = (record["reward"]["default"][k] for k in ("first", "last"))
    assert f"| grpo | `--preset toy --num_steps 10` | 2 | {first:.2f} → {last_mean:.2f} |" in text
    assert json.loads(path.read_text())["commit"] == "abc" and "`abc`" in text
    assert (out / "grpo" / "seed0" / "commit.txt").read_text().strip()
    pending = table.render("<!-- results:algorithms gae -->\n<!-- /results -->\n", Path("x.md"))
    assert "| gae | not measured yet |" in pending
