"""Every recipe's ``learn`` preset runs through scripts/bench_learning.py for one step on its
real model, with the held-out evaluation before and after, so neither the presets nor the
script can rot. The evaluation is cut to two held-out items, the step to one group of two
episodes and the replies to a few tokens to keep this short; everything else is the preset's.
The script's statistics have goldens."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from kernel.benchmarks import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
LEARN = sorted(ROOT.glob("recipes/*/presets/learn.yaml"))
LEARN_ALL = sorted(ROOT.glob("recipes/*/presets/learn*.yaml"))  # learn_three_role.yaml, ...
FIELDS = ("recipe", "model", "metric", "n_eval", "before", "after", "diff", "ci_low", "ci_high")
FIELDS += ("per_seed", "beside", "commit", "machine", "command")


def bench_learning():
    spec = importlib.util.spec_from_file_location(
        "bench_learning", ROOT / "scripts" / "bench_learning.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_learning"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_learn_presets_exist_and_hold_out_their_eval_set():
    recipes = {p.parent.parent.name for p in LEARN}
    assert recipes == {"code_pair", "debate", "deep_research", "math_solver_verifier", "takes_two"}
    for preset in LEARN_ALL:
        cfg = yaml.safe_load(preset.read_text())
        assert cfg["eval"]["path"] and cfg["eval"]["every"], preset
        held_out = _rows(cfg["eval"]["path"])
        trained = set(_rows(cfg["data"]["path"]))
        assert held_out and not trained & set(held_out), f"{preset}: eval rows are trained on"


def _rows(path: str) -> list[str]:
    """A data file's lines, or a benchmark slice's rows as JSON."""
    if path.startswith("benchmark:"):
        return [json.dumps(r, sort_keys=True) for r in load_benchmark(path).to_list()]
    return (ROOT / path).read_text().splitlines()


@pytest.mark.slow
@pytest.mark.parametrize("preset", LEARN, ids=[p.parent.parent.name for p in LEARN])
def test_learn_preset_one_step_through_bench_learning(preset, tmp_path):
    recipe = preset.parent.parent.name
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_learning.py"), "--recipe", recipe]
    cmd += ["--out", str(tmp_path), "--resamples", "200", "--steps", "1", "--"]
    cmd += ["--eval.max_prompts", "2", "--rollout.max_response_len", "12"]
    cmd += ["--data.n_samples_per_prompt", "2", "--data.prompts_per_step", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "learning.json").read_text())
    assert all(k in report for k in FIELDS) and report["recipe"] == recipe
    assert report["steps"] == 1 and report["n_eval"] == 2 and report["samples"] > 0
    assert report["seeds"] == [0] and report["capped"] == [] and len(report["per_seed"]) == 1
    assert report["ci_low"] <= report["diff"] <= report["ci_high"]
    assert report["diff"] == pytest.approx(report["after"] - report["before"])
    assert set(report["phases_s"]) == {"startup", "generate", "reward", "train", "sync", "eval"}
    assert report["phases_s"]["eval"] > 0 and report["phases_s"]["train"] > 0
    assert report["tokens_per_step"] > 0 and report["commit"] and "cores" in report["machine"]
    headline = bench_learning().headline_of(recipe, "learn")
    assert report["score"] == headline.score and report["agent"] == headline.agent
    assert set(report["beside"]) == set(headline.beside), "a beside score the recipe lacks"
    assert (tmp_path / "seed0" / "curves.png").exists()
    for updates in (0, 1):
        path = tmp_path / "seed0" / "eval" / f"step_{updates}.jsonl"
        assert {json.loads(x)["row"] for x in path.open()} == {0, 1}


@pytest.mark.slow
def test_vote_evaluates_each_seeds_last_checkpoint_k_times(tmp_path):
    """--vote K: the seed's last checkpoint answers every held-out item K times (sampled), the
    file is kept beside the evaluations, and the report scores the plurality answer; a second
    call keeps the seed and its vote."""
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_learning.py")]
    cmd += ["--recipe", "deep_research", "--preset", "learn_solo", "--out", str(tmp_path)]
    cmd += ["--resamples", "200", "--steps", "1", "--save-every", "1", "--vote", "2", "--"]
    cmd += ["--eval.max_prompts", "2", "--rollout.max_response_len", "12"]
    cmd += ["--data.n_samples_per_prompt", "2", "--data.prompts_per_step", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    vote = tmp_path / "seed0" / "eval" / "vote_k2.jsonl"
    lines = [json.loads(x) for x in vote.open()]
    assert {x["row"] for x in lines} == {0, 1} and all(len(x["texts"]) == 2 for x in lines)
    report = json.loads((tmp_path / "learning.json").read_text())
    assert report["vote"]["k"] == 2 and report["vote"]["n_eval"] == 2
    assert 0.0 <= report["vote"]["after"] <= 1.0
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert again.returncode == 0 and "vote of 2 evaluated before, kept" in again.stdout


@pytest.mark.slow
def test_a_seed_cut_short_goes_on_from_its_checkpoint(tmp_path):
    """A session lost mid-seed (SIGKILL to bench_learning and its run) costs only the steps
    since the last checkpoint: the same command goes on from it, each step is trained once, and
    commit.txt says where the seed resumed."""
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_learning.py")]
    cmd += ["--recipe", "math_solver_verifier", "--out", str(tmp_path), "--resamples", "200"]
    cmd += ["--steps", "3", "--save-every", "1", "--"]
    cmd += ["--eval.max_prompts", "2", "--rollout.max_response_len", "12"]
    cmd += ["--data.n_samples_per_prompt", "2", "--data.prompts_per_step", "1"]
    seed = tmp_path / "seed0"
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 600
        while not (seed / "checkpoints" / "step_1").is_dir():
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint after step 1 in 10 minutes"
            time.sleep(0.5)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert not (seed / "eval" / "step_3.jsonl").exists()

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"seed 0: resuming from {seed / 'checkpoints'}" in again.stdout
    rows = [json.loads(line) for line in (seed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["step"] >= 0] == [0, 1, 2]  # each step once
    started, resumed = (seed / "commit.txt").read_text().splitlines()
    assert re.fullmatch(rf"resumed at step [12]: {re.escape(started)}", resumed), resumed
    report = json.loads((tmp_path / "learning.json").read_text())
    assert report["steps"] == 3 and report["per_seed"][0]["resumed"] == [resumed]
    assert {json.loads(x)["row"] for x in (seed / "eval" / "step_0.jsonl").open()} == {0, 1}


# ---- the statistics ---------------------------------------------------------------------------


def test_paired_bootstrap_goldens():
    m = bench_learning()
    assert m.paired_bootstrap(np.zeros(50), np.ones(50), 1000) == (1.0, 1.0)
    assert m.paired_bootstrap(np.ones(50), np.ones(50), 1000) == (0.0, 0.0)
    # 20 of 100 items flip 0 -> 1, none the other way: mean diff 0.2, sd of the mean 0.04
    before, after = np.zeros(100), np.r_[np.ones(20), np.zeros(80)]
    low, high = m.paired_bootstrap(before, after, 20000)
    assert 0.11 <= low <= 0.13 and 0.27 <= high <= 0.29
    # pairing matters: the same marginals with every item moving together have no spread
    b = np.r_[np.zeros(50), np.ones(50)]
    assert m.paired_bootstrap(b, b + 0.1, 1000) == pytest.approx((0.1, 0.1))


def test_crossed_bootstrap_covers_seeds_and_items():
    m = bench_learning()
    # one seed: the item bootstrap (20 of 100 items flip: sd of the mean 0.04)
    one = np.r_[np.ones(20), np.zeros(80)][None, :]
    low, high = m.crossed_bootstrap(one, None, 20000)
    assert 0.11 <= low <= 0.13 and 0.27 <= high <= 0.29
    # three seeds that agree item by item: no wider than one
    assert m.crossed_bootstrap(np.repeat(one, 3, 0), None, 20000) == pytest.approx((low, high))
    # seeds that disagree with no item spread at all: the interval is the seeds' spread
    seeds = np.array([[0.0] * 50, [0.2] * 50, [0.4] * 50])
    low, high = m.crossed_bootstrap(seeds, None, 20000)
    assert low == pytest.approx(0.0) and high == pytest.approx(0.4)
    # two runs on the same items: items are drawn once for both, so a shared item effect
    # cancels (every item 0 or 1 in both runs, run a 0.1 higher everywhere: no spread)
    base = np.r_[np.zeros(50), np.ones(50)][None, :]
    assert m.crossed_bootstrap(base + 0.1, base, 1000) == pytest.approx((0.1, 0.1))


def _write(path: Path, items: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path


def test_item_scores_average_episodes_and_skip_masked_ones(tmp_path):
    m = bench_learning()
    path = _write(
        tmp_path / "e.jsonl",
        [
            {
                "row": 0,
                "agent": "doctor",
                "rewards": [1.0, None, 0.0],  # the second episode was masked (judge failed)
                "passed": [True, False, False],
                "metrics": [{"dx": 1.0, "q": 2.0}, {"dx": 1.0}, {"dx": 0.0, "q": 1.0}],
            },
            {"row": 1, "agent": "doctor", "rewards": [0.5], "passed": [False], "metrics": [{}]},
            {"row": 0, "agent": "patient", "rewards": [None], "passed": [False]},  # none kept
        ],
    )
    scores = m.item_scores(path)
    assert set(scores) == {"doctor"}
    d = scores["doctor"]
    assert d["reward"] == {0: 0.5, 1: 0.5} and d["passed"] == {0: 0.5, 1: 0.0}
    assert d["dx"] == {0: 0.5} and d["q"] == {0: 1.5}  # over the kept episodes reporting it


def test_pooled_and_between_pair_rows_and_seeds():
    m = bench_learning()
    # two seeds; row 2 was scored by one seed only: left out
    before = [{0: 0.0, 1: 0.0, 2: 1.0}, {0: 0.0, 1: 0.0}]
    after = [{0: 1.0, 1: 0.0, 2: 1.0}, {0: 1.0, 1: 1.0}]
    s = m.pooled(before, after, 500)
    assert s["n_eval"] == 2 and s["before"] == 0.0 and s["after"] == 0.75 and s["diff"] == 0.75
    assert 0.0 <= s["ci_low"] <= s["diff"] <= s["ci_high"] <= 1.0
    assert m.pooled(before, after, 500, rows=[1])["after"] == 0.5  # a subset of rows
    assert m.pooled(before, after, 500, rows=[7]) is None
    b = m.between([{0: 0.0, 1: 1.0}], [{0: 1.0, 1: 1.0}, {0: 1.0, 1: 0.0}], 500)
    assert b["before"] == 0.5 and b["after"] == 0.75 and b["diff"] == 0.25


# ---- finished runs on disk ----------------------------------------------------------------------


def finished_run(out: Path, seeds: dict[int, tuple[list[float], list[float]]], steps: int = 2):
    """A bench_learning run folder: per seed, the doctor's rewards per held-out row before and
    after ``steps`` steps (passed when > 0.5; diagnosis_correct when >= 0.6)."""
    for seed, (before, after) in seeds.items():
        d = out / f"seed{seed}"
        (d / "eval").mkdir(parents=True)
        config = {
            "model": "m",
            "seed": seed,
            "num_steps": steps,
            "eval": {
                "path": "recipes/takes_two/data/test.jsonl",
                "temperature": 0.0,
                "n_samples": 1,
            },
        }
        (d / "config.json").write_text(json.dumps(config))
        (d / "commit.txt").write_text("abc123\n")
        rows = [{"step": -1, "time/startup_s": 3.0}]
        rows += [{"step": k, "doctor/response_length": 10.0, "doctor/samples": 4.0,
                  "time/train_s": 6.0} for k in range(steps)]  # fmt: skip
        _write(d / "metrics.jsonl", rows)
        for step, rewards in ((0, before), (steps, after)):
            items = [
                {
                    "row": row,
                    "agent": "doctor",
                    "rewards": [r],
                    "passed": [r > 0.5],
                    "metrics": [{"diagnosis_correct": float(r >= 0.6), "questions_asked": 1.0}],
                }
                for row, r in enumerate(rewards)
            ]
            _write(d / "eval" / f"step_{step}.jsonl", items)
    return out


def test_report_pools_seeds_and_reports_each(tmp_path, capsys):
    m = bench_learning()
    out = finished_run(
        tmp_path / "run",
        {0: ([0.0, 0.0, 0.0, 0.0], [0.6, 0.8, 0.0, 0.0]), 1: ([0.0] * 4, [0.6, 0.0, 0.0, 0.0])},
    )
    assert m.main(["--recipe", "takes_two", "--out", str(out), "--report-only"]) == 0
    r = json.loads((out / "learning.json").read_text())
    assert r["agent"] == "doctor" and r["score"] == "diagnosis_correct"
    assert r["seeds"] == [0, 1] and r["steps"] == 2 and r["capped"] == []
    assert r["commit"] == "abc123"  # the commit each seed trained at
    assert r["before"] == 0.0 and r["after"] == pytest.approx(3 / 8) and r["n_eval"] == 4
    assert [s["after"] for s in r["per_seed"]] == [0.5, 0.25]
    assert r["beside"]["reward"]["after"] == pytest.approx(2.0 / 8)
    assert r["beside"]["questions_asked"]["diff"] == 0.0
    assert r["tokens_per_step"] == 40.0 and r["per_seed"][0]["minutes"] == pytest.approx(
        0.25, abs=0.05
    )
    # takes_two's held-out rows say whether their condition was trained on: reported apart
    assert r["subsets"] and all(k.startswith("unseen_condition=") for k in r["subsets"])
    assert "per seed:" in capsys.readouterr().out
    # a seed cut short by --minutes is flagged
    config = json.loads((out / "seed1" / "config.json").read_text())
    (out / "seed1" / "config.json").write_text(json.dumps(config | {"num_steps": 5}))
    m.main(["--recipe", "takes_two", "--out", str(out), "--report-only"])
    assert json.loads((out / "learning.json").read_text())["capped"] == [1]


def test_report_only_leaves_out_a_seed_still_training_and_names_it(tmp_path, capsys):
    m = bench_learning()
    out = finished_run(tmp_path / "run", {0: ([0.0] * 4, [0.6, 0.8, 0.0, 0.0])})
    training = finished_run(tmp_path / "later", {1: ([0.0] * 4, [0.6] * 4)}) / "seed1"
    (training / "eval" / "step_2.jsonl").unlink()  # evaluated at the start, training now
    training.rename(out / "seed1")
    assert m.main(["--recipe", "takes_two", "--out", str(out), "--report-only"]) == 0
    r = json.loads((out / "learning.json").read_text())
    assert r["seeds"] == [0] and r["after"] == pytest.approx(2 / 4)
    assert f"{out / 'seed1'} has not finished" in capsys.readouterr().err


def test_against_compares_headlines_over_both_runs_seeds(tmp_path, capsys):
    m = bench_learning()
    frozen = finished_run(tmp_path / "frozen", {0: ([0.0] * 4, [0.2, 0.4, 0.6, 0.0])})
    cotrained = finished_run(
        tmp_path / "cotrained",
        {0: ([0.0] * 4, [0.6, 0.8, 0.6, 0.0]), 1: ([0.0] * 4, [0.6, 0.8, 0.6, 0.0])},
    )
    flags = ["--recipe", "takes_two", "--out", str(cotrained), "--report-only"]
    assert m.main([*flags, "--resamples", "200", "--against", str(frozen)]) == 0
    vs = json.loads((cotrained / "learning.json").read_text())["against"]
    assert vs["seeds"] == [0] and vs["base_headline"] == {
        "agent": "doctor",
        "score": "diagnosis_correct",
    }
    h = vs["headline"]  # diagnosis_correct: frozen rows 2 only, co-trained rows 0, 1, 2
    assert h["before"] == 0.25 and h["after"] == 0.75 and h["diff"] == 0.5
    r = vs["agents"]["doctor"]["reward"]
    assert (
        r["n_eval"] == 4 and r["before"] == pytest.approx(0.3) and r["after"] == pytest.approx(0.5)
    )
    assert r["ci_low"] >= 0.0 and r["ci_high"] <= 0.4
    assert "against this run" in capsys.readouterr().out
    # a run that did not finish is named
    (frozen / "seed0" / "eval" / "step_2.jsonl").unlink()
    with pytest.raises(SystemExit, match=r"step_2\.jsonl is missing"):
        m.main([*flags, "--against", str(frozen)])


def test_publish_copies_what_the_report_was_computed_from(tmp_path, monkeypatch):
    m = bench_learning()
    monkeypatch.setattr(m, "RESULTS", tmp_path / "results")
    out = finished_run(tmp_path / "run", {3: ([0.0, 1.0], [1.0, 1.0]), 4: ([0.0, 1.0], [0.0, 1.0])})
    flags = ["--recipe", "takes_two", "--out", str(out), "--report-only", "--seed", "3"]
    assert m.main([*flags, "--publish", "demo"]) == 0
    pub = tmp_path / "results" / "demo"
    names = sorted(str(p.relative_to(pub)) for p in pub.rglob("*") if p.is_file())
    assert names == [
        "learning.json",
        *[f"seed{s}/{f}" for s in (3, 4) for f in (
            "commit.txt", "config.json", "curves.png", "eval/step_0.jsonl.gz",
            "eval/step_2.jsonl.gz", "metrics.jsonl.gz")],
    ]  # fmt: skip
    # the published copy is a run folder: reported from it, the figures are the same
    again = m.report(
        [m.SeedRun.read(d) for d in m.seed_dirs(pub)], "takes_two", "learn", 10000, "cmd"
    )
    first = json.loads((pub / "learning.json").read_text())
    for key in ("before", "after", "diff", "ci_low", "ci_high", "per_seed", "tokens_per_step"):
        assert again[key] == first[key], key


def test_bad_flags_are_refused_by_name(tmp_path):
    m = bench_learning()
    with pytest.raises(SystemExit, match="--steps N"):
        m.main(["--recipe", "takes_two", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="no finished seed"):
        m.main(["--recipe", "takes_two", "--out", str(tmp_path), "--report-only"])
    with pytest.raises(SystemExit, match="no 'nope' preset"):
        m.main(["--recipe", "takes_two", "--preset", "nope", "--steps", "1"])


def test_preset_headlines_name_an_agent_of_an_existing_preset():
    m = bench_learning()
    assert m.headline_of("math_solver_verifier", "learn").agent == "solver"
    for (recipe, preset), headline in m.PRESET_HEADLINES.items():
        path = ROOT / "recipes" / recipe / "presets" / f"{preset}.yaml"
        agents = yaml.safe_load(path.read_text())["agents"]
        assert headline.agent in agents and m.headline_of(recipe, preset) == headline
