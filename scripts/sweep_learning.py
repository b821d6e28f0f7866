"""A learning-rate and warm-up sweep: one short ``scripts/bench_learning.py`` run per (lr,
warm-up) pair, then a table of their held-out gains side by side.

Every run starts from the same weights, with the same seed (the same training prompts in the
same order) and the same held-out set, so the runs differ only in ``--optim.lr`` and
``--optim.warmup_steps``; each run's "before" is the same greedy evaluation, and its gain has
the paired-bootstrap interval bench_learning.py reports. A run folder that already holds a
``learning.json`` is not run again, so an interrupted sweep resumes, and a grid can be widened
later with the same ``--out``: the table holds every finished run in ``--out``, this call's and
earlier ones'. Prints the table (markdown, for the README) and writes ``<out>/sweep.json`` and
``<out>/sweep.png`` (each run's sampled training reward of the recipe's headline agent per
step).

A short budget ranks learning rates for that budget: the best lr for 12 steps need not be the
best for 60 (a larger one wins early and may overshoot later). Say the budget with the table.
Every run is one seed (``--seed``); rerun the chosen cell with bench_learning.py ``--seeds 3``
before publishing it.

Example:
  python scripts/sweep_learning.py --recipe math_solver_verifier --lr 5e-6 1e-5 2e-5 4e-5 \\
      --warmup 0 --steps 12 -- --eval.max_prompts 128
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _bench_learning():
    """scripts/bench_learning.py as a module (its HEADLINES)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_learning

    return bench_learning


def run_name(lr: float, warmup: int) -> str:
    return f"lr{lr:g}-w{warmup}"


def commands(args: argparse.Namespace, out: Path, extra: list[str]) -> list[tuple[Path, list[str]]]:
    """(run folder in ``out``, bench_learning.py command) for every (lr, warm-up) pair."""
    runs = []
    for lr in args.lr:
        for warmup in args.warmup:
            folder = out / run_name(lr, warmup)
            cmd = [sys.executable, "scripts/bench_learning.py", "--recipe", args.recipe]
            cmd += ["--steps", str(args.steps), "--seed", str(args.seed)]
            cmd += ["--minutes", f"{args.minutes:g}"] if args.minutes else []
            cmd += ["--preset", args.preset, "--out", str(folder), "--"]
            cmd += ["--optim.lr", f"{lr:g}", "--optim.warmup_steps", str(warmup), *extra]
            runs.append((folder, cmd))
    return runs


def table(out: Path) -> list[dict]:
    """One row per finished run in the sweep folder ``out`` (its learning.json plus the lr and
    warm-up it trained with, read from its config.json), by lr then warm-up: the runs of this
    call's grid and of earlier ones with the same ``--out``."""
    rows = []
    for report in sorted(out.glob("*/learning.json")):
        r = json.loads(report.read_text())
        config = next(report.parent.glob("seed*/config.json"))
        optim = json.loads(config.read_text())["optim"]
        rows.append(
            {"run": report.parent.name, "lr": optim["lr"], "warmup": optim["warmup_steps"], **r}
        )
    return sorted(rows, key=lambda r: (r["lr"], r["warmup"]))


def markdown(rows: list[dict]) -> str:
    """The sweep as a README table; the row with the largest gain is in bold."""
    best = max(range(len(rows)), key=lambda i: rows[i]["diff"])
    lines = [
        "| lr | warm-up steps | steps | before | after | difference [95% interval] | minutes |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows):
        cells = [
            f"{r['lr']:g}",
            str(r["warmup"]),
            str(r["steps"]),
            f"{r['before']:.3f}",
            f"{r['after']:.3f}",
            f"{r['diff']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]",
            f"{r['minutes']:.0f}",
        ]
        if i == best:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        epilog="Flags after -- go to every run's 'python -m kernel train' "
        "(e.g. -- --eval.max_prompts 128).",
    )
    p.add_argument("--recipe", required=True, help="a recipe with a learn preset")
    p.add_argument("--lr", type=float, nargs="+", required=True, help="learning rates to try")
    p.add_argument("--warmup", type=int, nargs="+", default=[0], help="warm-up steps to try")
    p.add_argument("--steps", type=int, required=True, help="training steps per run")
    p.add_argument("--minutes", type=float, default=None, help="safety cap on a run's minutes")
    p.add_argument("--seed", type=int, default=0, help="every run's seed")
    p.add_argument("--preset", default="learn", help="the recipe's preset to train with")
    p.add_argument("--out", default=None, help="sweep folder (default runs/sweep/<recipe>)")
    p.add_argument(
        "--dry-run", action="store_true", help="print the runs' commands and run nothing"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    bench = _bench_learning()
    own, extra = bench.split_argv(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    if args.recipe not in bench.HEADLINES:
        sys.exit(f"sweep_learning.py: --recipe must be one of {sorted(bench.HEADLINES)}")
    bad = [f"--lr {x:g}" for x in args.lr if not x > 0] + [
        f"--warmup {w}" for w in args.warmup if w < 0
    ]
    if bad or args.steps < 1 or (args.minutes is not None and args.minutes <= 0):
        sys.exit(f"sweep_learning.py: need lr > 0, warm-up >= 0, steps >= 1, minutes > 0; {bad}")
    for flag in ("--optim.lr", "--optim.warmup_steps"):
        if any(x.split("=")[0] == flag for x in extra):
            sys.exit(f"sweep_learning.py: {flag} is what the sweep sets; pass it as --lr/--warmup")
    # absolute: the runs start in the repository root, wherever this was called from
    out = Path(args.out).resolve() if args.out else ROOT / "runs" / "sweep" / args.recipe
    runs = commands(args, out, extra)
    for i, (folder, cmd) in enumerate(runs, 1):
        shown = shlex.join(["python", *cmd[1:]])
        if args.dry_run:
            print(shown)
        elif (folder / "learning.json").exists():
            print(f"[{i}/{len(runs)}] {folder.name}: done before, kept", flush=True)
        else:
            print(f"[{i}/{len(runs)}] {folder.name}: $ {shown}", flush=True)
            if subprocess.run(cmd, cwd=ROOT).returncode != 0:
                sys.exit(f"sweep_learning.py: run {folder} failed (its logs are there)")
    if args.dry_run:
        return 0

    rows = table(out)
    (out / "sweep.json").write_text(json.dumps(rows, indent=1) + "\n")
    from kernel.plot import compare_runs

    agent = bench.headline_of(args.recipe, args.preset).agent
    runs_in = [next((out / r["run"]).glob("seed*/metrics.jsonl")) for r in rows]
    png = compare_runs(runs_in, [f"{agent}/reward"], out / "sweep.png")
    print(f"\n{args.recipe}: {rows[0]['metric']}, {args.steps} steps a run, seed {args.seed}")
    print(markdown(rows))
    print(f"wrote {out / 'sweep.json'} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
