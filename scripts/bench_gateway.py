"""What the gateway costs: the writer-critic episode as a program behind the gateway against the
same episode written as a recipe, as a user runs them.

Both arms are ``python -m kernel train --recipe writer_critic --preset PRESET``: the preset's
``agent_program`` (recipes/writer_critic/program.py, the ``openai`` client through the gateway)
and ``--agent_program null`` (recipes/writer_critic/generate.py: the same turns, prompts and
score through Tandem's Dialogue API). Same model, data, seed and steps; whole processes,
interleaved, ``--reps`` each. The figures are the rollout time (``time/rollout_s`` of every
step but the first, which warms up) per episode and per sampled token (the arms sample different
texts, so their lengths differ by chance), and the ratios gateway ÷ recipe (1.0: free).

    .venv/bin/python scripts/bench_gateway.py                       # tiny model
    .venv/bin/python scripts/bench_gateway.py --preset cpu --steps 3  # SmolLM2-135M
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.provenance import add_output_flags, stamp, write_outputs  # noqa: E402

ARMS = {"gateway": [], "recipe": ["--agent_program", "null"]}


def run_arm(arm: str, preset: str, steps: int, out: Path) -> dict:
    """One training run of ``arm``; its rollout seconds per episode over steps 2..N."""
    cmd = [sys.executable, "-m", "kernel", "train", "--recipe", "writer_critic"]
    cmd += ["--preset", preset, "--num_steps", str(steps), "--output_dir", str(out)]
    cmd += ["--eval.path", "", "--eval.at_start", "false", *ARMS[arm]]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{arm} failed:\n{done.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    config = json.loads((out / "config.json").read_text())
    episodes = config["data"]["prompts_per_step"] * config["data"]["n_samples_per_prompt"]
    rollout = sum(r["time/rollout_s"] for r in rows[1:])
    sampled = sum(r["train/loss_tokens"] for r in rows[1:])  # the agents' sampled tokens
    return {
        "arm": arm,
        "episode_ms": 1000 * rollout / (episodes * (len(rows) - 1)),
        "token_ms": 1000 * rollout / sampled,
        "tokens_per_episode": sampled / (episodes * (len(rows) - 1)),
        "wall_s": time.perf_counter() - t0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", help="writer_critic preset (tiny | cpu)")
    parser.add_argument("--steps", type=int, default=8, help="steps per run (the first warms up)")
    parser.add_argument("--reps", type=int, default=2, help="runs per arm, interleaved")
    add_output_flags(parser)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step is a warm-up)")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for arm in ARMS:
                r = run_arm(arm, args.preset, args.steps, Path(tmp) / f"{arm}{rep}")
                runs.append(r)
                print(
                    f"rep {rep} {arm:8s} {r['episode_ms']:8.1f} ms/episode, "
                    f"{r['tokens_per_episode']:6.1f} sampled tokens/episode, "
                    f"{r['token_ms']:6.2f} ms/token  ({r['wall_s']:.0f} s)"
                )

    def median(key: str, arm: str) -> float:
        return statistics.median(r[key] for r in runs if r["arm"] == arm)

    ms = {arm: median("episode_ms", arm) for arm in ARMS}
    per_token = {arm: median("token_ms", arm) for arm in ARMS}
    ratio, token_ratio = ms["gateway"] / ms["recipe"], per_token["gateway"] / per_token["recipe"]
    print(
        f"writer_critic --preset {args.preset} (median of {args.reps}): gateway "
        f"{ms['gateway']:.1f} ms/episode, recipe {ms['recipe']:.1f}: gateway / recipe "
        f"{ratio:.2f}x per episode, {token_ratio:.2f}x per sampled token"
    )
    record = stamp() | {"preset": args.preset, "steps": args.steps, "reps": args.reps}
    record |= {"runs": runs, "episode_ms": ms, "token_ms": per_token}
    record |= {"gateway_over_recipe": ratio, "gateway_over_recipe_per_token": token_ratio}
    figure = f"writer_critic ({args.preset}) rollout time, recipe ÷ gateway"
    record["headline"] = {f"{figure}, per episode": 1 / ratio}
    record["headline"][f"{figure}, per sampled token"] = 1 / token_ratio
    write_outputs(args, record)


if __name__ == "__main__":
    main()
