"""Where a benchmark figure came from: the commit and the machine, written beside every figure
(house rule 16). Imported by the scripts of this folder (``python scripts/X.py`` puts the folder
on the path)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    """$TANDEM_COMMIT (a lent machine's copy of the tree can carry a stale .git: name the
    commit there), else the checked-out commit with "+dirty" when tracked files differ from
    it, else "unknown"."""
    if os.environ.get("TANDEM_COMMIT"):
        return os.environ["TANDEM_COMMIT"]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return (head or "unknown") + ("+dirty" if head and dirty else "")


def machine(device: str = "cpu") -> str:
    """The GPU's name for a CUDA device, else the CPU model and the core count."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} CPUs"


def stamp(device: str = "cpu") -> dict[str, str]:
    """The commit, the machine and the UTC time: the head of every benchmark's JSON."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"commit": commit(), "machine": machine(device), "date": now}


def publish(name: str, record: dict) -> Path:
    """Keep a benchmark's ``record`` (with its ``stamp`` and a ``headline`` of figures where
    higher is better) as ``docs/results/bench/NAME/DATE-COMMIT.json``, beside the earlier ones:
    ``scripts/results_table.py`` shows the newest against the one before and flags drops."""
    if not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"benchmark name {name!r}: letters, digits, - and _ only")
    missing = {"commit", "machine", "date", "headline"} - set(record)
    if missing:
        raise ValueError(f"benchmark record lacks {sorted(missing)}")
    day = record["date"][:10]
    path = ROOT / "docs" / "results" / "bench" / name / f"{day}-{record['commit']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def add_output_flags(parser) -> None:
    """``--json PATH`` and ``--publish NAME``, the two places a benchmark's figures go."""
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument(
        "--publish",
        default=None,
        metavar="NAME",
        help="also keep them as docs/results/bench/NAME/DATE-COMMIT.json (the results page)",
    )


def write_outputs(args, record: dict) -> None:
    """Write ``record`` where ``add_output_flags``'s flags say."""
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    if args.publish:
        print(f"published {publish(args.publish, record)}")
