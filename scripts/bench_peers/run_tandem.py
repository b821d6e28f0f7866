"""Tandem's side of ``scripts/bench_vs_peers.py``: the benchmark's toy task through the whole
Tandem path (embedded engine, request batching, trainer, weight sync), timed per step.

Same CLI and JSON-lines output as ``run_trl.py`` / ``run_comlrl.py`` (see ``bench_vs_peers``),
plus ``--agents 1|2``: one agent (the TRL comparison) or a doctor and a patient with a model
each that both answer every prompt and share one team reward (the CoMLRL comparison: MAGRPO's
aligned joint actions, with the group-normalised advantages CoMLRL uses by default). Each
comparison trains on its peer's objective: against TRL the token mean with the gradient clipped
at 1.0, against CoMLRL each answer's logprob sum averaged over answers, unclipped, weight decay
0.01. The hooks below are plain Tandem hooks, loaded by dotted path.
"""

from __future__ import annotations

import time

T0 = time.time()  # before the heavy imports: start-up is measured from here

import asyncio  # noqa: E402
import importlib  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from task import AGENTS, Emitter, digit_share, parse_args, team_reward  # noqa: E402

REWARD_S = [0.0]  # seconds spent in the reward functions (this process)


async def generate(ctx, sample):
    """One user turn (the prompt), one sampled answer per agent of the run."""
    from kernel.sample import Status

    names = list(ctx.agents)
    convs = []
    for name in names:
        conv = ctx.agents[name].conversation()
        conv.add_message("user", sample.prompt)
        convs.append(conv)
    results = await asyncio.gather(
        *(ctx.agents[n].generate_turn(c) for n, c in zip(names, convs, strict=True))
    )
    out = []
    for name, conv, result in zip(names, convs, results, strict=True):
        status = Status.COMPLETED if result.finish_type == "stop" else Status.TRUNCATED
        s = conv.to_sample(agent=name, status=status, **sample.seed_fields())
        s.metadata["text"] = ctx.agents[name].tokenizer.decode(
            result.output_ids, skip_special_tokens=True
        )
        out.append(s)
    return out


def reward(ctx, samples):
    """One agent: the digit share of its answer. Two: the team reward (the mean of the
    doctor's letter share and the patient's digit share), the same for both."""
    t = time.perf_counter()
    text = {s.agent: s.metadata["text"] for s in samples}
    if len(text) == 1:
        value = digit_share(next(iter(text.values())))
    else:
        value = team_reward(text["doctor"], text["patient"])
    REWARD_S[0] += time.perf_counter() - t
    return value


def main() -> None:
    args = parse_args("tandem", __doc__)

    import torch

    from kernel.agents import AgentSpec
    from kernel.config import TrainConfig
    from kernel.loop import train
    from kernel.metrics import process_age

    torch.set_num_threads(args.threads)
    hooks = importlib.import_module("run_tandem")  # the module the loop loads the hooks from
    started = time.time() - process_age()  # the process's own start
    emit = Emitter(args.out)

    versions = {"tandem": "0.1.0", "torch": torch.__version__}
    emit({"event": "start", "system": "tandem", "t0": T0, "versions": versions})
    single = args.agents == 1
    out_dir = tempfile.TemporaryDirectory(prefix="bench_tandem_")  # removed at exit
    agents = ["default"] if single else [AgentSpec(n, model=args.model) for n in AGENTS]
    cfg = TrainConfig(
        recipe="bench",
        generate_fn="run_tandem.generate",
        reward_fn="run_tandem.reward",
        model=args.model,
        agents=agents,
        num_steps=args.steps,
        seed=args.seed,
        output_dir=out_dir.name,
    )
    cfg.data.path, cfg.data.label_key, cfg.data.shuffle = args.prompts, None, False
    cfg.data.n_samples_per_prompt, cfg.data.prompts_per_step = args.group, args.prompts_per_step
    cfg.rollout.temperature, cfg.rollout.top_p = args.temperature, 1.0
    cfg.rollout.max_response_len, cfg.rollout.max_context_len = args.max_new_tokens, 1024
    cfg.optim.lr, cfg.optim.grad_clip = args.lr, 1.0  # TRL: token mean, clip 1.0
    # Both agents get the team reward, so GRPO per (prompt, agent) is MAGRPO's group-mean
    # baseline with CoMLRL 1.4.3's default advantage_normalization (divide by the group std):
    # the same advantages CoMLRL computes (Tandem's magrpo estimator skips the std division).
    cfg.advantage.estimator = "grpo"
    if not single:  # CoMLRL's objective: each answer's logprob sum, mean over answers; its
        # AdamW has torch's default weight decay and nothing clips the gradient
        cfg.loss.agg, cfg.optim.grad_clip, cfg.optim.weight_decay = "seq_mean_token_sum", 0.0, 0.01
    cfg.engine.num_threads = 1
    reward_before = [0.0]

    def on_step(row: dict) -> None:
        step = {
            "event": "step",
            "step": row["step"],
            "step_s": row["time/step_s"],
            "rollout_s": row["time/rollout_s"] - (hooks.REWARD_S[0] - reward_before[0]),
            "reward_s": hooks.REWARD_S[0] - reward_before[0],
            "train_s": row["time/train_s"],
            "sync_s": row["time/sync_s"],
            "reward": row["reward"],
            "requests": row["rollout/requests"],  # HTTP /generate requests of the step
            "driver_cpu_s": row["time/driver_cpu_s"],  # CPU of the loop's own thread
        }
        if not single:
            step |= {f"reward_{a}": row[f"{a}/reward"] for a in AGENTS}
        if "time/startup_s" in row:
            step["first_rollout_t"] = started + row["time/startup_s"]
        reward_before[0] = hooks.REWARD_S[0]
        emit(step)

    train(cfg, on_step=on_step)
    emit({"event": "end", "wall_s": time.time() - T0})


if __name__ == "__main__":
    main()
