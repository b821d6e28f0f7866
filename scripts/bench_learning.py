"""Does it learn? One recipe's ``learn`` preset on a real model: the held-out score of the
starting weights, at most ``--minutes`` of training, the held-out score again with the same
sampling settings, and the difference with a 95% interval.

The run is a plain ``python -m kernel train --recipe R --preset learn`` with the evaluation of
the starting weights switched on (``--eval.at_start true``) and a time limit
(``--max_minutes``); flags after ``--`` go to it unchanged (a sweep: ``-- --optim.lr 1e-5``).
A recipe that needs a service (deep_research: the retriever) is launched by its ``run.sh``,
which starts the service and passes the same flags on. The held-out set is the preset's
``eval.path``, never trained on. Each evaluation writes one line per (held-out item, agent) to
``<out>/eval/step_<updates>.jsonl``; this script pairs the first and the last by item, so the
interval is a **paired bootstrap over held-out items** (``--resamples`` draws of the items
with replacement; the 2.5th and 97.5th percentiles of the mean difference). Two scores per
item: ``reward``, the mean of its episodes' rewards as the recipe scored them, and ``passed``,
the share of its episodes the recipe marked correct (accuracy; exact match; a diagnosis close
enough). Each recipe names the agent and score of its headline (``HEADLINES``; a preset may
name another: ``PRESET_HEADLINES``).

Prints before, after, difference and interval of both scores for every evaluated agent, steps
done, samples seen and wall time per phase (start-up, generate, reward, train, sync, eval);
writes ``<out>/learning.json`` (the headline's figures at the top level, every agent's under
``agents``, and the same statistics of every episode metric the recipe reports, e.g.
takes_two's facts revealed or deep_research's searches, under ``episode_metrics``) and the
curves PNG ``<out>/curves.png``. ``--report-only`` reports on a finished
run again without training. ``--against RUN`` also pairs the final held-out scores of this run
with those of RUN, an ablation on the same held-out set (takes_two co-trained against a frozen
patient), item by item (``learning.json["against"]``). Not run by CI (CI runs each ``learn``
preset for one step: tests/recipes/test_learn_presets.py).

Example: python scripts/bench_learning.py --recipe math_solver_verifier --minutes 45
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Headline:
    """The number a recipe's row in README's "Does it learn?" table reports."""

    agent: str  # whose held-out scores
    score: str  # "passed" (the share of items answered correctly) or "reward" (its mean)
    metric: str  # what they mean, in words
    run_sh: bool = False  # launched by the recipe's run.sh, which starts the services it needs


SCORES = ("reward", "passed")  # what an evaluated item's episodes are averaged into

HEADLINES = {
    "math_solver_verifier": Headline(
        "solver", "passed", "solver accuracy (boxed / 'the answer is' / last number, math-verify)"
    ),
    "takes_two": Headline(
        "doctor", "reward", "doctor reward (diagnosis + recommendation + information - penalties)"
    ),
    "deep_research": Headline("agent", "passed", "exact match of the final answer", run_sh=True),
    "debate": Headline("alice", "passed", "accuracy of the debate's majority verdict"),
    "code_pair": Headline(
        "main", "reward", "team reward (CoMLRL-style partial credit, 0..4; HumanEval checks)"
    ),
}

# presets whose headline differs from their recipe's
PRESET_HEADLINES = {
    ("math_solver_verifier", "learn_three_role"): Headline(
        "selector", "passed", "final-answer accuracy of solver -> rewriter -> selector"
    ),
}


def headline_of(recipe: str, preset: str) -> Headline:
    return PRESET_HEADLINES.get((recipe, preset), HEADLINES[recipe])


def paired_bootstrap(
    before: np.ndarray, after: np.ndarray, resamples: int, seed: int = 0
) -> tuple[float, float]:
    """95% interval of mean(after - before), resampling the paired items with replacement."""
    diff = np.asarray(after, float) - np.asarray(before, float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), size=(resamples, len(diff)))
    means = diff[idx].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def item_scores(path: Path, score: str) -> dict[str, dict[int, float]]:
    """agent -> held-out row -> the mean over its episodes of ``score``: the reward as the
    recipe scored it, or ``passed`` (1/0: the recipe's ``correct``, else reward >= threshold)."""
    out: dict[str, dict[int, float]] = {}
    for item in read_jsonl(path):
        values = [
            float(p if score == "passed" else r)
            for r, p in zip(item["rewards"], item["passed"], strict=True)
            if r is not None
        ]
        if values:
            out.setdefault(item["agent"], {})[item["row"]] = sum(values) / len(values)
    return out


def item_metrics(path: Path) -> dict[str, dict[str, dict[int, float]]]:
    """agent -> episode metric -> held-out row -> its mean over the row's episodes (the
    numbers the recipe put in ``metadata["metrics"]``; evaluation files without them give
    none)."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    for item in read_jsonl(path):
        episodes = item.get("metrics") or []
        for key in sorted({k for m in episodes for k in m}):
            values = [m[key] for m in episodes if key in m]
            out.setdefault(item["agent"], {}).setdefault(key, {})[item["row"]] = sum(values) / len(
                values
            )
    return out


def paired(before: dict[int, float], after: dict[int, float], resamples: int) -> dict | None:
    """n, before, after, diff, ci_low, ci_high over the rows both have (None: no such row)."""
    rows = sorted(set(before) & set(after))
    if not rows:
        return None
    b = np.array([before[r] for r in rows])
    a = np.array([after[r] for r in rows])
    low, high = paired_bootstrap(b, a, resamples)
    return {
        "n_eval": len(rows),
        "before": float(b.mean()),
        "after": float(a.mean()),
        "diff": float(a.mean() - b.mean()),
        "ci_low": low,
        "ci_high": high,
    }


def compare(
    before_path: Path, after_path: Path, resamples: int, score: str = "reward"
) -> dict[str, dict]:
    """Per agent: n, before, after, diff, ci_low, ci_high of ``score`` over the items both
    files scored."""
    before, after = item_scores(before_path, score), item_scores(after_path, score)
    out = {}
    for agent in sorted(set(before) & set(after)):
        stats = paired(before[agent], after[agent], resamples)
        if stats is not None:
            out[agent] = stats
    return out


def compare_metrics(before_path: Path, after_path: Path, resamples: int) -> dict[str, dict]:
    """Per agent and episode metric: the same statistics (``paired``)."""
    before, after = item_metrics(before_path), item_metrics(after_path)
    out: dict[str, dict] = {}
    for agent in sorted(set(before) & set(after)):
        for key in sorted(set(before[agent]) & set(after[agent])):
            stats = paired(before[agent][key], after[agent][key], resamples)
            if stats is not None:
                out.setdefault(agent, {})[key] = stats
    return out


def final_eval(out: Path, rows: list[dict]) -> tuple[int, Path]:
    """(steps done, the last held-out evaluation's file) of the finished run in ``out`` whose
    metrics rows are ``rows``; exits naming the file if the run did not finish."""
    steps = sum(1 for r in rows if r["step"] >= 0)
    last = out / "eval" / f"step_{steps}.jsonl"
    if not last.exists():
        sys.exit(f"bench_learning.py: {last} is missing: the run in {out} did not finish")
    return steps, last


def phases(rows: list[dict]) -> dict[str, float]:
    """Wall seconds per phase, summed over the run's metrics rows."""

    def total(key: str) -> float:
        return float(sum(r.get(key, 0.0) for r in rows))

    reward = total("rollout/reward_seconds")
    return {
        "startup": total("time/startup_s"),
        "generate": total("time/rollout_s") - reward,
        "reward": reward,
        "train": total("time/train_s"),
        "sync": total("time/sync_s"),
        "eval": total("time/eval_s"),
    }


def command(args: argparse.Namespace, extra: list[str]) -> str:
    """The command line that reproduces this run (as given, without --report-only)."""
    cmd = ["python", "scripts/bench_learning.py", "--recipe", args.recipe]
    cmd += ["--minutes", f"{args.minutes:g}", "--seed", str(args.seed)]
    cmd += [] if args.preset == "learn" else ["--preset", args.preset]
    cmd += ["--out", args.out] if args.out else []
    cmd += ["--against", args.against] if args.against else []
    return shlex.join(cmd + (["--", *extra] if extra else []))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        epilog="Flags after -- go to 'python -m kernel train' (e.g. -- --optim.lr 1e-5).",
    )
    p.add_argument("--recipe", required=True, choices=sorted(HEADLINES))
    p.add_argument("--minutes", type=float, default=45.0, help="training time limit")
    p.add_argument("--seed", type=int, default=0, help="the run's seed")
    p.add_argument("--preset", default="learn", help="the recipe's preset to train with")
    p.add_argument("--out", default=None, help="run folder (default runs/learning/R-sS)")
    p.add_argument("--resamples", type=int, default=10000, help="bootstrap resamples")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="do not train: report on the finished run already in --out",
    )
    p.add_argument(
        "--against",
        default=None,
        help="a finished run's folder (an ablation of this one, same held-out set): also "
        "compare the two runs' final held-out scores, paired by item (learning.json 'against')",
    )
    return p


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(this script's flags, the flags after ``--`` that go to 'python -m kernel train')."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]


def main(argv: list[str] | None = None) -> int:
    own, extra = split_argv(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    if args.minutes <= 0 or args.resamples < 100:
        sys.exit("bench_learning.py: --minutes must be > 0 and --resamples >= 100")
    preset = ROOT / "recipes" / args.recipe / "presets" / f"{args.preset}.yaml"
    if not preset.exists():
        sys.exit(f"bench_learning.py: {preset} does not exist (no '{args.preset}' preset)")
    out = Path(args.out or ROOT / "runs" / "learning" / f"{args.recipe}-s{args.seed}")
    flags = ["--seed", str(args.seed), "--max_minutes", str(args.minutes)]
    flags += ["--eval.at_start", "true", *extra]
    env = dict(os.environ)
    headline = headline_of(args.recipe, args.preset)
    if headline.run_sh:  # e.g. deep_research: the retriever first
        cmd = ["bash", f"recipes/{args.recipe}/run.sh", *flags]
        env |= {"MODE": "cpu", "PRESET": args.preset, "OUT": str(out), "PY": sys.executable}
        shown = f"MODE=cpu PRESET={args.preset} OUT={out} " + shlex.join(cmd)
    else:
        cmd = [sys.executable, "-m", "kernel", "train", "--recipe", args.recipe]
        cmd += ["--preset", args.preset, "--output_dir", str(out), *flags]
        shown = shlex.join(cmd)
    if not args.report_only:
        print("$ " + shown, flush=True)
        if subprocess.run(cmd, cwd=ROOT, env=env).returncode != 0:
            sys.exit(f"bench_learning.py: the training run failed (its logs: {out})")

    rows = read_jsonl(out / "metrics.jsonl")
    steps, last = final_eval(out, rows)
    first = out / "eval" / "step_0.jsonl"
    wall = last.stat().st_mtime - (out / "config.json").stat().st_mtime  # start-up to last eval
    results = {score: compare(first, last, args.resamples, score) for score in SCORES}
    if headline.agent not in results[headline.score]:
        sys.exit(f"bench_learning.py: no held-out scores of agent {headline.agent!r} in {out}/eval")
    config = json.loads((out / "config.json").read_text())
    samples = sum(v for r in rows for k, v in r.items() if k.endswith("/samples"))
    times = phases(rows)
    report = {
        "recipe": args.recipe,
        "model": config["model"],
        "metric": headline.metric,
        **results[headline.score][headline.agent],
        "minutes": round(wall / 60, 1),
        "steps": steps,
        "samples": int(samples),
        "seed": args.seed,
        "interval": f"95% paired bootstrap over held-out items ({args.resamples} resamples)",
        "eval_temperature": config["eval"]["temperature"],
        "agents": {
            agent: {score: results[score][agent] for score in SCORES if agent in results[score]}
            for agent in results["reward"]
        },
        "episode_metrics": compare_metrics(first, last, args.resamples),
        "phases_s": times,
        "command": command(args, extra),
    }
    if args.against:
        other = Path(args.against)
        _, other_last = final_eval(other, read_jsonl(other / "metrics.jsonl"))
        report["against"] = {
            "run": str(other),
            **{score: compare(other_last, last, args.resamples, score) for score in SCORES},
            "episode_metrics": compare_metrics(other_last, last, args.resamples),
        }
    (out / "learning.json").write_text(json.dumps(report, indent=1) + "\n")
    from kernel.plot import plot_metrics

    png = plot_metrics(out / "metrics.jsonl", out / "curves.png")

    print(f"\n{args.recipe} on {config['model']}: {headline.metric}")
    head = ("agent", "score", "n", "before", "after", "diff")
    print("{:<12} {:<7} {:>5} {:>8} {:>8} {:>8}  95% interval".format(*head))
    for agent, scores in report["agents"].items():
        for score, r in scores.items():
            mark = " *" if (agent, score) == (headline.agent, headline.score) else ""
            print(f"{agent + mark:<12} {score:<7} " + _figures(r))
    _print_episode_metrics(report["episode_metrics"])
    print(f"(* headline; interval: {report['interval']})")
    if args.against:
        vs = report["against"]
        print(f"\nfinal held-out scores, {vs['run']} ('before') against this run ('after'):")
        for score in SCORES:
            for agent, r in vs[score].items():
                print(f"{agent:<12} {score:<7} " + _figures(r))
        _print_episode_metrics(vs["episode_metrics"])
    print(f"steps {steps}, samples seen {int(samples)}, wall {wall / 60:.1f} min")
    print("phases (s): " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()))
    print(f"wrote {out / 'learning.json'} and {png}")
    print("README row:\n" + readme_row(report))
    return 0


def _figures(r: dict) -> str:
    """n, before, after, difference and interval of one comparison, as a printed row's end."""
    return (
        f"{r['n_eval']:>5} {r['before']:>8.3f} {r['after']:>8.3f} {r['diff']:>+8.3f}  "
        f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"
    )


def _print_episode_metrics(by_agent: dict[str, dict[str, dict]]) -> None:
    """One printed row per agent and episode metric (``compare_metrics``' statistics)."""
    for agent, metrics in by_agent.items():
        for key, r in metrics.items():
            print(f"{agent:<12} {key[:24]:<24} " + _figures(r))


def readme_row(r: dict) -> str:
    """The report as a row of README's "Does it learn?" table."""
    cells = [
        r["recipe"],
        r["model"],
        r["metric"],
        f"{r['n_eval']}",
        f"{r['before']:.3f}",
        f"{r['after']:.3f}",
        f"{r['diff']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]",
        f"{r['minutes']:.0f} ({r['steps']} steps)",
        f"`{r['command']}`",
    ]
    return "| " + " | ".join(cells) + " |"


if __name__ == "__main__":
    raise SystemExit(main())
