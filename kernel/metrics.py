"""Run metrics: one JSON object per step to ``metrics.jsonl`` always, and to TensorBoard and
Weights & Biases when enabled (both imported only then).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


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


def _sync(f) -> None:
    """Flush ``f`` to the disk (not only to the OS): the row survives a power loss too."""
    f.flush()
    os.fsync(f.fileno())


def fsync_path(path: Path) -> None:
    """Flush a file, or a folder's entries (a rename inside it), to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of a prompt with ``c`` correct among ``n`` sampled episodes (Chen et
    al. 2021, the Codex estimator): ``1 - C(n - c, k) / C(n, k)``, the chance that ``k`` of the
    ``n`` drawn without replacement hold a correct one. Needs ``1 <= k <= n``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


class MetricsLogger:
    """Appends one JSON row per step to metrics.jsonl, flushed and fsynced, so a crash loses at
    most the row it was writing.

    A run resumed at ``start_step`` redoes the steps from there; rows of those steps already in
    the file (logged by the crashed run after the checkpoint it resumes from, with numbers the
    redone steps will not reproduce) are moved to ``metrics.discarded.jsonl`` (appended and
    fsynced first), and metrics.jsonl is replaced atomically (new file, fsync, os.replace) by
    the rows it keeps; when nothing is to be moved the file is only appended to. So
    metrics.jsonl holds each step exactly once, the one of the run that went on, and no row is
    lost. A run starting at step 0 moves every earlier row, the eval.at_start row (step -1)
    included, since it logs that one again. A torn last line (a crash mid-write) is dropped
    with a warning naming the file and line; an unreadable line before it is an error.
    """

    def __init__(
        self, out_dir: Path, cfg: LogConfig, run_config: dict | None = None, start_step: int = 0
    ):
        self.path = Path(out_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            self._set_aside_rows_from(start_step)
        self._file = self.path.open("a")
        self._tb = self._wandb = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # a resumed run redoes steps from start_step: TensorBoard drops the crashed run's
            # events of those steps (purge_step), as metrics.jsonl sets its rows aside
            purge = start_step if start_step > 0 else None
            self._tb = SummaryWriter(str(Path(out_dir) / "tensorboard"), purge_step=purge)
        if cfg.wandb:
            import wandb

            self._wandb = wandb.init(
                project=cfg.wandb_project, dir=str(out_dir), config=run_config or {}
            )

    def _set_aside_rows_from(self, start_step: int) -> None:
        """Move the rows of the steps this run logs again to metrics.discarded.jsonl and drop a
        torn last line (see the class docstring); leave the file alone if neither is there."""
        data = self.path.read_bytes()
        lines = data.decode(errors="replace").rstrip().split("\n")  # the last one may be torn
        kept, moved, torn = [], [], False
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                if lineno < len(lines):
                    raise ValueError(
                        f"{self.path}: line {lineno} is not JSON ({e.msg}); only the last line "
                        "can be torn by a crash: repair or remove that line, then resume"
                    ) from None
                log.warning("%s: line %d is torn (a crash mid-write); dropped", self.path, lineno)
                torn = True
                continue
            again = start_step == 0 or int(row.get("step", 0)) >= start_step
            (moved if again else kept).append(line)
        if not (moved or torn or (data and not data.endswith(b"\n"))):
            return
        if moved:
            discarded = self.path.with_name("metrics.discarded.jsonl")
            with discarded.open("a") as f:
                f.writelines(line + "\n" for line in moved)
                _sync(f)
            log.warning(
                "%s: %d rows of steps this run logs again (from step %d on) moved to %s",
                *(self.path, len(moved), start_step, discarded),
            )
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w") as f:
            f.writelines(line + "\n" for line in kept)
            _sync(f)
        os.replace(tmp, self.path)
        fsync_path(self.path.parent)

    def log(self, row: dict) -> None:
        clean = {k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}
        self._file.write(json.dumps(clean) + "\n")
        _sync(self._file)
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
