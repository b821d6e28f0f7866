"""Tandem's side of ``scripts/bench_vs_peers.py``: the command a user types, timed per step.

The runner starts ``python -m kernel train --preset toy`` (one agent: the TRL comparison; the
preset's task is the benchmark's digit task) or ``--preset toy_duo`` with this benchmark's
two-agent hooks (``tandem_duo.py``: the CoMLRL comparison) as a child process, with the
benchmark's model, prompts, group, lengths, temperature, learning rate and seed as flags over
the preset. Everything else is what the preset gives a user (engines, sync transport, batching).
Each comparison trains on its peer's objective: against TRL the token mean with the gradient
clipped at 1.0 (the preset's), against CoMLRL each answer's logprob sum averaged over answers,
unclipped, weight decay 0.01. ``--threads N`` sets the run's torch threads (OMP_NUM_THREADS, read
by its trainer) and splits N over its engines, which decode at the same time (``--engine.num_threads
N / engines``, one at least: two engines at N = 1 use two); ``--extra`` passes more flags (the
benchmark's ablations: ``--trainer.share_prompts false``, ``--engine.onednn_linear false``).

Same CLI and JSON-lines output as ``run_trl.py`` / ``run_comlrl.py``: the child's
``metrics.jsonl`` gives each step's time and phases. The reward runs inside Tandem's rollout, so
``rollout_s`` includes it (``reward_s`` is 0). Start-up counts from this runner's start to the
child's first rollout (``time/startup_s``, from the child's own start, plus its launch).
"""

from __future__ import annotations

import time

T0 = time.time()  # start-up is measured from here

import json  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from task import AGENTS, Emitter, parse_args  # noqa: E402


def command(args, out_dir: str) -> list[str]:
    """The ``kernel train`` command line of this comparison."""
    single = args.agents == 1
    cmd = ["train", "--preset", "toy" if single else "toy_duo", "--model", args.model]
    if not single:
        agents = [{"name": n, "model": args.model} for n in AGENTS]
        cmd += ["--agents", json.dumps(agents)]
        cmd += ["--generate_fn", "tandem_duo.generate", "--reward_fn", "tandem_duo.reward"]
        # CoMLRL's objective: each answer's logprob sum, mean over answers; its AdamW has
        # torch's default weight decay and nothing clips the gradient
        cmd += ["--loss.agg", "seq_mean_token_sum", "--optim.grad_clip", "0"]
        cmd += ["--optim.weight_decay", "0.01"]
    # Both agents get the team reward, so GRPO per (prompt, agent) is MAGRPO's group-mean
    # baseline with CoMLRL's default normalisation (divide by the group std); TRL's too.
    cmd += ["--advantage.estimator", "grpo"]
    cmd += ["--data.path", args.prompts, "--data.shuffle", "false", "--num_steps", str(args.steps)]
    cmd += ["--data.n_samples_per_prompt", str(args.group)]
    cmd += ["--data.prompts_per_step", str(args.prompts_per_step), "--seed", str(args.seed)]
    cmd += ["--rollout.temperature", str(args.temperature), "--rollout.top_p", "1.0"]
    cmd += ["--rollout.max_response_len", str(args.max_new_tokens)]
    cmd += ["--rollout.max_context_len", str(256 + args.max_new_tokens)]
    # The same core budget as a peer's one process: the trainer gets --threads, and the
    # engines, which decode at the same time, share them (one at least each).
    engine_threads = max(1, args.threads // args.agents)
    cmd += ["--optim.lr", str(args.lr), "--engine.num_threads", str(engine_threads)]
    return [*cmd, "--output_dir", out_dir, *shlex.split(args.extra)]


def main() -> None:
    args = parse_args("tandem", __doc__, extra=True)
    emit = Emitter(args.out)
    import torch  # only for its version (the run itself is the child)

    versions = {"tandem": "0.1.0", "torch": torch.__version__}
    emit({"event": "start", "system": "tandem", "t0": T0, "versions": versions})
    with tempfile.TemporaryDirectory(prefix="bench_tandem_") as out_dir:
        cmd = command(args, out_dir)
        print("python -m kernel " + shlex.join(cmd), flush=True)
        env = os.environ | {"OMP_NUM_THREADS": str(args.threads)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
        launched = time.time()
        subprocess.run([sys.executable, "-m", "kernel", *cmd], check=True, env=env)
        rows = [json.loads(x) for x in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        if row.get("step", -1) < 0 or "time/step_s" not in row:
            continue  # an evaluation row
        step = {
            "event": "step",
            "step": row["step"],
            "step_s": row["time/step_s"],
            "rollout_s": row["time/rollout_s"],
            "reward_s": 0.0,
            "train_s": row["time/train_s"],
            "sync_s": row["time/sync_s"],
            "reward": row["reward"],
            "requests": row["rollout/requests"],  # HTTP /generate requests of the step
            "driver_cpu_s": row["time/driver_cpu_s"],  # CPU of the loop's own thread
            "tokens_run": sum(v for k, v in row.items() if k.endswith("tokens_run")),
        }
        if args.agents == 2:
            step |= {f"reward_{a}": row[f"{a}/reward"] for a in AGENTS}
        if "time/startup_s" in row:
            step["first_rollout_t"] = launched + row["time/startup_s"]
            prefix = "time/startup/"  # the run's own start-up profile, phase by phase
            step["startup_phases"] = {
                k.removeprefix(prefix).removesuffix("_s"): v
                for k, v in row.items()
                if k.startswith(prefix)
            }
        emit(step)
    emit({"event": "end", "wall_s": time.time() - T0})


if __name__ == "__main__":
    main()
