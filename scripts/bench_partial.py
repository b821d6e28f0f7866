"""What partial rollouts buy: a recipe's preset trained with ``rollout.over_sample`` (the first
groups that finish are trained on; the rest carry on into the next step, ``leftover: carry``, or
are cancelled and requeued, ``abort``) against the same preset waiting for every group, as a
user runs it.

The arms (full, then carry and abort) are ``python -m kernel train --recipe R --preset P
--num_steps N`` with no evaluation (``MODE=cpu PRESET=P bash recipes/R/run.sh ...`` for a recipe
whose run.sh starts a service, as scripts/bench_learning.py runs it): the same model, data, seed
and steps; whole processes, one after the other. The figures are over steps 2..N (the first
warms up): episodes trained per second of step time (the step's groups x episodes per group ÷
``time/step_s``), the step, rollout and train times, and for a partial arm how many groups it
carried, how old they were (steps), how stale their samples (weight versions), how many it
cancelled and the tokens they had generated. Each partial arm's episodes/s ÷ the full arm's is
its speed-up; the held-out skill at equal steps is a learning run's question
(scripts/bench_learning.py, one arm each), not this one's.

    .venv/bin/python scripts/bench_partial.py --recipe takes_two --preset learn --steps 5
    .venv/bin/python scripts/bench_partial.py --recipe deep_research --preset learn
    .venv/bin/python scripts/bench_partial.py --recipe gym --preset tools
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.bench_learning import headline_of  # noqa: E402
from scripts.provenance import add_output_flags, stamp, write_outputs  # noqa: E402


def run_arm(recipe: str, preset: str, steps: int, flags: list[str], out: Path) -> dict:
    """One training run of the preset with ``flags``; its figures over steps 2..N."""
    common = ["--num_steps", str(steps), "--seed", "0", "--eval.every", "0"]
    common += ["--eval.at_start", "false", *flags]
    env = dict(os.environ)
    if headline_of(recipe, preset).run_sh:  # e.g. deep_research: its retriever first
        cmd = ["bash", f"recipes/{recipe}/run.sh", *common]
        env |= {"MODE": "cpu", "PRESET": preset, "OUT": str(out), "PY": sys.executable}
    else:
        cmd = [sys.executable, "-m", "kernel", "train", "--recipe", recipe, "--preset", preset]
        cmd += ["--output_dir", str(out), *common]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    config = json.loads((out / "config.json").read_text())
    per_group = config["data"]["n_samples_per_prompt"]
    timed = rows[1:]
    step_s = sum(r["time/step_s"] for r in timed)
    stale = [v for r in timed for k, v in r.items() if k.endswith("/staleness")]
    return {
        "flags": flags,
        "episodes_per_s": sum(r["rollout/groups"] * per_group for r in timed) / step_s,
        "step_s": step_s / len(timed),
        "rollout_s": sum(r["time/rollout_s"] for r in timed) / len(timed),
        "train_s": sum(r["time/train_s"] for r in timed) / len(timed),
        "carried_groups": sum(r.get("rollout/carried_groups", 0.0) for r in timed),
        "carried_age": max((r.get("rollout/carried_age", 0.0) for r in timed), default=0.0),
        "staleness": sum(stale) / len(stale) if stale else 0.0,
        "cancelled_groups": sum(r.get("rollout/cancelled_groups", 0.0) for r in timed),
        "discarded_tokens": sum(r.get("rollout/discarded_tokens", 0.0) for r in timed),
        "wall_s": time.perf_counter() - t0,
        "steps": [
            {k: r.get(k) for k in ("step", "rollout/groups", "time/step_s", "time/rollout_s")}
            for r in rows
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", required=True, help="takes_two | deep_research | gym | ...")
    parser.add_argument("--preset", default="learn", help="the recipe's preset (default learn)")
    parser.add_argument("--steps", type=int, default=5, help="steps per run (the first warms up)")
    parser.add_argument(
        "--over", type=int, default=None, help="rollout.over_sample (default: prompts_per_step)"
    )
    parser.add_argument(
        "--leftover",
        nargs="+",
        default=["carry", "abort"],
        choices=("carry", "abort"),
        help="the partial arms: rollout.leftover of each (default both)",
    )
    add_output_flags(parser)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step is a warm-up)")
    if not (ROOT / "recipes" / args.recipe / "presets" / f"{args.preset}.yaml").exists():
        parser.error(f"--recipe/--preset: no recipes/{args.recipe}/presets/{args.preset}.yaml")
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        full = run_arm(args.recipe, args.preset, args.steps, [], Path(tmp) / "full")
        config = json.loads((Path(tmp) / "full" / "config.json").read_text())
        over = args.over or int(config["data"]["prompts_per_step"])
        runs["full"] = full
        for leftover in args.leftover:
            partial = ["--rollout.over_sample", str(over), "--rollout.leftover", leftover]
            out = Path(tmp) / leftover
            runs[leftover] = run_arm(args.recipe, args.preset, args.steps, partial, out)
    for arm, r in runs.items():
        print(
            f"{arm:6s} {r['episodes_per_s']:6.3f} episodes/s  step {r['step_s']:6.1f} s "
            f"(rollout {r['rollout_s']:6.1f} s, train {r['train_s']:6.1f} s)  carried "
            f"{r['carried_groups']:.0f} groups (oldest {r['carried_age']:.0f} steps), "
            f"staleness {r['staleness']:.2f}, cancelled {r['cancelled_groups']:.0f} "
            f"({r['discarded_tokens']:.0f} tokens)  [{r['wall_s']:.0f} s]"
        )
    name = f"{args.recipe} --preset {args.preset}"
    record = stamp() | {"recipe": args.recipe, "preset": args.preset, "steps": args.steps}
    record |= {"over_sample": over, "runs": runs, "headline": {}}
    for leftover in args.leftover:
        ratio = runs[leftover]["episodes_per_s"] / runs["full"]["episodes_per_s"]
        step_ratio = runs[leftover]["step_s"] / runs["full"]["step_s"]
        print(
            f"{name}, over_sample {over} ({leftover}), steps 2..{args.steps}: partial ÷ full "
            f"{ratio:.2f}x episodes/s, step time {step_ratio:.2f}x"
        )
        record["headline"][f"{name} episodes/s, over_sample {leftover} ÷ full"] = ratio
    write_outputs(args, record)


if __name__ == "__main__":
    main()
