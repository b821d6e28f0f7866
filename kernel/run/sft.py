"""``python -m kernel sft``: supervised fine-tuning of one agent's model, the usual warm-up
before RL.

Data (``sft.path``, read like ``data.path``: JSONL, JSON, Parquet or a hub dataset), one
example a row, in any of three shapes:

- ``messages``: chat messages ``{role, content}``; every assistant message is trained on (its
  tokens and the template's end-of-turn token, as a sampled turn that stopped), the rest is
  context;
- ``prompt`` (a string, the user's message, or chat messages) and ``response`` (the reply);
- a ``kernel collect`` trajectory: ``prompt_ids``, ``response_ids`` and ``loss_mask``, trained
  on exactly as collected -- the same tokens and masks RL trained on; rows of agents other
  than ``sft.agent`` are skipped.

Dialogues are built by the kernel's ``Conversation`` with the agent's own tokenizer and chat
template, so SFT and RL see the same ids and masks.

The loss is the mean negative log-likelihood of the trained tokens. It is optimised by the
agent's RL trainer itself (either backend, its optimiser and micro-batching): every sample gets
advantage 1 and each batch one update whose old logprobs are that forward's own, detached, so
the ratio is exactly 1 and the policy gradient, ``-mean(A * grad logprob)``, is exactly the
gradient of the NLL (KL, entropy and clipping are off). Held-out NLL (``sft.eval_path``) is
measured before training, every ``sft.eval_every`` steps and at the end; the trained model is
saved as an HF folder, ``<output_dir>/model``, the starting point of an RL run (``--model
<output_dir>/model``). Metrics go to ``<output_dir>/metrics.jsonl``.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.progress import Progress

from kernel.buffer import DataConfig, DataError, load_rows
from kernel.conversation import Conversation
from kernel.hooks import package_file
from kernel.loss import LossConfig
from kernel.metrics import MetricsLogger
from kernel.models import check_model, load_tokenizer, materialize_model
from kernel.run.config import ModelSettings, RunPlan, TrainConfig, resolve
from kernel.run.runtime import with_template
from kernel.sample import Sample, Status
from kernel.train.settings import LoraConfig
from kernel.train.trainer import build_trainer


@dataclass
class SFTConfig:
    """What ``kernel sft`` trains on, and how long."""

    path: str = ""
    """Training examples: a .jsonl/.json/.parquet file or a hub dataset; rows of chat
    ``messages``, ``prompt`` and ``response``, or kernel collect trajectories."""
    eval_path: str = ""
    """Held-out examples, same shapes; empty: no held-out NLL."""
    agent: str = ""
    """The agent whose model is trained (its model, backend, optimiser, trainer and chat
    template); default: the config's first agent."""
    epochs: int = 1
    """Passes over the training examples."""
    batch_size: int = 8
    """Examples per optimizer update."""
    max_len: int = 1024
    """Longest example in tokens (prompt and response); longer ones are refused, by row."""
    system: str | None = None
    """System message put before ``prompt``/``response`` rows (not before ``messages``)."""
    eval_every: int = 0
    """Held-out NLL every N updates too (0: before and after only)."""

    def validate(self) -> SFTConfig:
        if not self.path:
            raise ValueError("sft.path: kernel sft needs the training examples")
        if self.epochs < 1 or self.batch_size < 1 or self.max_len < 2:
            raise ValueError("sft.epochs and sft.batch_size must be >= 1, sft.max_len >= 2")
        if self.eval_every < 0:
            raise ValueError(f"sft.eval_every must be >= 0, got {self.eval_every}")
        return self


def example(row: dict[str, Any], tokenizer: Any, cfg: SFTConfig, where: str) -> Sample | None:
    """One data row as a training sample (None: a collect row of another agent). ``where``
    names the row in errors (``file: row N``)."""

    def fail(why: str) -> DataError:
        return DataError(f"{where}: {why}")

    if "response_ids" in row:  # a kernel collect trajectory
        if cfg.agent and row.get("agent", cfg.agent) != cfg.agent:
            return None
        for key in ("prompt_ids", "response_ids", "loss_mask"):
            if not isinstance(row.get(key), list):
                raise fail(f"field {key!r} must be a list of ints")
        if len(row["loss_mask"]) != len(row["response_ids"]) or not any(row["loss_mask"]):
            raise fail("field 'loss_mask' must match 'response_ids' and mark some token")
        sample = Sample(
            prompt_ids=row["prompt_ids"],
            response_ids=row["response_ids"],
            loss_mask=row["loss_mask"],
        )
    else:
        conv = Conversation(tokenizer, cfg.max_len)
        for role, content in _messages(row, cfg, fail):
            reply = role == "assistant"
            if not (conv.add_reply(content) if reply else conv.add_message(role, content)):
                raise fail(f"longer than sft.max_len={cfg.max_len} tokens")
        if not conv.ids or conv.truncated:
            raise fail(f"longer than sft.max_len={cfg.max_len} tokens")
        sample = conv.to_sample()
        sample.rollout_logprobs = None  # nothing was sampled
    if len(sample.prompt_ids) + sample.response_length > cfg.max_len:
        raise fail(f"longer than sft.max_len={cfg.max_len} tokens")
    return replace(sample, status=Status.COMPLETED, advantage=1.0, agent=cfg.agent or "default")


def _messages(row: dict, cfg: SFTConfig, fail) -> list[tuple[str, str]]:
    """(role, content) pairs of a ``messages`` row or a ``prompt``/``response`` row."""
    if row.get("messages") is not None:
        messages = row["messages"]
    elif "response" in row:
        prompt = row.get("prompt")
        if isinstance(prompt, str):
            messages = [{"role": "user", "content": prompt}]
        elif isinstance(prompt, list):
            messages = list(prompt)
        else:
            raise fail("field 'prompt' must be a string or a list of chat messages")
        if cfg.system is not None and not (messages and messages[0].get("role") == "system"):
            messages.insert(0, {"role": "system", "content": cfg.system})
        messages.append({"role": "assistant", "content": row["response"]})
    else:
        raise fail("needs 'messages', or 'prompt' and 'response', or collect's 'response_ids'")
    if not isinstance(messages, list):
        raise fail("field 'messages' must be a list of {role, content}")
    pairs = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise fail(f"message {i} must be an object with a 'role'")
        content = m.get("content")
        if not isinstance(content, str) or (m["role"] == "assistant" and not content.strip()):
            raise fail(f"message {i} ({m['role']}): 'content' must be a non-empty string")
        pairs.append((m["role"], content))
    if not any(role == "assistant" for role, _ in pairs):
        raise fail("no assistant message to train on")
    return pairs


def load_examples(path: str, tokenizer: Any, cfg: SFTConfig) -> list[Sample]:
    """Every row of ``path`` as a sample (errors name the file, row and field)."""
    rows = load_rows(DataConfig(path=package_file(path)))
    samples = [example(dict(r), tokenizer, cfg, f"{path}: row {i + 1}") for i, r in enumerate(rows)]
    kept = [s for s in samples if s is not None]
    if not kept:
        raise DataError(f"{path}: no example for agent {cfg.agent!r}")
    return kept


def batches(items: list, size: int, rng: random.Random) -> Iterator[list]:
    """``items`` shuffled by ``rng``, in batches of ``size`` (the last may be smaller)."""
    order = list(range(len(items)))
    rng.shuffle(order)
    for i in range(0, len(order), size):
        yield [items[j] for j in order[i : i + size]]


def trained_sums(trainer, samples: list[Sample]) -> list[float]:
    """Each sample's summed logprob of its trained tokens under the current weights."""
    return [
        sum(lp for lp, m in zip(lps, s.loss_mask, strict=True) if m)
        for s, lps in zip(samples, trainer.compute_logprobs(samples), strict=True)
    ]


def nll(trainer, samples: list[Sample], batch_size: int) -> float:
    """Mean negative log-likelihood per trained token under the current weights."""
    total = sum(
        sum(trained_sums(trainer, samples[i : i + batch_size]))
        for i in range(0, len(samples), batch_size)
    )
    return -total / max(sum(sum(s.loss_mask) for s in samples), 1)


@dataclass
class Tuning:
    """One agent's model set up for fine-tuning outside the RL loop (``kernel sft`` and
    ``kernel dpo``): its folder, tokenizer with the agent's chat template, and settings."""

    agent: str
    path: str
    tokenizer: Any
    settings: ModelSettings
    adapter: LoraConfig | None = None  # LoRA: the agent's adapter is tuned, the base frozen

    @classmethod
    def of(cls, plan: RunPlan, agent: str, flag: str) -> Tuning:
        """``agent`` of the run ``plan`` (empty: the first); ``flag`` names it in errors."""
        specs = {s.name: s for s in plan.agents}
        agent = agent or next(iter(specs))
        if agent not in specs:
            raise ValueError(f"{flag}: {agent!r} is not one of the agents {sorted(specs)}")
        if specs[agent].remote:
            raise ValueError(f"{flag}: {agent!r} is remote: tune it in the job that plays it")
        spec, model = specs[agent], plan.model_of(agent)
        settings = model.settings
        out = Path(plan.cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = materialize_model(check_model(settings.model), out / "models")
        tokenizer = with_template(load_tokenizer(spec.tokenizer or path), spec.chat_template)
        return cls(agent, path, tokenizer, settings, model.adapters.get(agent))

    def trainer(self, loss: LossConfig, steps: int, seed: int):
        """The agent's trainer (its backend and optimiser), one update per batch."""
        one_update = replace(self.settings.trainer, num_minibatches=1, ppo_epochs=1)
        args = (self.path, self.settings.optim, loss, one_update, steps, 1.0, seed)
        return build_trainer(*args, adapters={self.agent: self.adapter} if self.adapter else None)

    def save(self, trainer, out_dir: Path) -> Path:
        """The tuned model: an HF folder ``out_dir/model``, or with LoRA the agent's adapter as
        a PEFT folder ``out_dir/adapters/<agent>`` (start RL from it with ``lora.path``)."""
        if self.adapter is not None:
            return trainer.save_adapters(out_dir / "adapters", [self.agent])[self.agent]
        return trainer.save_hf(out_dir / "model")


@dataclass
class TuneLoop:
    """The one loop of ``kernel sft`` and ``kernel dpo``, which differ only in what an update and
    a held-out measurement are: ``epochs`` passes over ``items``, shuffled by the run's seed, one
    update a batch of ``batch_size``; held-out metrics before the first update, every
    ``eval_every`` updates (0: none between) and after the last."""

    cfg: TrainConfig
    tuning: Tuning
    items: list
    batch_size: int
    epochs: int
    eval_every: int
    label: str  # the progress bar's: "<label> (updates)"

    @property
    def steps(self) -> int:
        """Updates in all (the trainer's schedule needs it before the first)."""
        return self.epochs * math.ceil(len(self.items) / self.batch_size)

    def run(
        self,
        trainer,
        update: Callable[[list], dict[str, float]],
        evaluate: Callable[[], dict[str, float]] | None,
    ) -> dict[str, float]:
        """Trains with ``update(batch) -> train metrics`` and measures with ``evaluate() -> eval
        metrics`` (None: no held-out data), a row a step in ``<output_dir>/metrics.jsonl``; saves
        the tuned model; returns the last row."""
        out = Path(self.cfg.output_dir)
        logger = MetricsLogger(out, self.cfg.log)
        row: dict[str, float] = {}
        if evaluate:
            row = {"step": 0, **evaluate()}
            logger.log(row)
        rng, step, t0 = random.Random(self.cfg.seed), 0, time.perf_counter()
        with Progress() as progress:
            task = progress.add_task(f"{self.label} (updates)", total=self.steps)
            for _ in range(self.epochs):
                for batch in batches(self.items, self.batch_size, rng):
                    step += 1
                    row = {"step": step, **update(batch)}
                    due = step == self.steps or (self.eval_every and step % self.eval_every == 0)
                    if evaluate and due:
                        row |= evaluate()
                    logger.log(row | {"time/elapsed_s": time.perf_counter() - t0})
                    progress.advance(task)
        self.tuning.save(trainer, out)
        trainer.close()
        logger.close()
        return row


def sft(run: TrainConfig | RunPlan, scfg: SFTConfig) -> dict[str, float]:
    """Fine-tune ``scfg.agent``'s model of ``run`` (a config or its plan) on ``scfg.path``;
    returns the last metrics row."""
    scfg.validate()
    plan = resolve(run)
    cfg = plan.cfg
    tuning = Tuning.of(plan, scfg.agent, "sft.agent")
    scfg = replace(scfg, agent=tuning.agent)
    train = load_examples(scfg.path, tuning.tokenizer, scfg)
    held_out = load_examples(scfg.eval_path, tuning.tokenizer, scfg) if scfg.eval_path else []
    loop = TuneLoop(cfg, tuning, train, scfg.batch_size, scfg.epochs, scfg.eval_every, "sft")
    trainer = tuning.trainer(LossConfig(), loop.steps, cfg.seed)

    def update(batch: list[Sample]) -> dict[str, float]:
        metrics = trainer.train_step(batch)
        return {
            "train/nll": -metrics["logprob_mean"],
            "train/grad_norm": metrics.get("grad_norm", float("nan")),
            "train/tokens": metrics.get("loss_tokens", 0.0),
        }

    def evaluate() -> dict[str, float]:
        return {"eval/nll": nll(trainer, held_out, scfg.batch_size)}

    return loop.run(trainer, update, evaluate if held_out else None)
