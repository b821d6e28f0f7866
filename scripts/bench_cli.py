"""How long the command line takes to answer, against TRL's, side by side in fresh processes.

A user meets the CLI before any run: ``--help`` to find a flag, ``kernel config`` to check a
preset. Each command below runs as its own process, in turns (Tandem's, then TRL's, then the
floor, the order rotating each repeat), and its wall seconds from the start to the exit are
measured; the figures are the medians:

- ``train --help``: ``python -m kernel train --help`` (every flag of a training run, with its
  help text read from the config modules' docstrings);
- ``--help``: ``python -m kernel --help`` (the list of commands);
- ``config``: ``python -m kernel config --preset toy`` (a preset read, validated and printed);
- TRL's ``trl grpo --help``, its CLI's help for the same kind of job (the ``peers`` extra
  installs TRL);
- the floor, ``python -c "import torch"``: what a CLI that imports torch before it parses pays.

Printed: each median, and the ratios TRL ÷ Tandem (``train --help`` against ``trl grpo
--help``; > 1: Tandem answers sooner) and torch floor ÷ Tandem.

    python scripts/bench_cli.py                      # 5 repeats (~2 min on 2 cores)
    python scripts/bench_cli.py --repeats 3 --publish cli_help
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.provenance import add_output_flags, stamp, write_outputs  # noqa: E402

PY = sys.executable
TRL_CLI = "import sys; from trl.cli import main; sys.exit(main())"  # the `trl` console script
COMMANDS = {
    "tandem train --help": [PY, "-m", "kernel", "train", "--help"],
    "tandem --help": [PY, "-m", "kernel", "--help"],
    "tandem config --preset toy": [PY, "-m", "kernel", "config", "--preset", "toy"],
    "trl grpo --help": [PY, "-c", TRL_CLI, "grpo", "--help"],
    "import torch (floor)": [PY, "-c", "import torch"],
}


def wall(cmd: list[str]) -> float:
    """Seconds from the process start to its exit; a failing command stops the benchmark."""
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode:
        sys.exit(f"bench_cli.py: {' '.join(cmd[1:])} failed ({done.returncode}):\n{done.stderr}")
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--repeats", type=int, default=5, help="runs of each command (median)")
    add_output_flags(p)
    args = p.parse_args()
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    try:
        import trl  # noqa: F401
    except ImportError:
        p.error("TRL is not installed: bash scripts/setup.sh dev,peers")
    record = stamp() | {"repeats": args.repeats}
    print(f"[bench] commit {record['commit']}; {record['machine']}", flush=True)
    names = list(COMMANDS)
    for name in names:  # once each first: file caches warm, as for a user's second call
        wall(COMMANDS[name])
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(args.repeats):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            times[name].append(wall(COMMANDS[name]))
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name in names:
        spread = ", ".join(f"{t:.2f}" for t in times[name])
        print(f"{name:<28} {medians[name]:6.2f} s  ({spread})")
    ours = medians["tandem train --help"]
    trl_ratio = medians["trl grpo --help"] / ours
    floor_ratio = medians["import torch (floor)"] / ours
    print(f"TRL ÷ Tandem (grpo --help ÷ train --help): {trl_ratio:.2f}")
    print(f"import torch ÷ Tandem train --help: {floor_ratio:.2f}")
    record |= {
        "seconds": medians,
        "runs": times,
        "headline": {
            "train --help, TRL's grpo --help ÷ Tandem's": trl_ratio,
            "train --help, import torch ÷ Tandem's": floor_ratio,
        },
    }
    write_outputs(args, record)


if __name__ == "__main__":
    main()
