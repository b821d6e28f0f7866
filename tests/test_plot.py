"""Learning-curve plots: a PNG from metrics.jsonl, clear errors for bad input."""

import json

import pytest

from kernel.plot import plot_metrics


def test_plot_writes_png(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        "".join(json.dumps({"step": i, "reward": i / 10, "x": 1}) + "\n" for i in range(5))
    )
    png = plot_metrics(path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_errors_name_file_line_and_key(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "reward": 1}\n{oops\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl: line 2"):
        plot_metrics(path)
    path.write_text('{"step": 0, "reward": 1}\n')
    with pytest.raises(ValueError, match="no metric named"):
        plot_metrics(path, keys=["kl"])
