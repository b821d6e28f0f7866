"""The toy task, and an in-process demo of the kernel's pieces learning it.

Toy task: the reward of a response is the share of its characters that are digits. A freshly
initialised tiny model with the 100-token character tokenizer samples close to uniformly, so
the reward starts near 0.1; a policy that learns moves it towards 1. The task needs no labels
and gives a dense signal, so a 2-layer model learns it in a minute or two on CPU, and a flipped
sign or a lost update shows at once.

``run_demo`` is the smallest real end-to-end thing the kernel does while the training loop
with engines and weight sync (``kernel.loop``) is still being built: DataBuffer prompt groups
-> sampling with ``model.generate`` in the same process -> reward hook -> reward weighting ->
GRPO advantages -> PPO policy loss -> AdamW, step after step, with the reward curve printed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from kernel.advantages import AdvantageConfig, compute_advantages
from kernel.buffer import DataBuffer, DataConfig
from kernel.hooks import RolloutContext
from kernel.loss import LossConfig, policy_loss
from kernel.rewards import RewardConfig, apply_weighting, assign_rewards
from kernel.sample import Sample, Status
from kernel.train.logprobs import token_logprobs


def toy_reward(ctx: RolloutContext, samples: list[Sample]) -> float:
    """Share of digits in the response text (``metadata["text"]``), 0.0 if empty."""
    text = "".join(s.metadata.get("text", "") for s in samples)
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


def write_toy_prompts(path: Path, n: int = 64) -> Path:
    """A JSONL file of n distinct short prompts (the toy reward ignores their content)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"Write a short line of text, number {i}."}) + "\n")
    return path


@dataclass
class DemoConfig:
    """The in-process demo: a tiny model learns the toy task."""

    steps: int = 40
    """Optimiser steps."""
    prompts_per_step: int = 4
    """Prompt groups per step."""
    n_samples_per_prompt: int = 8
    """Samples per prompt (the GRPO group size)."""
    max_new_tokens: int = 8
    """Tokens sampled per response."""
    lr: float = 2e-3
    """AdamW learning rate."""
    seed: int = 0
    """Seed of data order, sampling and model init."""
    output_dir: str = "runs/demo"
    """Where the tiny model, prompts and metrics.jsonl go."""


@torch.no_grad()
def _sample(model, tok, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Sample a response for each prompt (left-padded batch); returns the new ids."""
    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # (B, P)
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # (B, P)
    out = model.generate(
        input_ids=ids,
        attention_mask=attn,
        do_sample=True,
        top_k=0,
        top_p=1.0,
        temperature=1.0,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad,
    )[:, width:]  # (B, R)
    responses = []
    for row in out.tolist():
        if tok.eos_token_id in row:  # keep the stop token, drop what generate padded after it
            row = row[: row.index(tok.eos_token_id) + 1]
        responses.append(row)
    return responses


def _train_step(model, opt, samples: list[Sample], loss_cfg: LossConfig) -> dict[str, float]:
    """One on-policy PPO step over the samples (right-padded batch)."""
    seqs = [s.prompt_ids + s.response_ids for s in samples]
    width = max(len(x) for x in seqs)
    ids = torch.tensor([x + [0] * (width - len(x)) for x in seqs])  # (B, L)
    attn = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in seqs])  # (B, L)
    mask = torch.zeros(len(seqs), width - 1)  # (B, L-1): 1 where a response token is predicted
    for i, s in enumerate(samples):
        start = len(s.prompt_ids) - 1
        mask[i, start : start + s.response_length] = torch.tensor(s.loss_mask, dtype=torch.float)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]  # (B, L-1, V)
    logprobs = token_logprobs(logits, ids[:, 1:])  # (B, L-1)
    adv = torch.tensor([s.advantage for s in samples])  # (B,)
    loss, metrics = policy_loss(logprobs, logprobs.detach(), adv, mask, loss_cfg)
    opt.zero_grad()
    loss.backward()
    metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    opt.step()
    return metrics


def run_demo(cfg: DemoConfig, log=print) -> list[dict]:
    """Train a tiny model on the toy task in-process; returns one metrics row per step."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kernel.models import build_tiny_model

    torch.manual_seed(cfg.seed)
    out = Path(cfg.output_dir)
    model_dir = build_tiny_model(out / "model", "qwen2", tokenizer="char", seed=cfg.seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    data = DataConfig(
        path=str(write_toy_prompts(out / "prompts.jsonl")),
        label_key=None,
        n_samples_per_prompt=cfg.n_samples_per_prompt,
        prompts_per_step=cfg.prompts_per_step,
        seed=cfg.seed,
    )
    buffer = DataBuffer(data.validate())
    adv_cfg, loss_cfg, reward_cfg = AdvantageConfig(), LossConfig(), RewardConfig()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    ctx = RolloutContext()
    rows = []
    with (out / "metrics.jsonl").open("w") as metrics_file:
        for step in range(cfg.steps):
            t0 = time.perf_counter()
            samples = [s for group in buffer.next_groups() for s in group]
            for s in samples:
                messages = [{"role": "user", "content": s.prompt}]
                s.prompt_ids = tok.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            model.eval()
            responses = _sample(model, tok, [s.prompt_ids for s in samples], cfg.max_new_tokens)
            model.train()
            for s, resp in zip(samples, responses, strict=True):
                s.response_ids, s.loss_mask = resp, [1] * len(resp)
                s.metadata["text"] = tok.decode(resp, skip_special_tokens=True)
                s.status = Status.COMPLETED if resp[-1] == tok.eos_token_id else Status.TRUNCATED
                assign_rewards([s], toy_reward(ctx, [s.validate()]))
                apply_weighting([s], reward_cfg, correct=None)
            adv_metrics = compute_advantages(samples, adv_cfg)
            metrics = _train_step(model, opt, samples, loss_cfg)
            reward = sum(s.reward for s in samples) / len(samples)
            row = {"step": step, "reward": reward, **metrics, **adv_metrics}
            row["time_s"] = time.perf_counter() - t0
            rows.append(row)
            metrics_file.write(json.dumps(row) + "\n")
            log(f"step {step:3d}  reward {reward:.3f}  pg_loss {metrics['pg_loss']:+.4f}")
    return rows
