"""Every recipe's ``learn`` preset runs through scripts/bench_learning.py for one step on its
real model, with the held-out evaluation before and after, so neither the presets nor the
script can rot. The evaluation is cut to two held-out items, the step to one group of two
episodes and the replies to a few tokens to keep this short; everything else is the preset's.
The script's statistics have goldens."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from kernel.benchmarks import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
LEARN = sorted(ROOT.glob("recipes/*/presets/learn.yaml"))
LEARN_ALL = sorted(ROOT.glob("recipes/*/presets/learn*.yaml"))  # learn_three_role.yaml, ...
FIELDS = ("recipe", "model", "metric", "n_eval", "before", "after", "diff", "ci_low", "ci_high")


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
    cmd += ["--out", str(tmp_path), "--resamples", "200", "--", "--num_steps", "1"]
    cmd += ["--eval.max_prompts", "2", "--rollout.max_response_len", "12"]
    cmd += ["--data.n_samples_per_prompt", "2", "--data.prompts_per_step", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "learning.json").read_text())
    assert all(k in report for k in FIELDS) and report["recipe"] == recipe
    assert report["steps"] == 1 and report["n_eval"] == 2 and report["samples"] > 0
    assert report["ci_low"] <= report["diff"] <= report["ci_high"]
    assert report["diff"] == pytest.approx(report["after"] - report["before"])
    assert set(report["phases_s"]) == {"startup", "generate", "reward", "train", "sync", "eval"}
    assert report["phases_s"]["eval"] > 0 and report["phases_s"]["train"] > 0
    assert (tmp_path / "curves.png").exists()
    if recipe == "takes_two":  # the doctor's episode metrics, compared item by item too
        facts = report["episode_metrics"]["doctor"]["facts_revealed"]
        assert facts["n_eval"] == 2 and facts["ci_low"] <= facts["diff"] <= facts["ci_high"]
    for updates in (0, 1):
        items = [json.loads(x) for x in (tmp_path / "eval" / f"step_{updates}.jsonl").open()]
        assert {i["row"] for i in items} == {0, 1}, items


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


def test_compare_pairs_items_by_row_and_agent(tmp_path):
    m = bench_learning()

    def write(name, items):
        path = tmp_path / name
        path.write_text("".join(json.dumps(i) + "\n" for i in items))
        return path

    before = write(
        "b.jsonl",
        [
            {"row": 0, "agent": "solver", "rewards": [0.0, 1.0], "passed": [False, True]},
            {"row": 1, "agent": "solver", "rewards": [0.0, 0.0], "passed": [False, False]},
            {"row": 2, "agent": "solver", "rewards": [1.0, 1.0], "passed": [True, True]},
            {"row": 0, "agent": "selector", "rewards": [None], "passed": [False]},
        ],
    )
    after = write(
        "a.jsonl",
        [
            {"row": 1, "agent": "solver", "rewards": [1.0, 1.0], "passed": [True, True]},
            {"row": 0, "agent": "solver", "rewards": [1.0, 1.0], "passed": [True, True]},
            {"row": 0, "agent": "selector", "rewards": [1.0], "passed": [True]},
        ],
    )
    out = m.compare(before, after, 500)
    # row 2 was not scored after: left out; the selector's only item had no reward before
    assert set(out) == {"solver"}
    s = out["solver"]
    assert s["n_eval"] == 2 and s["before"] == 0.25 and s["after"] == 1.0
    assert s["diff"] == 0.75 and s["ci_low"] == 0.5 and s["ci_high"] == 1.0
    # scored by correctness instead: an episode with reward 1 the recipe did not mark correct
    # fails (row 1 after: 1 of 2 passed)
    after = write(
        "a2.jsonl",
        [
            {"row": 1, "agent": "solver", "rewards": [1.0, 1.0], "passed": [True, False]},
            {"row": 0, "agent": "solver", "rewards": [1.0, 1.0], "passed": [True, True]},
        ],
    )
    p = m.compare(before, after, 500, "passed")["solver"]
    assert p["before"] == 0.25 and p["after"] == 0.75 and p["diff"] == 0.5


def test_episode_metrics_are_paired_by_row_and_averaged_over_episodes(tmp_path):
    m = bench_learning()
    before, after = tmp_path / "b.jsonl", tmp_path / "a.jsonl"
    before.write_text(
        json.dumps({"row": 0, "agent": "doctor", "metrics": [{"facts": 0.0}, {"facts": 0.5}]})
        + "\n"
        + json.dumps({"row": 1, "agent": "doctor", "metrics": [{"facts": 0.0, "turns": 2.0}]})
        + "\n"
        + json.dumps({"row": 0, "agent": "patient", "rewards": [1.0]})  # no metrics: none
        + "\n"
    )
    after.write_text(
        json.dumps({"row": 1, "agent": "doctor", "metrics": [{"facts": 1.0}]})
        + "\n"
        + json.dumps({"row": 0, "agent": "doctor", "metrics": [{"facts": 0.25}]})
        + "\n"
    )
    out = m.compare_metrics(before, after, 500)
    assert set(out) == {"doctor"} and set(out["doctor"]) == {"facts"}  # turns: before only
    f = out["doctor"]["facts"]
    # rows 0 and 1: before (0.25, 0.0), after (0.25, 1.0)
    assert f["n_eval"] == 2 and f["before"] == 0.125 and f["after"] == 0.625 and f["diff"] == 0.5
    assert f["ci_low"] == 0.0 and f["ci_high"] == 1.0


def test_readme_row_shows_every_figure_of_the_report():
    report = {
        "recipe": "math_solver_verifier",
        "model": "smollm2",
        "metric": "solver accuracy",
        "n_eval": 256,
        "before": 0.234,
        "after": 0.3516,
        "diff": 0.1176,
        "ci_low": 0.07,
        "ci_high": 0.164,
        "minutes": 46.4,
        "steps": 61,
        "command": "python scripts/bench_learning.py --recipe math_solver_verifier",
    }
    assert bench_learning().readme_row(report) == (
        "| math_solver_verifier | smollm2 | solver accuracy | 256 | 0.234 | 0.352 | "
        "+0.118 [+0.070, +0.164] | 46 (61 steps) | "
        "`python scripts/bench_learning.py --recipe math_solver_verifier` |"
    )


def test_preset_headlines_name_an_agent_of_an_existing_preset():
    m = bench_learning()
    assert m.headline_of("math_solver_verifier", "learn").agent == "solver"
    for (recipe, preset), headline in m.PRESET_HEADLINES.items():
        path = ROOT / "recipes" / recipe / "presets" / f"{preset}.yaml"
        agents = yaml.safe_load(path.read_text())["agents"]
        assert headline.agent in agents and m.headline_of(recipe, preset) == headline


def test_against_pairs_two_finished_runs_final_scores_by_item(tmp_path, capsys):
    """--report-only --against: this run's final held-out scores against another run's (an
    ablation), paired by item; the run's own before/after stays as it was."""
    m = bench_learning()

    def finished_run(name, before, after):  # doctor rewards per held-out row, before / after
        out = tmp_path / name
        (out / "eval").mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({"model": "m", "eval": {"temperature": 0}}))
        rows = [{"step": -1}, {"step": 0, "doctor/reward": 0.1}, {"step": 1, "doctor/reward": 0.2}]
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        for step, rewards in ((0, before), (2, after)):
            items = [
                {
                    "row": row,
                    "agent": "doctor",
                    "rewards": [r],
                    "passed": [r > 0.5],
                    "metrics": [{"facts_revealed": r / 2}],
                }
                for row, r in enumerate(rewards)
            ]
            path = out / "eval" / f"step_{step}.jsonl"
            path.write_text("".join(json.dumps(i) + "\n" for i in items))
        return out

    frozen = finished_run("frozen", [0.0, 0.0, 0.0, 0.0], [0.2, 0.4, 0.6, 0.0])
    cotrained = finished_run("cotrained", [0.0, 0.0, 0.0, 0.0], [0.6, 0.8, 0.6, 0.0])
    flags = ["--recipe", "takes_two", "--out", str(cotrained), "--report-only"]
    assert m.main([*flags, "--resamples", "200", "--against", str(frozen)]) == 0
    report = json.loads((cotrained / "learning.json").read_text())
    assert report["steps"] == 2 and report["after"] == pytest.approx(0.5)
    vs = report["against"]
    assert vs["run"] == str(frozen)
    r = vs["reward"]["doctor"]
    assert (
        r["n_eval"] == 4 and r["before"] == pytest.approx(0.3) and r["after"] == pytest.approx(0.5)
    )
    assert r["diff"] == pytest.approx(0.2) and r["ci_low"] >= 0.0 and r["ci_high"] <= 0.4
    assert vs["passed"]["doctor"]["diff"] == pytest.approx(0.5)  # rows 0, 1 pass only here
    assert vs["episode_metrics"]["doctor"]["facts_revealed"]["diff"] == pytest.approx(0.1)
    assert "--against" in report["command"]
    assert "against this run" in capsys.readouterr().out
    # a run that did not finish is named
    (frozen / "eval" / "step_2.jsonl").unlink()
    with pytest.raises(SystemExit, match=r"step_2\.jsonl is missing"):
        m.main([*flags, "--against", str(frozen)])
