"""Learning-curve plots: a PNG from metrics.jsonl, clear errors for bad input."""

import json
import subprocess
import sys

import pytest

from kernel.plot import _panels, plot_metrics


def test_plot_writes_png_with_a_line_per_agent(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"step": i, "doctor/reward": i / 10, "patient/reward": 1 - i / 10, "train/entropy": 2.0}
        for i in range(5)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _panels(rows, None) == [
        ("reward", ["doctor/reward", "patient/reward"]),
        ("entropy", ["train/entropy"]),
    ]
    png = plot_metrics(path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ppo_update_panels_take_one_model_or_one_per_agent():
    rows = [
        {
            "step": 0,
            "train/doctor/clipfrac": 0.1,
            "train/patient/clipfrac": 0.2,
            "train/doctor/ratio_max": 1.3,
            "train/doctor/approx_kl": 0.01,
            "train/clipfrac_note": 1.0,  # not a trainer metric of that name
        }
    ]
    assert _panels(rows, None) == [
        ("KL", ["train/doctor/approx_kl"]),
        ("PPO clip fraction", ["train/doctor/clipfrac", "train/patient/clipfrac"]),
        ("PPO ratio max", ["train/doctor/ratio_max"]),
    ]
    assert _panels([{"step": 0, "train/clipfrac": 0.0}], None) == [
        ("PPO clip fraction", ["train/clipfrac"])
    ]


def test_an_sft_run_plots_its_nll_apart_from_the_eval_scores(tmp_path):
    """kernel sft writes train/nll each update and eval/nll before and after: its own panel,
    not the RL eval panel (where it was left out, and a plain `kernel plot` refused the file)."""
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": i, "train/nll": 2 - i / 4, "train/grad_norm": 1.0} for i in range(4)]
    rows += [{"step": 3, "eval/nll": 1.2, "eval/doctor/pass@1": 0.5}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _panels(rows, None) == [
        ("NLL (kernel sft)", ["eval/nll", "train/nll"]),
        ("eval", ["eval/doctor/pass@1"]),
    ]
    assert plot_metrics(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_errors_name_file_line_and_key(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "reward": 1}\n{oops\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl: line 2"):
        plot_metrics(path)
    path.write_text('{"step": 0, "a/reward": 1}\n{"step": 1, "a/rew')  # line 2 being written
    assert plot_metrics(path).exists()
    path.write_text('{"step": 0, "a/reward": 1}\n')
    with pytest.raises(ValueError, match="no metric named"):
        plot_metrics(path, keys=["kl"])


def test_compare_overlays_runs_and_names_a_missing_metric(tmp_path):
    from kernel.plot import compare_runs

    for name, rewards in (("co", [0.1, 0.5]), ("frozen", [0.1, 0.2])):
        (tmp_path / name).mkdir()
        rows = [{"step": i, "doctor/reward": r} for i, r in enumerate(rewards)]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths = [tmp_path / "co" / "metrics.jsonl", tmp_path / "frozen" / "metrics.jsonl"]
    out = compare_runs(paths, ["doctor/reward"], tmp_path / "both.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no run has a metric named 'patient/reward'"):
        compare_runs(paths, ["patient/reward"], tmp_path / "x.png")
    cmd = [sys.executable, "-m", "kernel", "plot", str(paths[0]), "--compare", str(paths[1])]
    p = subprocess.run([*cmd, "--keys", "doctor/reward", "--out", str(tmp_path / "cli.png")],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0 and (tmp_path / "cli.png").exists(), p.stderr
