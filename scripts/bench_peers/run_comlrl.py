"""CoMLRL's side of ``scripts/bench_vs_peers.py``: ``MAGRPOTrainer`` (comlrl 1.4.3) on the
benchmark's two-agent toy task, timed per optimizer step.

The same work as Tandem's two-agent runner: two agents, each its own copy of the model folder
(fp32, CPU), both answering every prompt (one turn, aligned joint actions: sample j of one
agent with sample j of the other) and sharing the team reward; ``--group`` samples per prompt
from ``model.generate`` (top-p 1, top-k off, at most ``--max-new-tokens``); group-mean
advantages normalised by the group's std (CoMLRL's default, as GRPO); one AdamW update per
agent per ``--prompts-per-step`` prompts (``rollout_buffer_size`` = ``train_batch_size`` =
prompts per step), constant lr. CoMLRL has no gradient clipping, no importance ratio and no
separate engine, so nothing is synced.

CoMLRL handles one prompt at a time: a step is the ``--prompts-per-step`` calls of
``_train_step_returns`` that fill the buffers and end in the update. ``rollout_s`` is
``_generate_completions`` (tokenising and ``model.generate``, both agents), ``reward_s`` the
reward function, ``train_s`` ``_update_from_samples`` (both agents), ``sync_s`` 0.
"""

from __future__ import annotations

import time

T0 = time.time()  # before the heavy imports: start-up is measured from here

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from task import AGENTS, Emitter, TrainTokens, load_prompts, peer_args, team_reward  # noqa: E402


def main() -> None:
    args = peer_args("comlrl", __doc__, agents=2)
    import random

    import comlrl
    import numpy as np
    import torch
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    from datasets import Dataset
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    random.seed(args.seed)  # CoMLRL shuffles each update's samples with `random`
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    emit = Emitter(args.out)
    version = getattr(comlrl, "__version__", "1.4.3")
    emit({"event": "start", "system": "comlrl", "t0": T0, "versions": {"comlrl": version}})

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = load_prompts(args.prompts)
    n = args.steps * args.prompts_per_step
    rows = [{"prompt": prompts[i % len(prompts)]} for i in range(n)]

    def chat(item: dict) -> str:
        """The prompt as one user message in the model's chat template (as TRL and Tandem)."""
        message = [{"role": "user", "content": item["prompt"]}]
        return tokenizer.apply_chat_template(message, tokenize=False, add_generation_prompt=True)

    clock = {"rollout": 0.0, "reward": 0.0, "train": 0.0, "rewards": [], "items": 0}
    clock |= {"first_rollout_t": None, "agent_rewards": {a: [] for a in AGENTS}}

    def reward(doctor: list[str], patient: list[str]) -> list[float]:
        t = time.perf_counter()
        values = [team_reward(d, p) for d, p in zip(doctor, patient, strict=True)]
        clock["reward"] += time.perf_counter() - t
        clock["rewards"] += values
        return values

    class Timed(MAGRPOTrainer):
        def _generate_completions(self, *a, **kw):
            if clock["first_rollout_t"] is None:
                clock["first_rollout_t"] = time.time()
            t = time.perf_counter()
            out = super()._generate_completions(*a, **kw)
            clock["rollout"] += time.perf_counter() - t
            return out

        def _update_from_samples(self, *a, **kw):
            t = time.perf_counter()
            super()._update_from_samples(*a, **kw)
            clock["train"] += time.perf_counter() - t

        def _train_step_returns(self, *a, **kw):
            if clock["items"] % args.prompts_per_step == 0:
                self._t = time.perf_counter()
                clock.update(rollout=0.0, reward=0.0, train=0.0, rewards=[])
            super()._train_step_returns(*a, **kw)
            clock["items"] += 1
            if clock["items"] % args.prompts_per_step:
                return
            step = clock["items"] // args.prompts_per_step - 1
            row = {"event": "step", "step": step, "step_s": time.perf_counter() - self._t}
            row |= {"rollout_s": clock["rollout"], "reward_s": clock["reward"]}
            row |= {"train_s": clock["train"], "sync_s": 0.0}
            row["reward"] = sum(clock["rewards"]) / max(len(clock["rewards"]), 1)
            row["tokens_run"] = tokens.take()
            if step == 0:
                row["first_rollout_t"] = clock["first_rollout_t"]
            emit(row)

    config = MAGRPOConfig(
        num_train_epochs=1,
        agent_learning_rate=args.lr,
        logging_steps=max(args.steps, 1),
        num_agents=2,
        num_generations=args.group,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=1.0,
        top_k=0,  # off (0), as TRL and Tandem: otherwise HF generate samples from the top 50
        num_turns=1,
        joint_mode="aligned",
        early_termination_threshold=None,
        eval_interval=0,
        eval_num_samples=0,
        rollout_buffer_size=args.prompts_per_step,
        train_batch_size=args.prompts_per_step,
        advantage_mode="mean",
        advantage_normalization=True,
    )
    trainer = Timed(
        agent_model=args.model,
        num_agents=2,
        tokenizer=tokenizer,
        model_config={"torch_dtype": torch.float32},
        train_dataset=Dataset.from_list(rows),
        reward_func=reward,
        formatters=chat,
        args=config,
    )
    tokens = TrainTokens(*trainer.agents)
    trainer.train()
    emit({"event": "end", "wall_s": time.time() - T0})


if __name__ == "__main__":
    main()
