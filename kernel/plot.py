"""Learning curves: metrics.jsonl -> one PNG with a panel per quantity, a line per agent.

Every run writes one JSON object per step to ``metrics.jsonl``. By default the panels are the
ones a user checks first - reward, response length, entropy, KL, the PPO update's clip
fraction and largest ratio, policy loss, the rollout/training logprob gap, evaluation scores,
and a ``kernel sft`` run's training and held-out NLL - each with one line per agent where the
metric is per agent (``<agent>/reward``) or per model (``train/<agent>/clipfrac``); ``keys``
plots chosen metrics instead, one panel each.
``compare_runs`` overlays several runs: a panel per chosen metric, a line per run (an ablation
against its baseline).
"""

from __future__ import annotations

import json
from pathlib import Path

# (panel title, predicate on a metric name)
PANELS = [
    ("reward", lambda k: k.endswith("/reward") and not k.startswith("eval/")),
    ("NLL (kernel sft)", lambda k: k in ("train/nll", "eval/nll")),
    ("response length", lambda k: k.endswith("/response_length")),
    ("entropy", lambda k: _train(k, "entropy")),
    ("KL", lambda k: _train(k, "kl", "approx_kl")),
    ("PPO clip fraction", lambda k: _train(k, "clipfrac", "tis_clipfrac")),
    ("PPO ratio max", lambda k: _train(k, "ratio_max")),
    ("policy loss", lambda k: _train(k, "pg_loss")),
    ("|rollout - train| logprob", lambda k: _train(k, "logprob_diff")),
    ("eval", lambda k: k.startswith("eval/") and k != "eval/nll"),
]


def _train(key: str, *names: str) -> bool:
    """Whether ``key`` is a trainer metric among ``names``: ``train/<name>`` (one model) or
    ``train/<agent>/<name>`` (a model per agent)."""
    parts = key.split("/")
    return parts[0] == "train" and len(parts) in (2, 3) and parts[-1] in names


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a metrics.jsonl file; a broken line is an error naming file and line,
    except a last line with no line break, which a run still writing (or killed mid-write)
    leaves: it is skipped."""
    rows = []
    lines = Path(path).read_text().split("\n")  # the last item: "" or a line being written
    for lineno, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                if lineno == len(lines):
                    break
                raise ValueError(f"{path}: line {lineno}: not JSON ({e.msg})") from e
    return rows


def _panels(rows: list[dict], keys: list[str] | None) -> list[tuple[str, list[str]]]:
    numeric = sorted({k for r in rows for k, v in r.items() if isinstance(v, int | float)})
    if keys:
        missing = [k for k in keys if k not in numeric]
        if missing:
            raise ValueError(f"no metric named {missing}; available: {numeric}")
        return [(k, [k]) for k in keys]
    panels = [(title, [k for k in numeric if pick(k)]) for title, pick in PANELS]
    return [(title, ks) for title, ks in panels if ks]


def _line(ax, rows: list[dict], key: str, label: str) -> None:
    """One metric of a run against its steps (rows without it are skipped)."""
    pts = [(r.get("step", i), r[key]) for i, r in enumerate(rows) if r.get(key) is not None]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", linewidth=1.2, label=label)


def plot_metrics(path: str | Path, out: str | Path | None = None, keys: list[str] | None = None):
    """Render the metrics of ``path`` against ``step`` to a PNG; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(path)
    if not rows:
        raise ValueError(f"{path}: no metrics rows to plot")
    try:
        panels = _panels(rows, keys)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    if not panels:
        raise ValueError(f"{path}: none of the default metrics is present; pass keys")
    height = 2.4 * len(panels) + 0.6
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, height), squeeze=False)
    # fixed margins in inches, not layout="constrained": that solver doubled the save (0.84 s
    # against 0.43 s for 9 panels); the suptitle sits in the top 0.4 in, clear of the first title
    fig.subplots_adjust(
        left=0.11, right=0.97, top=1 - 0.85 / height, bottom=0.55 / height, hspace=0.55
    )
    for ax, (title, ks) in zip(axes[:, 0], panels, strict=True):
        for key in ks:
            _line(ax, rows, key, key)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        if len(ks) > 1 or ks[0] != title:
            ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(str(path), fontsize=9, y=1 - 0.15 / height, va="top")
    out = Path(out) if out else Path(path).with_name("curves.png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def compare_runs(paths: list[str | Path], keys: list[str], out: str | Path) -> Path:
    """Several runs' ``keys`` against ``step`` in one PNG: a panel per key, a line per run
    (labelled by its folder); a key no run has is an error naming it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not keys:
        raise ValueError("comparing runs needs the metrics to plot (keys)")
    runs = [(Path(p), read_metrics(p)) for p in paths]
    for key in keys:
        if not any(key in r for _, rows in runs for r in rows):
            raise ValueError(f"no run has a metric named {key!r}: {[str(p) for p, _ in runs]}")
    fig, axes = plt.subplots(
        len(keys), 1, figsize=(7, 2.6 * len(keys)), squeeze=False, layout="constrained"
    )
    for ax, key in zip(axes[:, 0], keys, strict=True):
        for path, rows in runs:
            _line(ax, rows, key, path.parent.name or str(path))
        ax.set_title(key, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("step")
    out = Path(out)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
