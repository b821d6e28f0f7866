"""Run metrics: one JSON object per step to ``metrics.jsonl`` always, and to TensorBoard and
Weights & Biases when enabled (both imported only then).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class LogConfig:
    """Where metrics go besides metrics.jsonl."""

    tensorboard: bool = False
    """Also write TensorBoard event files to <output_dir>/tensorboard (needs tensorboard)."""
    wandb: bool = False
    """Also log to Weights & Biases (needs wandb; WANDB_MODE=offline works without network)."""
    wandb_project: str = "tandem"
    """W&B project name."""


def process_age() -> float:
    """Seconds since this process started (from /proc on Linux; elsewhere since the kernel
    package was imported), so a run can log how long it took to reach its first rollout."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = float(Path("/proc/uptime").read_text().split()[0])
        return boot - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED


_IMPORTED = time.monotonic()


def mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


class MetricsLogger:
    """Writes step rows to metrics.jsonl. A run resumed at ``start_step`` keeps the rows of
    the steps before it and drops later ones (logged after the checkpoint it resumes from, by
    the run that crashed), so the file holds each step exactly once."""

    def __init__(
        self, out_dir: Path, cfg: LogConfig, run_config: dict | None = None, start_step: int = 0
    ):
        self.path = Path(out_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if start_step > 0 and self.path.exists():
            lines = self.path.read_text().splitlines()
            kept = [ln for ln in lines if ln.strip() and json.loads(ln)["step"] < start_step]
        self._file = self.path.open("w")
        self._file.writelines(ln + "\n" for ln in kept)
        self._tb = self._wandb = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(Path(out_dir) / "tensorboard"))
        if cfg.wandb:
            import wandb

            self._wandb = wandb.init(
                project=cfg.wandb_project, dir=str(out_dir), config=run_config or {}
            )

    def log(self, row: dict) -> None:
        clean = {k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        step = int(row.get("step", 0))
        numeric = {k: v for k, v in clean.items() if isinstance(v, int | float) and k != "step"}
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(numeric, step=max(step, 0))  # W&B refuses step -1 (eval.at_start)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
