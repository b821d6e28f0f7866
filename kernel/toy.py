"""The toy task: a recipe-shaped pair of hooks the kernel uses to prove that it learns.

The reward of a response is the share of its characters that are digits. A freshly
initialised tiny model with the 100-token character tokenizer (``kernel.models``, model name
``tiny-char``) samples close to uniformly, so the reward starts near 0.1; a policy that learns
moves it towards 1. The task needs no labels and gives a dense signal, so a 2-layer model
learns it in about a minute on CPU through the full path (embedded engine generation ->
reward -> advantages -> train -> weight sync), and a flipped sign or a lost weight update
shows at once. ``python -m kernel train --preset toy`` runs it.
"""

from __future__ import annotations

import json
from pathlib import Path

from kernel.hooks import RolloutContext
from kernel.sample import Sample, Status

AGENT = "default"


def toy_reward(ctx: RolloutContext, samples: list[Sample]) -> float:
    """Share of digits in the response text (``metadata["text"]``), 0.0 if empty."""
    text = "".join(s.metadata.get("text", "") for s in samples)
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


reward = toy_reward


async def generate(ctx: RolloutContext, sample: Sample) -> list[Sample]:
    """One user turn (the prompt), one sampled answer of the single agent."""
    agent = ctx.agents[AGENT]
    conv = agent.conversation()
    conv.add_message("user", sample.prompt)
    result = await agent.generate_turn(conv)
    status = Status.COMPLETED if result and result.finish_type == "stop" else Status.TRUNCATED
    out = conv.to_sample(agent=AGENT, status=status, **sample.seed_fields())
    sampled = [t for t, m in zip(out.response_ids, out.loss_mask, strict=True) if m]
    out.metadata["text"] = agent.tokenizer.decode(sampled, skip_special_tokens=True)
    return [out]


def write_toy_prompts(path: Path, n: int = 64) -> Path:
    """A JSONL file of n distinct short prompts (the toy reward ignores their content)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"Write a short line of text, number {i}."}) + "\n")
    return path
