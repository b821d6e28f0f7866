"""Learning curves: metrics.jsonl -> one PNG with a panel per metric.

Every run writes one JSON object per step to ``metrics.jsonl``; this renders the chosen keys
(default: every numeric key containing one of reward, length, kl, entropy, loss) against
the step, one panel each, with matplotlib's headless backend.
"""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_PATTERNS = ("reward", "length", "kl", "entropy", "loss")


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a metrics.jsonl file; a broken line is an error naming file and line."""
    rows = []
    with Path(path).open() as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: line {lineno}: not JSON ({e.msg})") from e
    return rows


def plot_metrics(path: str | Path, out: str | Path | None = None, keys: list[str] | None = None):
    """Render ``keys`` of the metrics file against ``step`` to a PNG; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(path)
    if not rows:
        raise ValueError(f"{path}: no metrics rows to plot")
    numeric = [k for k, v in rows[0].items() if isinstance(v, int | float) and k != "step"]
    keys = keys or [k for k in numeric if any(p in k for p in DEFAULT_PATTERNS)]
    missing = [k for k in keys if k not in rows[0]]
    if missing:
        raise ValueError(f"{path}: no metric named {missing}; available: {numeric}")
    fig, axes = plt.subplots(len(keys), 1, figsize=(7, 2.4 * len(keys)), sharex=True, squeeze=False)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        pts = [(r.get("step", i), r[key]) for i, r in enumerate(rows) if r.get(key) is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", linewidth=1.2)
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(str(path))
    fig.tight_layout()
    out = Path(out) if out else Path(path).with_name("curves.png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
