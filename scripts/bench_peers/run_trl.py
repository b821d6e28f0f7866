"""TRL's side of ``scripts/bench_vs_peers.py``: ``GRPOTrainer`` (trl 1.16) on the benchmark's
single-agent toy task, timed per optimizer step.

The same work as Tandem's runner: the model folder loaded in fp32 on the CPU, ``--prompts-per-
step`` prompts of the file in order, ``--group`` samples each from ``model.generate`` (top-p 1,
top-k off, at most ``--max-new-tokens``), GRPO advantages (TRL's default group scaling), one
AdamW update per rollout (num_iterations 1, one generation batch = one optimizer step: so the
old logprobs are the detached current ones, as in Tandem), constant lr, clip 1.0, no KL, no
bf16 and no gradient checkpointing (TRL's defaults turn both on; Tandem runs neither here).

Phases: ``rollout_s`` is ``GRPOTrainer._generate`` (tokenising the chat prompts and
``model.generate``); ``reward_s`` the reward function; ``train_s`` the rest of the step
(advantages, the training forward/backward and the optimizer step); ``sync_s`` is 0 (one
process, nothing to sync).
"""

from __future__ import annotations

import time

T0 = time.time()  # before the heavy imports: start-up is measured from here

import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from task import Emitter, TrainTokens, digit_share, load_prompts, peer_args  # noqa: E402


def main() -> None:
    args = peer_args("trl", __doc__, agents=1)
    out_dir = tempfile.TemporaryDirectory(prefix="bench_trl_")  # TRL's output_dir, removed at exit
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    emit = Emitter(args.out)
    emit({"event": "start", "system": "trl", "t0": T0, "versions": {"trl": trl.__version__}})

    prompts = load_prompts(args.prompts)
    n = args.steps * args.prompts_per_step
    rows = [{"prompt": [{"role": "user", "content": prompts[i % len(prompts)]}]} for i in range(n)]
    clock = {"rollout": 0.0, "reward": 0.0, "first_rollout_t": None, "rewards": []}

    def reward(completions, **_) -> list[float]:
        t = time.perf_counter()
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        values = [digit_share(x) for x in texts]
        clock["reward"] += time.perf_counter() - t
        clock["rewards"] += values
        return values

    class Timed(GRPOTrainer):
        def _generate(self, batch_prompts):
            if clock["first_rollout_t"] is None:
                clock["first_rollout_t"] = time.time()
            t = time.perf_counter()
            out = super()._generate(batch_prompts)
            clock["rollout"] += time.perf_counter() - t
            return out

    class Steps(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.t = time.perf_counter()
            clock.update(rollout=0.0, reward=0.0, rewards=[])

        def on_step_end(self, _args, state, *_, **__):
            step_s = time.perf_counter() - self.t
            row = {"event": "step", "step": state.global_step - 1, "step_s": step_s}
            row |= {"rollout_s": clock["rollout"], "reward_s": clock["reward"], "sync_s": 0.0}
            row["train_s"] = step_s - clock["rollout"] - clock["reward"]
            row["reward"] = sum(clock["rewards"]) / max(len(clock["rewards"]), 1)
            row["tokens_run"] = tokens.take()
            if state.global_step == 1:
                row["first_rollout_t"] = clock["first_rollout_t"]
            emit(row)

    config = GRPOConfig(
        output_dir=out_dir.name,
        per_device_train_batch_size=args.prompts_per_step * args.group,
        gradient_accumulation_steps=1,
        num_generations=args.group,
        num_iterations=1,
        max_completion_length=args.max_new_tokens,
        temperature=args.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        max_steps=args.steps,
        shuffle_dataset=False,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        seed=args.seed,
        logging_steps=max(args.steps, 1),  # TRL prints its metrics at each logging step
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tokens = TrainTokens(model)
    trainer = Timed(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(args.model),
        callbacks=[Steps()],
    )
    trainer.train()
    emit({"event": "end", "wall_s": time.time() - T0})


if __name__ == "__main__":
    main()
