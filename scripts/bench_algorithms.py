"""The algorithms table of docs/reference.md, measured: every advantage estimator (and each
loss or schedule switch the reference gives a figure for) trains the toy tasks for a fixed
number of steps on several seeds, and the figures the table shows come from those runs' files.

Each (row, seed) is a plain ``python -m kernel train --preset P --seed S --num_steps N FLAGS``
into ``<out>/<row>/seed<S>``, one after another (one model-loading process at a time); a run
that already finished is kept, so an interrupted call resumes. From each run's metrics.jsonl:
every agent's sampled training reward, averaged over the first and over the last 5 steps
(the toy tasks have no held-out set: this is a check that the algorithm learns the toy, not a
skill result); for some rows also the agents' reply length (first → last 5 steps) and the
largest PPO clip fraction of any step. ``--publish`` keeps the figures as
``docs/results/algorithms/algorithms.json`` (with the commit, the machine and every run's
command) and each run's metrics (gzipped) beside it; ``scripts/results_table.py`` writes the
``<!-- results:algorithms -->`` table from that file.

    python scripts/bench_algorithms.py --publish             # every row, 3 seeds (~25 min, 2 cores)
    python scripts/bench_algorithms.py --only grpo gae_toy   # some rows
    python scripts/bench_algorithms.py --list                # the rows and their commands
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from scripts.bench_learning import gzip_copy, read_jsonl  # noqa: E402
from scripts.provenance import commit, stamp  # noqa: E402

PUBLISHED = ROOT / "docs" / "results" / "algorithms"
WINDOW = 5  # steps averaged at each end


@dataclass(frozen=True)
class Row:
    name: str
    preset: str
    flags: tuple[str, ...] = ()
    steps: int = 50
    length: bool = False  # also the reply length, first -> last 5 steps
    clipfrac: bool = False  # also the largest PPO clip fraction of any step

    def command(self, seed: int, out: Path) -> list[str]:
        cmd = [sys.executable, "-m", "kernel", "train", "--preset", self.preset]
        cmd += ["--seed", str(seed), "--num_steps", str(self.steps), "--output_dir", str(out)]
        return cmd + list(self.flags)

    def shown(self) -> str:
        """The flags a reader gives ``python -m kernel train`` (seed and folder: defaults)."""
        return shlex.join(["--preset", self.preset, "--num_steps", str(self.steps), *self.flags])


def _est(name: str, *more: str) -> tuple[str, ...]:
    return ("--advantage.estimator", name, *more)


GAE = _est("gae", "--critic.lr", "0.002")
DAPO = ("--loss.clip_high", "0.28", "--dynamic_sampling", "true")
OVERLONG = ("--reward.overlong_buffer_len", "4", "--reward.overlong_max_len", "8")
OVERLONG += ("--reward.overlong_penalty", "0.5")
FROZEN_PATIENT = json.dumps(
    [
        {"name": "doctor", "model": "tiny-char"},
        {"name": "patient", "model": "tiny-char", "trainable": False},
    ]
)
ROWS = (
    Row("grpo", "toy", clipfrac=True),
    Row("dr_grpo", "toy", _est("dr_grpo")),
    Row("rloo", "toy", _est("rloo")),
    Row("reinforce_pp", "toy", _est("reinforce_pp")),
    Row("reinforce_pp_baseline", "toy", _est("reinforce_pp_baseline")),
    Row("grpo_duo", "toy_duo", (), 40, clipfrac=True),
    Row("grpo_duo_frozen_patient", "toy_duo", ("--agents", FROZEN_PATIENT), 40),
    Row("magrpo", "toy_duo", _est("magrpo"), 40),
    Row("marloo", "toy_duo", _est("marloo"), 40),
    Row("mareinforce", "toy_duo", _est("mareinforce"), 40),
    Row("maremax", "toy_duo", _est("maremax"), 40),
    Row("joint_cross", "toy_duo", ("--reward.joint_mode", "cross", *_est("grpo")), 40),
    Row("gigpo", "toy_steps", (), 40),
    Row("grpo_steps", "toy_steps", _est("grpo"), 40),
    Row("gae_toy", "toy", GAE, 40),
    Row("gae_shared", "toy", (*GAE, "--critic.shared", "true"), 40),
    Row("gae_duo", "toy_duo", GAE, 40),
    Row("mappo", "toy_duo", (*GAE, "--critic.centralized", "true"), 40),
    Row("maac", "toy_duo", (*GAE, "--critic.scope", "run", "--critic.centralized", "true"), 40),
    Row("dapo", "toy", DAPO, length=True),
    Row("dapo_overlong", "toy", (*OVERLONG, *DAPO), length=True),
    Row("ppo_epochs2", "toy", ("--trainer.ppo_epochs", "2"), clipfrac=True),
    Row("ppo_epochs2_duo", "toy_duo", ("--trainer.ppo_epochs", "2"), 40, clipfrac=True),
)
BY_NAME = {r.name: r for r in ROWS}


def read_metrics(path: Path) -> list[dict]:
    """The training steps' rows of a run's metrics.jsonl (or .jsonl.gz), in step order (a step
    logged twice, by a resumed run: its last row)."""
    steps = {r["step"]: r for r in read_jsonl(path) if r.get("step", -1) >= 0}
    return [steps[k] for k in sorted(steps)]


def agents_of(rows: list[dict]) -> list[str]:
    """The agents that report a reward (``<agent>/reward``), in the order the run logs them."""
    seen: dict[str, None] = {}
    for r in rows:
        for k in r:
            head, _, tail = k.rpartition("/")
            if tail == "reward" and head and "/" not in head:
                seen[head] = None
    return list(seen)


def _ends(rows: list[dict], key: str) -> tuple[float, float]:
    values = [r[key] for r in rows if r.get(key) is not None]
    if len(values) < 2 * WINDOW:
        raise ValueError(f"{key}: {len(values)} steps report it, {2 * WINDOW} needed")
    return float(np.mean(values[:WINDOW])), float(np.mean(values[-WINDOW:]))


def figures(row: Row, rows: list[dict]) -> dict:
    """One run's figures: per agent the reward (first, last) and, as the row asks, the reply
    length (first, last) and the largest clip fraction."""
    agents = agents_of(rows)
    out: dict = {"reward": {a: _ends(rows, f"{a}/reward") for a in agents}}
    if row.length:
        out["length"] = {a: _ends(rows, f"{a}/response_length") for a in agents}
    if row.clipfrac:
        single = "train/clipfrac" in rows[0]
        keys = {a: "train/clipfrac" if single else f"train/{a}/clipfrac" for a in agents}
        out["clipfrac_max"] = {a: max(r.get(k) or 0.0 for r in rows) for a, k in keys.items()}
    return out


def run_seed(row: Row, seed: int, out: Path) -> Path:
    """Train one (row, seed) into ``out`` unless it finished before; its metrics file."""
    metrics = out / "metrics.jsonl"
    if metrics.exists() and len(read_metrics(metrics)) == row.steps:
        print(f"{row.name} seed {seed}: finished before in {out}, kept", flush=True)
        return metrics
    cmd = row.command(seed, out)
    print(f"{row.name} seed {seed}: $ {shlex.join(cmd)}", flush=True)
    log = out.parent / f"seed{seed}.log"
    out.mkdir(parents=True, exist_ok=True)
    (out / "commit.txt").write_text(commit() + "\n")  # what trained, whatever changes later
    with log.open("w") as f:
        if subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
            sys.exit(f"bench_algorithms.py: {row.name} seed {seed} failed; its log: {log}")
    return metrics


def summarize(row: Row, per_seed: list[dict], seeds: list[int], commits: list[str]) -> dict:
    """A row's record: its command, the commits its runs trained at, and each figure per seed
    and as the mean over seeds."""
    record: dict = {"name": row.name, "command": row.shown(), "steps": row.steps, "seeds": seeds}
    record["commits"] = sorted(set(commits))
    for kind in per_seed[0]:
        record[kind] = {}
        for agent, first in per_seed[0][kind].items():
            values = [s[kind][agent] for s in per_seed]
            if isinstance(first, tuple):
                record[kind][agent] = {
                    "first": float(np.mean([v[0] for v in values])),
                    "last": float(np.mean([v[1] for v in values])),
                    "last_per_seed": [v[1] for v in values],
                }
            else:
                record[kind][agent] = {"max": max(values), "per_seed": values}
    return record


def format_row(record: dict) -> str:
    """One line for the terminal: each agent's reward first -> last (mean over seeds)."""
    parts = [
        f"{a} {v['first']:.2f} -> {v['last']:.2f}"
        f" (seeds {', '.join(f'{x:.2f}' for x in v['last_per_seed'])})"
        for a, v in record["reward"].items()
    ]
    return f"{record['name']:<24} " + "; ".join(parts)


def publish(records: list[dict], out: Path) -> Path:
    """Keep the figures and every run's metrics (gzipped) in docs/results/algorithms/."""
    PUBLISHED.mkdir(parents=True, exist_ok=True)
    for record in records:
        for seed in record["seeds"]:
            src = out / record["name"] / f"seed{seed}" / "metrics.jsonl"
            dest = PUBLISHED / record["name"] / f"seed{seed}" / "metrics.jsonl.gz"
            dest.parent.mkdir(parents=True, exist_ok=True)
            gzip_copy(src, dest)
    path = PUBLISHED / "algorithms.json"
    old = json.loads(path.read_text()) if path.exists() else {"rows": []}
    kept = [r for r in old["rows"] if r["name"] not in {x["name"] for x in records}]
    rows = sorted(kept + records, key=lambda r: list(BY_NAME).index(r["name"]))
    head = stamp() | {"commit": ", ".join(sorted({c for r in rows for c in r["commits"]}))}
    path.write_text(json.dumps({**head, "window": WINDOW, "rows": rows}, indent=1) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--only", nargs="+", choices=list(BY_NAME), help="these rows (default: all)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per row: 0, 1, ... (default 3)")
    p.add_argument("--steps", type=int, default=None, help="override every row's steps")
    p.add_argument("--out", default="runs/algorithms", help="run folders (default %(default)s)")
    p.add_argument("--list", action="store_true", help="print the rows' commands and stop")
    p.add_argument(
        "--publish",
        action="store_true",
        help="keep the figures and metrics in docs/results/algorithms/ (the reference's table)",
    )
    args = p.parse_args(argv)
    rows = [BY_NAME[n] for n in args.only] if args.only else list(ROWS)
    if args.steps is not None:
        if args.steps < 2 * WINDOW:
            p.error(f"--steps {args.steps}: at least {2 * WINDOW} (first and last {WINDOW})")
        if args.publish:
            p.error("--steps with --publish: the published table is each row's own steps")
        rows = [replace(r, steps=args.steps) for r in rows]
    if args.list:
        for r in rows:
            print(f"{r.name:<24} python -m kernel train {r.shown()}")
        return 0
    out = Path(args.out)
    seeds = list(range(args.seeds))
    records = []
    for row in rows:
        per_seed, commits = [], []
        for seed in seeds:
            metrics = run_seed(row, seed, out / row.name / f"seed{seed}")
            per_seed.append(figures(row, read_metrics(metrics)))
            commits.append((metrics.parent / "commit.txt").read_text().strip())
        records.append(summarize(row, per_seed, seeds, commits))
        print(format_row(records[-1]), flush=True)
    if args.publish:
        dirty = [r["name"] for r in records if any("+dirty" in c for c in r["commits"])]
        if dirty:
            sys.exit(f"bench_algorithms.py: not published: {dirty} trained on uncommitted code")
        print(f"published {publish(records, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
