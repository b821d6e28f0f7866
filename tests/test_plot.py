"""Learning-curve plots: a PNG from metrics.jsonl, clear errors for bad input."""

import json

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
