"""``python -m kernel eval``: a model, or a run's checkpoint, on a held-out set without training.

The toy task learns within 40 steps; evaluating the checkpoint of that run must score higher
than evaluating the starting model, on the same prompts with the same sampling, and the printed
figures must be the ones in eval.json and the per-item file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = "kernel/presets/toy_prompts.jsonl"


def kernel(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kernel", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def read_eval(out: Path) -> tuple[dict, list[dict]]:
    row = json.loads((out / "eval.json").read_text())
    items = [json.loads(line) for line in (out / "eval" / "step_0.jsonl").open()]
    return row, items


@pytest.mark.slow
def test_eval_of_a_checkpoint_beats_the_starting_model(tmp_path):
    run = tmp_path / "run"
    r = kernel("train", "--preset", "toy", f"--output_dir={run}", "--num_steps=40")
    assert r.returncode == 0, r.stderr[-2000:]
    # captured, not a terminal: a line a step instead of a live bar that shows only its end
    steps = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("step ")]
    assert steps == [f"{k}/40" for k in range(1, 41)], r.stdout[-2000:]
    flags = ["--preset", "toy", f"--eval.path={PROMPTS}", "--eval.n_samples=4"]
    flags += ["--eval.pass_k=[1,4]", "--eval.max_prompts=16"]
    base = kernel("eval", *flags, f"--output_dir={tmp_path / 'base'}")
    assert base.returncode == 0, base.stderr[-2000:]
    trained = kernel(
        "eval",
        *flags,
        f"--output_dir={tmp_path / 'trained'}",
        f"--checkpoint={run / 'checkpoints' / 'step_40'}",
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    (before, items), (after, _) = read_eval(tmp_path / "base"), read_eval(tmp_path / "trained")
    assert after["eval/default/avg@4"] > before["eval/default/avg@4"] + 0.3
    assert len(items) == 16 and all(len(i["rewards"]) == len(i["texts"]) == 4 for i in items)
    assert all(isinstance(t, str) and t for i in items for t in i["texts"])
    assert all(i["metrics"] == [{}] * 4 for i in items)  # the toy reports no episode metrics
    share = sum(sum(i["passed"]) / 4 for i in items) / len(items)
    assert before["eval/default/pass@1"] == pytest.approx(share)
    assert before["eval/default/pass@1"] <= before["eval/default/pass@4"]
    assert f"{after['eval/default/avg@4']:.4f}" in trained.stdout  # the table shows eval.json
    assert not (tmp_path / "trained" / "checkpoints").exists()  # nothing was trained


def test_eval_errors_name_the_problem(tmp_path):
    r = kernel("eval", "--preset", "toy", f"--output_dir={tmp_path}")
    assert r.returncode == 2 and "eval.path" in r.stderr
    r = kernel(
        "eval",
        "--preset",
        "toy",
        f"--eval.path={PROMPTS}",
        f"--output_dir={tmp_path}",
        f"--checkpoint={tmp_path / 'nowhere'}",
    )
    assert r.returncode == 2 and "has no model for agent 'default'" in r.stderr


@pytest.mark.slow
def test_a_log_says_the_start_is_evaluated_first_and_a_resumed_run_does_not(tmp_path):
    """Written to a log, a fresh run says the starting weights are evaluated before step 1;
    a resumed run evaluates no start (its first run did), so it does not say so."""
    flags = ["train", "--preset", "toy", f"--output_dir={tmp_path}", f"--eval.path={PROMPTS}"]
    flags += ["--eval.at_start=true", "--eval.max_prompts=4", "--save_every=2"]
    said = "evaluating the starting weights"
    first = kernel(*flags, "--num_steps=2")
    assert first.returncode == 0, first.stderr[-2000:]
    assert said in first.stdout, first.stdout[-2000:]
    more = kernel(*flags, "--num_steps=3", "--resume=true")
    assert more.returncode == 0, more.stderr[-2000:]
    assert said not in more.stdout, more.stdout[-2000:]
    steps = [line.split()[1] for line in more.stdout.splitlines() if line.startswith("step ")]
    assert steps == ["3/3"], more.stdout[-2000:]
