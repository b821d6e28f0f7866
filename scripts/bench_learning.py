"""Does it learn? One recipe's ``learn`` preset on a real model, for a fixed number of steps and
several seeds: the held-out scores of the starting weights, ``--steps`` updates, the held-out
scores again with the same sampling settings, and the difference with a 95% interval that
covers both seeds and held-out items.

Each seed is a plain ``python -m kernel train --recipe R --preset P --num_steps N --seed S``
with the evaluation of the starting weights switched on (``--eval.at_start true``), in
``<out>/seed<S>``; seeds run one after another (one model-loading process at a time) and a
seed whose run already finished is kept, so an interrupted call resumes: a seed cut short goes
on from its last checkpoint (every ``--save-every`` steps), and its ``commit.txt`` adds the step
and the commit it resumed at. ``--minutes`` is only
a safety cap per seed: a seed it stops early is reported as such (``capped``), since its step
count then depends on the machine's load. Flags after ``--`` go to every run unchanged (``--
--optim.lr 1e-5``). A recipe that needs a service (deep_research: the retriever) is launched
by its ``run.sh``, which starts the service and passes the same flags on.

The held-out set is the preset's ``eval.path``, never trained on (tests/recipes/
test_data_leaks.py checks every shipped split by each recipe's ``canonical_key``). Each
evaluation writes one line per (held-out item, agent) to ``eval/step_<updates>.jsonl``. Every
score is a mean per item over its episodes: ``reward`` as the recipe scored it, ``passed`` (the
recipe's ``correct``: a right numeric answer, an exact match, all checks passing), and each
episode metric the recipe reports (takes_two's ``diagnosis_correct``, deep_research's ``f1``).
A recipe's headline (``HEADLINES``, or ``PRESET_HEADLINES`` for a preset) is a skill score;
the composite reward and format terms are shown ``beside`` it, never instead of it.

The interval is a **two-level (crossed) bootstrap**: each of ``--resamples`` draws resamples
the seeds with replacement and, once for all of them, the held-out items (every seed is scored
on the same items, so an item's difficulty is shared by the seeds and is resampled as one);
the 2.5th and 97.5th percentiles of the mean difference. Each seed also gets its own paired
item bootstrap. ``--against RUN`` compares this run's final scores with another finished
bench_learning run on the same held-out set (an ablation, or a single-agent baseline), item by
item, with the same two-level bootstrap over both runs' seeds (``learning.json["against"]``).

Writes ``<out>/learning.json`` (headline figures at the top level; ``per_seed`` rows; every
agent's scores under ``agents``; the headline per held-out subset under ``subsets``; generated
tokens per step; phases; the command, commit and machine) and each seed's ``curves.png``.
``--publish NAME`` copies the report, each seed's config, metrics and first and last
evaluation files (gzipped) and curves into ``docs/results/NAME/``, where
``scripts/results_table.py`` builds the docs' tables from them. ``--report-only`` reports on
the finished seeds again without training (while another seed trains, too). Not run by CI
(CI runs each ``learn`` preset for one step: tests/recipes/test_learn_presets.py).

Example: python scripts/bench_learning.py --recipe math_solver_verifier --steps 60 --seeds 3
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from kernel.run.results import (  # noqa: E402  (a run's files: kernel/run/results.py)
    SeedRun,
    plain_or_gzipped,
    read_jsonl,
    read_seeds,
    seed_dirs,
)
from scripts.controls import ANSWERS, controls, leak_free_rows, vote_scores  # noqa: E402
from scripts.provenance import commit  # noqa: E402
from scripts.rescore import rescorer, turns  # noqa: E402

RESULTS = ROOT / "docs" / "results"


@dataclass(frozen=True)
class Headline:
    """The skill a recipe's row in the results tables reports, and what stands beside it."""

    agent: str  # whose held-out scores
    score: str  # "passed", "reward" or an episode metric of the agent (e.g. diagnosis_correct)
    metric: str  # what it means, in words
    beside: tuple[str, ...] = ("reward",)  # the composite reward, format terms: own columns
    subset: str | None = None  # a held-out row field the headline is also reported by
    run_sh: bool = False  # launched by the recipe's run.sh, which starts the services it needs


HEADLINES = {
    "math_solver_verifier": Headline(
        "solver",
        "passed",
        "correct numeric answers (a number, not an expression; math-verify)",
        beside=("reward", "answered"),
    ),
    "takes_two": Headline(
        "doctor",
        "diagnosis_correct",
        "correct single diagnoses (synonym table)",
        beside=("reward", "questions_asked"),
        subset="unseen_condition",
    ),
    "deep_research": Headline(
        "agent",
        "passed",
        "exact match of the final answer",
        beside=("f1", "gold_in_answer", "reward"),
        run_sh=True,
    ),
    "debate": Headline("alice", "passed", "accuracy of the debate's majority verdict"),
    "code_pair": Headline("main", "passed", "HumanEval problems with every check passing"),
    "gym": Headline(
        "default",
        "passed",
        "right answers (the environment's checker)",
        beside=("reward", "tools/calls_calculator", "tools/no_tag"),
        subset="env",
    ),
}

# presets whose headline differs from their recipe's
PRESET_HEADLINES = {
    ("math_solver_verifier", "learn_three_role"): Headline(
        "selector",
        "passed",
        "correct final answers of solver -> rewriter -> selector",
        beside=("reward", "solver_accuracy", "selector_format_ok"),
    ),
    ("math_solver_verifier", "learn_select"): Headline(
        "selector",
        "passed",
        "correct final answers of 2 solvers -> selector",
        beside=("reward", "solver_accuracy", "selector_format_ok"),
    ),
    ("deep_research", "learn_solo"): Headline(
        "agent",
        "passed",
        "exact match of one agent searching alone",
        beside=("f1", "gold_in_answer", "reward"),
        run_sh=True,
    ),
    ("debate", "learn_single"): Headline(
        "alice", "passed", "accuracy of one agent answering alone"
    ),
    ("math_solver_verifier", "learn_verifier"): Headline(
        "solver",
        "passed",
        "correct final answers of the solver <-> verifier loop",
        beside=("reward", "approved_correct", "turns"),
    ),
}


def headline_of(recipe: str, preset: str) -> Headline:
    return PRESET_HEADLINES.get((recipe, preset), HEADLINES[recipe])


# ---- statistics -----------------------------------------------------------------------------


def paired_bootstrap(
    before: np.ndarray, after: np.ndarray, resamples: int, seed: int = 0
) -> tuple[float, float]:
    """95% interval of mean(after - before), resampling the paired items with replacement."""
    diff = np.asarray(after, float) - np.asarray(before, float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), size=(resamples, len(diff)))
    means = diff[idx].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def crossed_bootstrap(
    a: np.ndarray, b: np.ndarray | None, resamples: int, seed: int = 0
) -> tuple[float, float]:
    """95% interval of mean(a) - mean(b) (of mean(a) when ``b`` is None), where ``a`` and ``b``
    are (seeds, items) arrays over the same held-out items: each draw resamples the items once
    for every seed of both arrays and the seeds of each array on their own."""
    rng = np.random.default_rng(seed)
    n = a.shape[1]
    items = rng.integers(0, n, size=(resamples, n))  # (R, n)

    def draw(x: np.ndarray) -> np.ndarray:
        per_seed = x[:, items].mean(axis=-1)  # (K, R): each seed's mean over the drawn items
        seeds = rng.integers(0, x.shape[0], size=(resamples, x.shape[0]))  # (R, K)
        return per_seed[seeds, np.arange(resamples)[:, None]].mean(axis=1)  # (R,)

    means = draw(np.asarray(a, float))
    if b is not None:
        means = means - draw(np.asarray(b, float))
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


Scores = dict[str, dict[str, dict[int, float]]]  # agent -> score -> held-out row -> value


def item_scores(
    source: Path | list[dict], rescore: Callable[[list[dict]], None] | None = None
) -> Scores:
    """agent -> score -> held-out row -> the mean over the row's scored episodes, for the scores
    ``reward`` (as the recipe scored it), ``passed`` (1/0: the recipe's ``correct``, else reward
    >= threshold) and every episode metric the recipe put in ``metadata["metrics"]`` (over the
    episodes that report it). An episode whose reward is None (masked) counts in none.
    ``source``: an evaluation file, or its lines as read. ``rescore`` (scripts/rescore.py)
    scores the replies again first: ``passed`` is then today's, and ``passed_as_run`` what the
    run logged."""
    out: Scores = {}
    lines = read_jsonl(source) if isinstance(source, Path) else source
    if rescore is not None:
        rescore(lines)
    for item in lines:
        rewards = item.get("rewards") or []
        passed = item.get("passed") or [None] * len(rewards)
        as_run = item.get("passed_as_run")
        metrics = item.get("metrics") or [{}] * len(rewards)
        kept = [i for i, r in enumerate(rewards) if r is not None]
        values: dict[str, list[float]] = {"reward": [], "passed": []}
        for i in kept:
            values["reward"].append(float(rewards[i]))
            values["passed"].append(float(passed[i]))
            if as_run is not None:
                values.setdefault("passed_as_run", []).append(float(as_run[i]))
            for key, v in (metrics[i] if i < len(metrics) else {}).items():
                if v is not None:
                    values.setdefault(key, []).append(float(v))
        means = {key: sum(vs) / len(vs) for key, vs in values.items() if vs}
        for key, mean in means.items():
            out.setdefault(item["agent"], {}).setdefault(key, {})[item["row"]] = mean
    return out


Maps = list[dict[int, float]]  # one held-out row -> value map per seed


def _stats(before: Maps, after: Maps, resamples: int, rows, paired_seeds: bool) -> dict | None:
    """n, before, after, diff, ci_low, ci_high of one score over the rows every map has (and in
    ``rows``, when given); None when there are none. ``paired_seeds``: before and after are
    the same seeds' first and last evaluations (the interval resamples their differences);
    else two runs' seeds, resampled on their own."""
    common = set.intersection(*(set(m) for m in before + after))
    keep = sorted(common & set(rows) if rows is not None else common)
    if not keep:
        return None
    b = np.array([[m[r] for r in keep] for m in before])  # (seeds, items)
    a = np.array([[m[r] for r in keep] for m in after])
    low, high = (
        crossed_bootstrap(a - b, None, resamples)
        if paired_seeds
        else crossed_bootstrap(a, b, resamples)
    )
    return {
        "n_eval": len(keep),
        "before": float(b.mean()),
        "after": float(a.mean()),
        "diff": float(a.mean() - b.mean()),
        "ci_low": low,
        "ci_high": high,
    }


def pooled(before: Maps, after: Maps, resamples: int, rows: list[int] | None = None) -> dict | None:
    """Before and after training, over the seeds (each seed's first and last evaluation)."""
    return _stats(before, after, resamples, rows, paired_seeds=True)


def between(base: Maps, run: Maps, resamples: int) -> dict | None:
    """``run``'s final scores (after) against ``base``'s (before), two runs on the same items:
    items drawn once for both, each run's seeds on their own."""
    return _stats(base, run, resamples, None, paired_seeds=False)


def compare_all(before: list[Scores], after: list[Scores], resamples: int, fn) -> dict:
    """agent -> score -> ``fn(before maps, after maps, resamples)`` for every (agent, score)
    that all seeds' files of both sides have."""
    out: dict[str, dict] = {}
    agents = set.intersection(*(set(s) for s in before + after))
    for agent in sorted(agents):
        keys = set.intersection(*(set(s[agent]) for s in before + after))
        for key in sorted(keys):
            stats = fn([s[agent][key] for s in before], [s[agent][key] for s in after], resamples)
            if stats is not None:
                out.setdefault(agent, {})[key] = stats
    return out


# ---- a seed's replies, scored today (its files are read by kernel/run/results.py) -----------


_RESCORERS: dict[Path, tuple[dict, Callable[[list[dict]], None] | None]] = {}


def rescorer_of(run: SeedRun) -> Callable[[list[dict]], None] | None:
    """Today's scorer of a seed's replies (scripts/rescore.py), None where it did not change;
    built once per seed folder (again if its config differs)."""
    cached = _RESCORERS.get(run.path)
    if cached is None or cached[0] != run.config:
        cached = _RESCORERS[run.path] = (run.config, rescorer(run.config, run.held_out))
    return cached[1]


def rescored_lines(run: SeedRun, path: Path) -> list[dict]:
    """One of a seed's evaluation files, its replies scored by today's scorers."""
    lines = read_jsonl(path)
    if (rescore := rescorer_of(run)) is not None:
        rescore(lines)
    return lines


def run_scores(run: SeedRun, path: Path) -> Scores:
    """``item_scores`` of one of a seed's evaluation files, scored by today's scorers."""
    return item_scores(rescored_lines(run, path))


def trained_at(run: SeedRun) -> list[str]:
    """Every commit a seed trained at (its commit.txt), else the checked-out one."""
    return run.commits or [commit()]


def held_out_field(config: dict, field: str) -> dict[int, object]:
    """held-out row -> its ``field`` in the run's eval file (rows without it are left out)."""
    path = Path(config["eval"]["path"])
    path = path if path.is_absolute() else ROOT / path
    if not path.exists():
        return {}
    return {i: r[field] for i, r in enumerate(read_jsonl(path)) if field in r}


# ---- the report -----------------------------------------------------------------------------


def machine() -> str:
    import torch

    return (
        f"{platform.machine()} {os.cpu_count()} cores, {platform.system()}, Python "
        f"{platform.python_version()}, torch {torch.__version__}, "
        f"{'cuda ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}"
    )


def report(
    runs: list[SeedRun], recipe: str, preset: str, resamples: int, command_line: str
) -> dict:
    """The learning report of finished seed runs (the same preset and steps)."""
    headline = headline_of(recipe, preset)
    before = [run_scores(r, r.first) for r in runs]
    after = [run_scores(r, r.last) for r in runs]
    agents = compare_all(before, after, resamples, pooled)
    mine = agents.get(headline.agent, {})
    if headline.score not in mine:
        sys.exit(
            f"bench_learning.py: no held-out '{headline.score}' of agent {headline.agent!r} in "
            f"{[str(r.last) for r in runs]}"
        )
    per_seed = []
    for r, b, a in zip(runs, before, after, strict=True):
        stats = pooled(
            [b[headline.agent][headline.score]], [a[headline.agent][headline.score]], resamples
        )
        per_seed.append(
            {
                "seed": r.seed,
                **stats,
                "steps": r.steps,
                "minutes": round(r.minutes(), 1),
                "samples": r.samples(),
                "tokens_per_step": round(r.tokens_per_step(), 1),
            }
            | ({"resumed": r.resumed} if r.resumed else {})
        )
    final = [a[headline.agent][headline.score] for a in after]
    measured = {}  # control -> this run's final scores against it
    finals = [rescored_lines(r, r.last) for r in runs]
    for name, maps in controls(recipe, preset, runs[0].config, finals).items():
        if (stats := between(maps, final, resamples)) is not None:
            measured[name] = stats
    best = max(measured, key=lambda k: (measured[k]["before"], k), default=None)
    vote = None
    if (k := vote_k(runs, recipe)) is not None:
        votes = [vote_scores(r.votes[k], headline.agent, ANSWERS[recipe]) for r in runs]
        vote = {"k": k, **pooled(final, votes, resamples)}
    subsets = {}
    if (clean := leak_free_rows(recipe, runs[0].config)) is not None:
        subsets["leak-free"] = pooled(
            [b[headline.agent][headline.score] for b in before], final, resamples, clean
        )
    if headline.subset:
        field = held_out_field(runs[0].config, headline.subset)
        for value in sorted({json.dumps(v) for v in field.values()}):
            rows = [i for i, v in field.items() if json.dumps(v) == value]
            stats = pooled(
                [b[headline.agent][headline.score] for b in before],
                [a[headline.agent][headline.score] for a in after],
                resamples,
                rows,
            )
            if stats is not None:
                subsets[f"{headline.subset}={value}"] = stats
    config = runs[0].config
    steps = sorted({r.steps for r in runs})
    return {
        "recipe": recipe,
        "preset": preset,
        "model": config["model"],
        "agent": headline.agent,
        "score": headline.score,
        "metric": headline.metric,
        **mine[headline.score],
        "beside": {k: mine[k] for k in headline.beside if k in mine},
        "subsets": subsets,
        "controls": measured,
        "above_control": None if best is None else {"control": best, **measured[best]},
        "vote": vote,
        "seeds": [r.seed for r in runs],
        "steps": steps[0] if len(steps) == 1 else steps,
        "capped": [r.seed for r in runs if r.steps < r.config.get("num_steps", r.steps)],
        "per_seed": per_seed,
        "minutes": round(sum(r.minutes() for r in runs), 1),
        "samples": sum(r.samples() for r in runs),
        "tokens_per_step": round(float(np.mean([r.tokens_per_step() for r in runs])), 1),
        "interval": (
            f"95% two-level bootstrap: {len(runs)} seed(s) x {mine[headline.score]['n_eval']} "
            f"held-out items, resampled together ({resamples} resamples)"
        ),
        "eval": {
            "path": config["eval"]["path"],
            "temperature": config["eval"]["temperature"],
            "n_samples": config["eval"]["n_samples"],
        },
        "agents": agents,
        "phases_s": {k: round(sum(r.phases()[k] for r in runs), 1) for k in runs[0].phases()},
        "command": command_line,
        "commit": ", ".join(sorted({c for r in runs for c in trained_at(r)})),
        "machine": machine(),
    }


def vote_k(runs: list[SeedRun], recipe: str) -> int | None:
    """The largest k every seed has a vote evaluation of (``--vote K``); None without one, or
    for a recipe whose answers ``scripts/controls.ANSWERS`` cannot read."""
    common = set.intersection(*(set(r.votes) for r in runs)) if runs else set()
    return max(common) if common and recipe in ANSWERS else None


def generated_tokens(path: Path, tokenizer, agent: str) -> float:
    """Tokens the agents generated per episode in an evaluation file: every agent's own turns
    (``rescore.turns``) of a held-out row, over ``agent``'s episodes of it; the held-out mean."""
    tokens: dict[int, int] = {}
    episodes: dict[int, int] = {}
    for item in read_jsonl(path):
        own = [t for text in item["texts"] for t in turns(text)]
        count = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in own)
        tokens[item["row"]] = tokens.get(item["row"], 0) + count
        if item["agent"] == agent:
            episodes[item["row"]] = len(item["texts"])
    return float(np.mean([tokens[r] / n for r, n in episodes.items() if n]))


def against(
    runs: list[SeedRun], base: list[SeedRun], headline: Headline, resamples: int, name: str
) -> dict:
    """This run's final scores against ``base``'s (another finished run on the same held-out
    set), by item, over both runs' seeds: its headline against the base's (``base_headline``:
    e.g. the three-role workflow's selector against the single solver), and every agent and
    score both have."""
    final = [run_scores(r, r.last) for r in runs]
    other = [run_scores(r, r.last) for r in base]
    base_report = base[0].path.parent / "learning.json"
    theirs = json.loads(base_report.read_text()) if base_report.exists() else {}
    agent, score = theirs.get("agent", headline.agent), theirs.get("score", headline.score)
    try:
        mine = [s[headline.agent][headline.score] for s in final]
        ref = [s[agent][score] for s in other]
    except KeyError as e:
        sys.exit(f"bench_learning.py: --against {name}: no held-out scores of {e} there")
    out = {
        "run": name,
        "seeds": [r.seed for r in base],
        "base_headline": {"agent": agent, "score": score},
        "tokens_per_step": round(float(np.mean([r.tokens_per_step() for r in base])), 1),
        "headline": between(ref, mine, resamples),
        "agents": compare_all(other, final, resamples, between),
        "vote": None,
    }
    recipe = runs[0].config.get("recipe")
    if (k := vote_k(base, recipe)) is not None:  # the baseline's vote at equal inference tokens
        from kernel.models import load_tokenizer

        tok = load_tokenizer(runs[0].config["model"])
        votes = [vote_scores(r.votes[k], agent, ANSWERS[recipe]) for r in base]
        out["vote"] = {
            "k": k,
            "tokens_per_item": round(
                float(np.mean([generated_tokens(r.last, tok, headline.agent) for r in runs])), 1
            ),
            "base_tokens_per_item": round(
                float(np.mean([generated_tokens(r.votes[k], tok, agent) for r in base])) * k, 1
            ),
            **between(votes, mine, resamples),
        }
    return out


def publish(out: Path, runs: list[SeedRun], name: str) -> Path:
    """Copy the report and what it was computed from into docs/results/<name>/: learning.json,
    and per seed its config, metrics, first and last evaluation (gzipped) and curves. A seed
    that trained at a tree with uncommitted changes is kept out of a results table: it may go
    under partial/ only."""
    dirty = [f"seed {r.seed} ({c})" for r in runs for c in trained_at(r) if c.endswith("+dirty")]
    if dirty and not name.startswith("partial/"):
        sys.exit(
            f"bench_learning.py: --publish {name}: {', '.join(dirty)} trained with uncommitted "
            "changes; commit, run it again, or --publish partial/NAME"
        )
    dest = RESULTS / name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    shutil.copy(out / "learning.json", dest / "learning.json")
    for r in runs:
        d = dest / f"seed{r.seed}"
        (d / "eval").mkdir(parents=True)
        shutil.copy(r.path / "config.json", d / "config.json")
        if (r.path / "commit.txt").exists():
            shutil.copy(r.path / "commit.txt", d / "commit.txt")
        for src, target in (
            (plain_or_gzipped(r.path / "metrics.jsonl"), d / "metrics.jsonl.gz"),
            (r.first, d / "eval" / "step_0.jsonl.gz"),
            (r.last, d / "eval" / f"step_{r.steps}.jsonl.gz"),
            *((v, d / "eval" / f"vote_k{k}.jsonl.gz") for k, v in r.votes.items()),
        ):
            gzip_copy(src, target)
        if (r.path / "curves.png").exists():
            shutil.copy(r.path / "curves.png", d / "curves.png")
    return dest


def gzip_copy(src: Path, dest: Path) -> None:
    """``src`` kept as ``dest`` gzipped (a file gzipped already is copied as it is)."""
    if src.suffix == ".gz":
        shutil.copy(src, dest)
        return
    with open(src, "rb") as f, gzip.GzipFile(dest, "wb", mtime=0) as g:
        shutil.copyfileobj(f, g)


# ---- the command line -----------------------------------------------------------------------


def command(args: argparse.Namespace, extra: list[str]) -> str:
    """The command line that reproduces this run (as given, without --report-only)."""
    cmd = ["python", "scripts/bench_learning.py", "--recipe", args.recipe]
    cmd += [] if args.preset == "learn" else ["--preset", args.preset]
    cmd += ["--steps", str(args.steps)] if args.steps else []
    cmd += ["--seeds", str(args.seeds)] if args.seeds != 1 else []
    cmd += ["--seed", str(args.seed)] if args.seed else []
    cmd += ["--minutes", f"{args.minutes:g}"] if args.minutes else []
    cmd += ["--against", _shown(args.against)] if args.against else []
    cmd += ["--vote", str(args.vote)] if args.vote else []
    if args.vote and args.vote_temperature != 0.7:
        cmd += ["--vote-temperature", f"{args.vote_temperature:g}"]
    cmd += ["--publish", args.publish] if args.publish else []
    return shlex.join(cmd + (["--", *extra] if extra else []))


def _shown(path: str) -> str:
    """A run folder as the repository sees it (relative when inside it)."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        epilog="Flags after -- go to every run's 'python -m kernel train' (e.g. -- --optim.lr "
        "1e-5). Example: python scripts/bench_learning.py --recipe math_solver_verifier "
        "--steps 60 --seeds 3 --publish math_solver",
    )
    p.add_argument("--recipe", choices=sorted(HEADLINES), help="the recipe to train (required)")
    p.add_argument("--preset", default="learn", help="the recipe's preset to train with")
    p.add_argument(
        "--steps", type=int, default=None, help="training steps per seed (required to train)"
    )
    p.add_argument("--seeds", type=int, default=1, help="how many seeds, one after another")
    p.add_argument("--seed", type=int, default=0, help="the first seed (then seed+1, ...)")
    p.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="safety cap on each seed's training minutes (a capped seed is reported as such)",
    )
    p.add_argument(
        "--out", default=None, help="run folder (default runs/learning/<recipe>[-<preset>])"
    )
    p.add_argument(
        "--save-every",
        type=int,
        default=8,
        help="checkpoint each seed every N steps (0: only at its end); a seed interrupted "
        "(Ctrl-C, a lost session) goes on from its last checkpoint when the same command runs "
        "again, and its commit.txt says where it resumed",
    )
    p.add_argument("--resamples", type=int, default=10000, help="bootstrap resamples")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="do not train: report on the finished seeds already in --out (a seed still "
        "training is named and left out)",
    )
    p.add_argument(
        "--against",
        default=None,
        help="another finished bench_learning run's folder on the same held-out set (an "
        "ablation, a single-agent baseline): compare final scores by item over both runs' "
        "seeds (learning.json 'against')",
    )
    p.add_argument(
        "--refresh",
        nargs="*",
        default=None,
        metavar="NAME",
        help="recompute published runs' reports (docs/results/NAME/learning.json; every one "
        "without a NAME) from their files with today's controls and readers, and stop; with "
        "--against RUN (one NAME), compare it with that published run from now on",
    )
    p.add_argument(
        "--vote",
        type=int,
        default=None,
        metavar="K",
        help="also evaluate each seed's last checkpoint with K sampled episodes per held-out "
        "item and report the plurality answer's score (the majority-vote control a workflow "
        "of several agents is measured against at equal inference tokens)",
    )
    p.add_argument(
        "--vote-temperature",
        type=float,
        default=0.7,
        help="sampling temperature of the --vote evaluation",
    )
    p.add_argument(
        "--publish",
        default=None,
        metavar="NAME",
        help="copy the report and its evaluation files into docs/results/NAME/",
    )
    return p


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(this script's flags, the flags after ``--`` that go to 'python -m kernel train')."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]


def train_seed(args: argparse.Namespace, seed: int, out: Path, extra: list[str]) -> None:
    """One seed's kernel run into ``out`` (kept when it already finished; an unfinished one
    goes on from its last checkpoint)."""
    from kernel.run.checkpoint import checkpoints  # torch: only to train

    if (out / "metrics.jsonl").exists():
        rows = read_jsonl(out / "metrics.jsonl")
        if (
            sum(r["step"] >= 0 for r in rows) == args.steps
            and (out / "eval" / f"step_{args.steps}.jsonl").exists()
        ):
            print(f"seed {seed}: finished before in {out}, kept", flush=True)
            return
    flags = ["--seed", str(seed), "--num_steps", str(args.steps), "--eval.at_start", "true"]
    flags += ["--max_minutes", str(args.minutes)] if args.minutes else []
    flags += ["--save_every", str(args.save_every)] if args.save_every else []
    found = checkpoints(out)  # an interrupted seed goes on from its last checkpoint
    flags += ["--resume", "true"] if found else []
    flags += extra
    env = dict(os.environ)
    if headline_of(args.recipe, args.preset).run_sh:  # e.g. deep_research: the retriever first
        cmd = ["bash", f"recipes/{args.recipe}/run.sh", *flags]
        env |= {"MODE": "cpu", "PRESET": args.preset, "OUT": str(out), "PY": sys.executable}
        shown = f"MODE=cpu PRESET={args.preset} OUT={out} " + shlex.join(cmd)
    else:
        cmd = [sys.executable, "-m", "kernel", "train", "--recipe", args.recipe]
        cmd += ["--preset", args.preset, "--output_dir", str(out), *flags]
        shown = shlex.join(cmd)
    print(f"seed {seed}: $ {shown}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    if found:  # the commit it started at stays first; each resume adds the one it went on at
        step = found[-1].name.removeprefix("step_")
        print(f"seed {seed}: resuming from {found[-1]}", flush=True)
        with (out / "commit.txt").open("a") as f:
            f.write(f"resumed at step {step}: {commit()}\n")
    else:
        (out / "commit.txt").write_text(commit() + "\n")  # what trained, whatever changes later
    if subprocess.run(cmd, cwd=ROOT, env=env).returncode != 0:
        sys.exit(f"bench_learning.py: the training run of seed {seed} failed (its logs: {out})")


def refresh(name: str, resamples: int, against_run: str | None = None) -> dict:
    """A published run's report computed again from its files with today's readers (controls,
    scores): the figures, controls and comparison with its ``--against`` baseline (another
    published run; ``against_run`` sets a new one, e.g. a single-agent baseline published
    after the workflow) recomputed; the command, machine and commits are the run's own."""
    dest = RESULTS / name
    first = json.loads((dest / "learning.json").read_text())
    runs = [SeedRun.read(d) for d in seed_dirs(dest)]
    command_line = first["command"]
    if against_run is not None:
        first["against"] = {"run": _shown(against_run)}
        argv = shlex.split(command_line)
        cut = argv.index("--") if "--" in argv else len(argv)
        command_line = shlex.join([*argv[:cut], "--against", _shown(against_run), *argv[cut:]])
    again = report(runs, first["recipe"], first["preset"], resamples, command_line)
    again["machine"] = first["machine"]
    if "against" in first:
        shown = Path(first["against"]["run"])  # a run folder then, published since
        base_dir = next(d for d in (ROOT / shown, RESULTS / shown.name) if seed_dirs(d))
        base = [SeedRun.read(d) for d in seed_dirs(base_dir)]
        headline = headline_of(first["recipe"], first["preset"])
        again["against"] = against(runs, base, headline, resamples, first["against"]["run"])
    (dest / "learning.json").write_text(json.dumps(again, indent=1) + "\n")
    return again


def vote_seed(args: argparse.Namespace, run: SeedRun, extra: list[str]) -> None:
    """``--vote K``: the seed's last checkpoint evaluated with K sampled episodes per held-out
    item (``--vote-temperature``), kept as ``eval/vote_k<K>.jsonl`` (a seed that has it is left
    as it is). Needs the checkpoint of the seed's last step (``--save-every`` dividing
    ``--steps``)."""
    k = args.vote
    target = run.path / "eval" / f"vote_k{k}.jsonl"
    if k in run.votes:
        print(f"seed {run.seed}: vote of {k} evaluated before, kept", flush=True)
        return
    checkpoint = run.path / "checkpoints" / f"step_{run.steps}"
    if not checkpoint.is_dir():
        sys.exit(
            f"bench_learning.py: --vote {k}: {checkpoint} is missing (the seed's last step was not "
            "saved: --save-every must divide --steps)"
        )
    out = run.path / f"vote_k{k}"
    flags = ["--checkpoint", str(checkpoint), "--eval.n_samples", str(k)]
    flags += ["--eval.temperature", str(args.vote_temperature), "--seed", str(run.seed), *extra]
    env = dict(os.environ)
    if headline_of(args.recipe, args.preset).run_sh:
        cmd = ["bash", f"recipes/{args.recipe}/run.sh", *flags]
        env |= {"MODE": "cpu", "COMMAND": "eval", "PRESET": args.preset, "OUT": str(out)}
        env["PY"] = sys.executable
    else:
        cmd = [sys.executable, "-m", "kernel", "eval", "--recipe", args.recipe]
        cmd += ["--preset", args.preset, "--output_dir", str(out), *flags]
    print(f"seed {run.seed}: vote of {k}: $ {shlex.join(cmd)}", flush=True)
    if subprocess.run(cmd, cwd=ROOT, env=env).returncode != 0:
        sys.exit(f"bench_learning.py: the vote evaluation of seed {run.seed} failed ({out})")
    shutil.copy(out / "eval" / "step_0.jsonl", target)


def main(argv: list[str] | None = None) -> int:
    own, extra = split_argv(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    if args.refresh is not None:
        names = args.refresh or sorted(p.parent.name for p in RESULTS.glob("*/learning.json"))
        if args.against and len(names) != 1:
            sys.exit("bench_learning.py: --refresh NAME --against RUN takes one NAME")
        for name in names:
            print_report(refresh(name, args.resamples, args.against))
            print(f"refreshed {RESULTS / name / 'learning.json'}")
        return 0
    if args.recipe is None:
        sys.exit("bench_learning.py: --recipe is required (except with --refresh)")
    if args.resamples < 100 or args.seeds < 1 or (args.minutes is not None and args.minutes <= 0):
        sys.exit("bench_learning.py: need --resamples >= 100, --seeds >= 1, --minutes > 0")
    if args.vote is not None and args.vote < 2:
        sys.exit(f"bench_learning.py: --vote K needs K >= 2 episodes per item, got {args.vote}")
    if not args.report_only and (args.steps is None or args.steps < 1):
        sys.exit("bench_learning.py: --steps N (>= 1) is required to train: a fixed step count")
    preset = ROOT / "recipes" / args.recipe / "presets" / f"{args.preset}.yaml"
    if not preset.exists():
        sys.exit(f"bench_learning.py: {preset} does not exist (no '{args.preset}' preset)")
    name = args.recipe + ("" if args.preset == "learn" else f"-{args.preset}")
    out = Path(args.out).resolve() if args.out else ROOT / "runs" / "learning" / name
    seeds = list(range(args.seed, args.seed + args.seeds))
    if not args.report_only:
        for seed in seeds:
            train_seed(args, seed, out / f"seed{seed}", extra)
    if args.report_only:  # the finished seeds; one still training is named and left out
        runs = read_seeds(out, "bench_learning.py")
    else:
        runs = [SeedRun.read(out / f"seed{s}") for s in seeds]
    if args.vote:
        for r in runs:
            vote_seed(args, r, extra)

    result = report(runs, args.recipe, args.preset, args.resamples, command(args, extra))
    if args.against:
        base = [SeedRun.read(d) for d in seed_dirs(Path(args.against))]
        if not base:
            sys.exit(f"bench_learning.py: --against {args.against}: no finished run there")
        headline = headline_of(args.recipe, args.preset)
        result["against"] = against(runs, base, headline, args.resamples, _shown(args.against))
    (out / "learning.json").write_text(json.dumps(result, indent=1) + "\n")
    from kernel.plot import plot_metrics

    for r in runs:  # a published seed keeps the curves drawn from its unzipped metrics
        if (r.path / "metrics.jsonl").exists():
            plot_metrics(r.path / "metrics.jsonl", r.path / "curves.png")
    print_report(result)
    if args.publish:
        print(f"published to {publish(out, runs, args.publish)}")
    print(f"wrote {out / 'learning.json'}")
    return 0


def print_report(r: dict) -> None:
    head = ("agent", "score", "n", "before", "after", "diff")
    print(f"\n{r['recipe']} ({r['preset']}) on {r['model']}: {r['metric']}")
    print("{:<12} {:<24} {:>5} {:>8} {:>8} {:>8}  95% interval".format(*head))
    for agent, scores in r["agents"].items():
        for score, s in scores.items():
            mark = " *" if (agent, score) == (r["agent"], r["score"]) else ""
            print(f"{agent:<12} {(score + mark)[:24]:<24} " + _figures(s))
    for subset, s in r["subsets"].items():
        print(f"{r['agent']:<12} {subset[:24]:<24} " + _figures(s))
    print(f"(* headline; interval: {r['interval']})")
    if r.get("controls"):
        print("final scores against what needs no skill (the control as 'before'):")
        for name, s in r["controls"].items():
            mark = " *" if name == (r.get("above_control") or {}).get("control") else ""
            print(f"{'control':<12} {(name + mark)[:24]:<24} " + _figures(s))
    if r.get("vote"):
        print(f"vote of {r['vote']['k']} sampled answers ('after') against the final evaluation:")
        print(f"{'vote':<12} {'plurality answer':<24} " + _figures(r["vote"]))
    print("per seed:")
    for s in r["per_seed"]:
        print(
            f"  seed {s['seed']}: {_figures(s)}, {s['steps']} steps, {s['minutes']} min, "
            f"{s['tokens_per_step']:.0f} generated tokens a step"
        )
    if r["capped"]:
        print(f"WARNING: seeds {r['capped']} stopped on --minutes before their steps")
    if "against" in r:
        vs = r["against"]
        print(f"\nfinal held-out scores, {vs['run']} ('before') against this run ('after'):")
        b = vs["base_headline"]
        print(f"{'headline':<12} {b['agent'] + ' ' + b['score']:<24} " + _figures(vs["headline"]))
        for agent, scores in vs["agents"].items():
            for score, s in scores.items():
                print(f"{agent:<12} {score[:24]:<24} " + _figures(s))
        if vs.get("vote"):
            v = vs["vote"]
            print(
                f"{'vote':<12} {'baseline, k=' + str(v['k']):<24} "
                + _figures(v)
                + f"  (tokens per item: run {v['tokens_per_item']:.0f}, vote "
                f"{v['base_tokens_per_item']:.0f})"
            )
    print(f"samples seen {r['samples']}, wall {r['minutes']:.1f} min, commit {r['commit']}")
    print("phases (s): " + ", ".join(f"{k} {v:.0f}" for k, v in r["phases_s"].items()))


def _figures(r: dict) -> str:
    """n, before, after, difference and interval of one comparison, as a printed row's end."""
    return (
        f"{r['n_eval']:>5} {r['before']:>8.3f} {r['after']:>8.3f} {r['diff']:>+8.3f}  "
        f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"
    )


if __name__ == "__main__":
    raise SystemExit(main())
