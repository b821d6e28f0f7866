"""Helpers of the recipes' tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def write_learning_run(root: Path, config: dict, episodes: list[dict], steps: int = 32) -> Path:
    """A finished one-seed bench_learning run under ``root`` (``run/seed0``): ``config.json``,
    ``steps`` metrics rows, and ``episodes`` as its first held-out evaluation (plain) and its
    last (gzipped, as a published run keeps it). Returns the run folder."""
    seed = root / "run" / "seed0"
    (seed / "eval").mkdir(parents=True)
    (seed / "config.json").write_text(json.dumps(config))
    rows = "".join(json.dumps({"step": i}) + "\n" for i in range(steps))
    (seed / "metrics.jsonl").write_text(rows)
    lines = "".join(json.dumps(e) + "\n" for e in episodes)
    (seed / "eval" / "step_0.jsonl").write_text(lines)
    with gzip.open(seed / "eval" / f"step_{steps}.jsonl.gz", "wt") as f:
        f.write(lines)
    return seed.parent
