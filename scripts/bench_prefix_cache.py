"""Episodes per second of multi-turn rollouts with the embedded engine's prefix cache on and off,
side by side in one run, through the command a user types.

For each recipe, ``python -m kernel collect --recipe R --preset P`` (``--preset``, default
learn) rolls out the same rows of its training data (``--rows``, each with the preset's group
of episodes) with every model frozen, once with the engines' prefix cache at its default size
and once with
``--engine.prefix_cache_mb 0``; arms alternate over ``--repeats`` so that a drifting machine
load hits both. Each run's ``collect.json`` gives the episodes, the seconds spent rolling out
(start-up excluded) and the prompt tokens its engines prefilled and served from the cache.
deep_research needs its retriever: it is built once (the shipped corpus, MiniLM) and served on
127.0.0.1 for the run, then stopped by PID.

Printed per recipe and arm: episodes/s (median over repeats), generated and prefilled tokens per
episode, the share of prompt tokens served from the cache, and the ratio on ÷ off.

    .venv/bin/python scripts/bench_prefix_cache.py                       # takes_two, deep_research
    .venv/bin/python scripts/bench_prefix_cache.py --preset cpu --rows 6   # more turns
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.provenance import add_output_flags, stamp, write_outputs  # noqa: E402

RECIPES = ("takes_two", "deep_research")


@contextlib.contextmanager
def retriever(work: Path):
    """The deep_research retriever over the shipped corpus, on a free port; yields its URL."""
    from kernel.engine.launch import LaunchedProcess, free_port

    corpus = ROOT / "recipes" / "deep_research" / "data" / "corpus.jsonl"
    index = work / "index"
    if not (index / "meta.json").exists():
        build = [sys.executable, "-m", "retriever", "build", "--corpus", str(corpus)]
        subprocess.run([*build, "--out", str(index), "--model", "minilm"], check=True, cwd=ROOT)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = [sys.executable, "-m", "retriever", "serve", "--index", str(index)]
    serve += ["--model", "minilm", "--host", "127.0.0.1", "--port", str(port)]
    with LaunchedProcess.start("retriever", url, serve, work / "retriever.log") as proc:
        proc.wait_healthy(180)
        yield url


def collect(recipe: str, cache: bool, args, work: Path, tag: str, extra: list[str]) -> dict:
    """One ``kernel collect`` run; its collect.json."""
    out = work / tag
    cmd = [sys.executable, "-m", "kernel", "collect", "--recipe", recipe]
    cmd += ["--preset", args.preset, "--output_dir", str(out)]
    cmd += ["--collect.max_prompts", str(args.rows), "--seed", "0", *extra]
    cmd += [] if cache else ["--engine.prefix_cache_mb", "0"]
    with (work / f"{tag}.log").open("w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = "\n".join((work / f"{tag}.log").read_text().splitlines()[-20:])
        raise SystemExit(f"{tag} failed (exit {proc.returncode}):\n{tail}")
    return json.loads((out / "collect.json").read_text())


def figures(runs: list[dict], generated: list[int]) -> dict:
    """An arm's median episodes/s and its token counts per episode."""
    episodes = runs[0]["episodes"]
    eng = runs[0]["engines"]
    prompt = eng["num_prefill_tokens"] + eng["num_cached_tokens"]
    return {
        "episodes": episodes,
        "episodes_s": statistics.median(r["episodes"] / r["rollout_s"] for r in runs),
        "rollout_s": [r["rollout_s"] for r in runs],
        "generated_per_episode": statistics.fmean(generated) / episodes,
        "prefilled_per_episode": eng["num_prefill_tokens"] / episodes,
        "cached_share": eng["num_cached_tokens"] / prompt if prompt else 0.0,
    }


def generated_tokens(out: Path) -> int:
    """Tokens the policy sampled in a collect run (loss-mask ones of every kept sample)."""
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    return sum(sum(json.loads(x)["loss_mask"]) for x in lines if x.strip())


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--recipes", default="takes_two,deep_research", help="comma-separated")
    p.add_argument("--preset", default="learn", help="each recipe's preset (learn, cpu, ...)")
    p.add_argument("--rows", type=int, default=2, help="data rows per run (each: a group)")
    p.add_argument("--repeats", type=int, default=2, help="runs per arm, alternating")
    p.add_argument("--work-dir", default=None, help="runs, logs, index (default: a temp dir)")
    add_output_flags(p)
    args = p.parse_args()
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    if set(recipes) - set(RECIPES) or not recipes:
        p.error(f"--recipes: choose from {list(RECIPES)}")
    if args.rows < 1 or args.repeats < 1:
        p.error("--rows and --repeats must be >= 1")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_prefix_cache_"))
    work.mkdir(parents=True, exist_ok=True)
    record = stamp() | {"preset": args.preset, "rows": args.rows, "repeats": args.repeats}
    record["results"] = {}
    print(f"[bench] commit {record['commit']}; {record['machine']}; logs in {work}", flush=True)

    for recipe in recipes:
        with contextlib.ExitStack() as stack:
            extra = []
            if recipe == "deep_research":
                url = stack.enter_context(retriever(work))
                extra = ["--recipe_args.retriever_url", url]
            runs = {True: [], False: []}
            tokens = {True: [], False: []}
            for i in range(args.repeats):
                for cache in (True, False) if i % 2 == 0 else (False, True):
                    tag = f"{recipe}-{'on' if cache else 'off'}-{i}"
                    print(f"[bench] {tag} ...", flush=True)
                    runs[cache].append(collect(recipe, cache, args, work, tag, extra))
                    tokens[cache].append(generated_tokens(work / tag))
        on, off = figures(runs[True], tokens[True]), figures(runs[False], tokens[False])
        record["results"][recipe] = {
            "preset": args.preset,
            "on": on,
            "off": off,
            "ratio": on["episodes_s"] / off["episodes_s"],
        }

    print(f"\n{args.rows} rows per run, {args.repeats} runs per arm; medians\n")
    cols = ["recipe (preset)", "cache", "episodes", "episodes/s", "generated / episode"]
    cols += ["prefilled / episode", "prompt tokens from cache", "on ÷ off"]
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for recipe, rec in record["results"].items():
        for arm in ("on", "off"):
            f = rec[arm]
            ratio = f"**{rec['ratio']:.2f}**" if arm == "on" else ""
            cells = [f"{recipe} ({rec['preset']})", arm, str(f["episodes"])]
            cells += [f"{f['episodes_s']:.3f}", f"{f['generated_per_episode']:.0f}"]
            cells += [f"{f['prefilled_per_episode']:.0f}", f"{f['cached_share']:.0%}", ratio]
            print("| " + " | ".join(cells) + " |")
    for recipe, rec in record["results"].items():
        print(f"ratio {recipe} episodes/s, cache on ÷ off: {rec['ratio']:.2f}")
    record["headline"] = {
        f"{recipe} ({args.preset}) episodes/s, prefix cache on ÷ off": rec["ratio"]
        for recipe, rec in record["results"].items()
    }
    write_outputs(args, record)


if __name__ == "__main__":
    main()
