"""takes_two with a supervised warm start of each role: does the pair beat one doctor?

Per seed, in ``<out>/seed<S>/`` (a stage whose output exists is kept, so the same command
resumes; seeds one after another, one model-loading process at a time):

1. ``demos``: rule-written turns of each role from the training cases
   (``recipes.takes_two.demos --seed S``): 8 doctor consultations and 4 patient answers a case;
2. ``sft_doctor``, ``sft_patient``: ``kernel sft`` of SmolLM2-135M-Instruct on them (1 epoch,
   lr 5e-5, ``--seed S``);
3. held-out evaluations on the preset's balanced held-out file (132 cases, greedy), each a
   plain ``kernel eval``:

   - ``pair``: the warm doctor consulting the warm patient (the multi-agent workflow);
   - ``base_patient``: the warm doctor consulting the base patient;
   - ``informant``: the warm doctor told every fact by rule (``scripted_patient``);
   - ``alone``: the warm doctor with no one to ask (``max_turns 1``: it diagnoses from the
     complaint and the candidates), the single-agent baseline;
   - ``alone_vote``: the same doctor sampled ``--vote`` times a case at temperature 0.7, the
     plurality diagnosis scored (the majority-vote control, at more inference tokens a case
     than the pair's).

The report (``<out>/warm_start.json``, printed as a table): per arm the correct single
diagnoses (``diagnosis_correct``) over seeds and cases with a 95% two-level bootstrap interval
(``bench_learning.crossed_bootstrap``: seeds and cases resampled), the pair minus each other
arm and minus the best no-skill control (``scripts/controls.py``: a random, the first listed
and the most common training candidate; 0.273 on these files) with theirs, generated tokens a
case, and from the replies (``read_replies``) the share naming one candidate, right when named,
named the first listed, and the facts the answers revealed. ``--publish NAME`` copies each
seed's evaluations (gzipped) and the report to ``docs/results/NAME``.

    python scripts/takes_two_warm_start.py --seeds 3 --out runs/takes_two_warm_start \\
        --publish partial/takes_two_warm_start
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernel.models import load_tokenizer  # noqa: E402
from kernel.sample import Sample  # noqa: E402
from recipes.takes_two.data import Case, normalise_diagnosis  # noqa: E402
from recipes.takes_two.read_replies import read  # noqa: E402
from recipes.takes_two.reward import parse_final, stated_diagnosis  # noqa: E402
from scripts.bench_learning import (  # noqa: E402
    crossed_bootstrap,
    generated_tokens,
    gzip_copy,
    item_scores,
    machine,
)
from scripts.controls import controls, vote_scores  # noqa: E402

TRAIN = "recipes/takes_two/data/train_balanced.jsonl"
HELD_OUT = "recipes/takes_two/data/test_balanced.jsonl"
PRESET = ["--recipe", "takes_two", "--preset", "learn_balanced"]
ARMS = ("pair", "base_patient", "informant", "alone", "alone_vote")
FIGURES = ("named", "correct_if_named", "first_if_named", "facts")  # read_replies.read's


def diagnosis(text: str) -> str | None:
    """The diagnosis a doctor's reply stands by, normalised (the vote's answer)."""
    said = stated_diagnosis(parse_final(text))
    return normalise_diagnosis(said) if said else None


def agents(doctor: str, patient: str | None) -> str:
    """--agents: the warm doctor, and the patient on ``patient`` (None: not played, frozen)."""
    second: dict = {"name": "patient", "model": patient} if patient else {"name": "patient"}
    if patient is None:
        second["trainable"] = False
    return json.dumps([{"name": "doctor", "model": doctor}, second])


def stages(seed: int, d: Path, vote: int) -> list[tuple[Path, list[str]]]:
    """(what the stage writes, its command) for each stage of one seed, in order."""
    py, doc, pat = sys.executable, str(d / "sft_doctor" / "model"), str(d / "sft_patient" / "model")
    demos = [py, "-m", "recipes.takes_two.demos", "--train", TRAIN, "--seed", str(seed)]
    sft = [py, "-m", "kernel", "sft", *PRESET, "--sft.epochs", "1", "--optim.lr", "5e-5"]
    sft += ["--seed", str(42 + seed)]  # 42: kernel's default seed
    alone = ["--recipe_args.max_turns", "1", "--recipe_args.min_questions", "0"]

    def ev(arm: str, patient: str | None, *flags: str) -> tuple[Path, list[str]]:
        out = d / arm
        return out, [
            py,
            "-m",
            "kernel",
            "eval",
            *PRESET,
            "--agents",
            agents(doc, patient),
            *flags,
            "--output_dir",
            str(out),
        ]

    def demo(role: str, per_case: int) -> tuple[Path, list[str]]:
        out = d / f"{role}.jsonl"
        return out, [*demos, "--role", role, "--per_case", str(per_case), "--out", str(out)]

    def tune(role: str) -> tuple[Path, list[str]]:
        out, data = d / f"sft_{role}", str(d / f"{role}.jsonl")
        return out, [*sft, "--sft.agent", role, "--sft.path", data, "--output_dir", str(out)]

    votes = ["--eval.n_samples", str(vote), "--eval.temperature", "0.7"]
    return [
        demo("doctor", 8),
        demo("patient", 4),
        tune("doctor"),
        tune("patient"),
        ev("pair", pat),
        ev("base_patient", "smollm2"),
        ev("informant", None, "--recipe_args.scripted_patient", "true"),
        ev("alone", None, *alone),
        ev("alone_vote", None, *alone, *votes),
    ]


def finished(out: Path) -> bool:
    if out.suffix == ".jsonl":
        return out.exists()
    return (out / "model").exists() or (out / "eval.json").exists()


def run_seed(seed: int, d: Path, vote: int) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for out, cmd in stages(seed, d, vote):
        if finished(out):
            continue
        print(f"== seed {seed}: {out.name}", flush=True)
        if out.is_dir():  # a stage cut short
            shutil.rmtree(out)
        subprocess.run(cmd, check=True, cwd=ROOT)


def eval_file(d: Path, arm: str) -> Path:
    """A seed's evaluation of ``arm``: as the run wrote it, or as --publish keeps it."""
    published = d / arm / "eval.jsonl.gz"
    return published if published.exists() else d / arm / "eval" / "step_0.jsonl"


def scores(d: Path, arm: str, cases: list[Case]) -> dict:
    """One seed's arm: correct per case (the plurality's for the vote), and the reply figures."""
    path = eval_file(d, arm)
    if arm == "alone_vote":
        per_case = vote_scores(path, "doctor", diagnosis)
    else:
        per_case = item_scores(path)["doctor"]["diagnosis_correct"]
    figures = read(path, cases)
    figures.pop("first_turns")
    return {"per_case": per_case, "figures": figures}


def report(out: Path, seeds: list[int], vote: int, resamples: int) -> dict:
    rows = [json.loads(line) for line in (ROOT / HELD_OUT).read_text().splitlines()]
    cases = [  # read as the recipe reads a row (its label, facts and candidates)
        Case.from_sample(Sample(prompt=r["prompt"], label=r["label"], metadata=r)) for r in rows
    ]
    n = len(cases)
    got = {arm: [scores(out / f"seed{s}", arm, cases) for s in seeds] for arm in ARMS}
    grid = {arm: np.array([[g["per_case"][i] for i in range(n)] for g in got[arm]]) for arm in ARMS}
    held = {"path": HELD_OUT, "max_prompts": n}
    ctrl = controls("takes_two", "learn_balanced", {"data": {"path": TRAIN}, "eval": held}, [])
    grids = {k: np.array([[m[i] for i in range(n)] for m in maps]) for k, maps in ctrl.items()}
    best = max(grids, key=lambda k: grids[k].mean())
    best_grid = grids[best]
    tok = load_tokenizer("smollm2")  # the warm models' own (SFT keeps the tokenizer)

    def tokens(d: Path, arm: str) -> float:
        """Tokens both agents generated a case (the vote: its ``vote`` episodes together)."""
        return generated_tokens(eval_file(d, arm), tok, "doctor") * (
            vote if arm == "alone_vote" else 1
        )

    result: dict = {
        "seeds": seeds,
        "vote": vote,
        "n_eval": n,
        "controls": {k: float(g.mean()) for k, g in grids.items()},
        "best_control": best,
    }
    for arm in ARMS:
        low, high = crossed_bootstrap(grid[arm], None, resamples)
        figs = [g["figures"] for g in got[arm]]
        result[arm] = {
            "correct": float(grid[arm].mean()),
            "ci_low": low,
            "ci_high": high,
            "per_seed": [float(x) for x in grid[arm].mean(axis=1)],
            **{k: float(np.mean([f[k] for f in figs])) for k in FIGURES},
            "tokens_per_case": float(np.mean([tokens(out / f"seed{s}", arm) for s in seeds])),
        }
        if arm != "pair":
            diff_low, diff_high = crossed_bootstrap(grid["pair"], grid[arm], resamples)
            result[arm]["pair_minus"] = {
                "diff": float(grid["pair"].mean() - grid[arm].mean()),
                "ci_low": diff_low,
                "ci_high": diff_high,
            }
    low, high = crossed_bootstrap(grid["pair"], best_grid, resamples)
    result["pair_minus_best_control"] = {
        "diff": float(grid["pair"].mean() - best_grid.mean()),
        "ci_low": low,
        "ci_high": high,
    }
    return result


def print_report(r: dict) -> None:
    best = r["best_control"]
    print(
        f"takes_two warm start: {len(r['seeds'])} seed(s) x {r['n_eval']} held-out cases; "
        f"best no-skill control: {best} {r['controls'][best]:.3f}"
    )
    print(
        f"{'arm':<13} {'correct':>8} {'95% interval':>17} {'pair - arm [95%]':>26} {'named':>6} "
        f"{'right|named':>11} {'first|named':>11} {'facts':>6} {'tokens':>7}"
    )
    for arm in ARMS:
        a = r[arm]
        d = a.get("pair_minus")
        vs = f"{d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]" if d else "-"
        print(
            f"{arm:<13} {a['correct']:>8.3f} [{a['ci_low']:.3f}, {a['ci_high']:.3f}] {vs:>26} "
            f"{a['named']:>6.3f} {a['correct_if_named']:>11.3f} {a['first_if_named']:>11.3f} "
            f"{a['facts']:>6.3f} {a['tokens_per_case']:>7.1f}"
        )
    c = r["pair_minus_best_control"]
    print(f"pair - best control: {c['diff']:+.3f} [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]")


ARM_NAMES = {
    "pair": "warm doctor + warm patient (the workflow)",
    "base_patient": "warm doctor + base patient",
    "informant": "warm doctor + perfect informant (rule)",
    "alone": "warm doctor alone (no one to ask)",
    "alone_vote": "warm doctor alone, plurality of {k} samples",
}


def markdown(r: dict) -> str:
    """The report as a markdown table (``summary.md``, and the docs' ``results:warm_start``
    tables: scripts/results_table.py)."""
    vote = r["vote"]
    best = r["best_control"]
    lines = [
        f"takes_two with a supervised warm start of each role: {len(r['seeds'])} seeds x "
        f"{r['n_eval']} held-out cases (`{HELD_OUT}`), greedy; best no-skill control: {best} "
        f"{r['controls'][best]:.3f}. Commit `{r['commit']}`, {r['machine']}.",
        "",
        "| arm | correct single diagnoses [95% interval] | the workflow − arm [95% interval] "
        "| names one candidate | right when named | first listed when named | facts revealed "
        "| generated tokens / case |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in ARMS:
        a, d = r[arm], r[arm].get("pair_minus")
        vs = f"**{d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]**" if d else "—"
        lines.append(
            f"| {ARM_NAMES[arm].format(k=vote)} | {a['correct']:.3f} [{a['ci_low']:.3f}, "
            f"{a['ci_high']:.3f}] | {vs} | {a['named']:.3f} | {a['correct_if_named']:.3f} | "
            f"{a['first_if_named']:.3f} | {a['facts']:.3f} | {a['tokens_per_case']:.1f} |"
        )
    c = r["pair_minus_best_control"]
    lines += [
        "",
        f"The workflow − the best control ({best}): **{c['diff']:+.3f} "
        f"[{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]**.",
    ]
    return "\n".join(lines) + "\n"


def publish(out: Path, seeds: list[int], name: str) -> Path:
    """The report and each seed's evaluations (gzipped) and SFT curves into docs/results/NAME."""
    dest = ROOT / "docs" / "results" / name
    for s in seeds:
        for arm in ARMS:
            src = out / f"seed{s}" / arm
            (dest / f"seed{s}" / arm).mkdir(parents=True, exist_ok=True)
            gzip_copy(src / "eval" / "step_0.jsonl", dest / f"seed{s}" / arm / "eval.jsonl.gz")
            shutil.copy(src / "config.json", dest / f"seed{s}" / arm / "config.json")
        for role in ("doctor", "patient"):
            src = out / f"seed{s}" / f"sft_{role}" / "metrics.jsonl"
            shutil.copy(src, dest / f"seed{s}" / f"sft_{role}_metrics.jsonl")
    for report_file in ("warm_start.json", "summary.md"):
        shutil.copy(out / report_file, dest / report_file)
    return dest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    p.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
    p.add_argument("--out", type=Path, default=Path("runs/takes_two_warm_start"))
    p.add_argument("--vote", type=int, default=4, help="episodes a case of the vote (default 4)")
    p.add_argument("--resamples", type=int, default=10000)
    p.add_argument("--report-only", action="store_true", help="report the finished seeds")
    p.add_argument("--publish", metavar="NAME", help="copy the report into docs/results/NAME")
    a = p.parse_args(argv)
    seeds = list(range(a.seed, a.seed + a.seeds))
    if not a.report_only:
        for s in seeds:
            run_seed(s, a.out / f"seed{s}", a.vote)
    r = report(a.out, seeds, a.vote, a.resamples)
    commit = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    r |= {"command": " ".join(sys.argv), "commit": commit, "machine": machine()}
    (a.out / "warm_start.json").write_text(json.dumps(r, indent=1))
    (a.out / "summary.md").write_text(markdown(r))
    print_report(r)
    if a.publish:
        print(f"published: {publish(a.out, seeds, a.publish)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
