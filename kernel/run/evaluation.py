"""Held-out evaluation: the run's rollout over the held-out prompts (no training on them),
scored by the recipe's reward, reduced to avg@n and pass@k per agent, with every (prompt, agent)
result written to ``<output_dir>/eval/step_N.jsonl`` so that two evaluations can be compared
item by item and their replies read."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from kernel.buffer import DataBuffer
from kernel.hooks import RolloutContext
from kernel.metrics import mean, pass_at_k
from kernel.rollout import GroupResult, RolloutManager
from kernel.run.config import TrainConfig
from kernel.run.results import eval_data


async def evaluate(
    cfg: TrainConfig, ctx: RolloutContext, manager: RolloutManager, updates: int
) -> dict[str, float]:
    """avg@n and pass@k (unbiased, for each of ``eval.pass_k``, default n) per agent on the
    held-out prompts (no training on them), n = ``eval.n_samples``, on the rewards as the
    recipe scored them (before the kernel's weighting), at ``eval.temperature``; a prompt
    with fewer than k scored episodes (failures) counts with k = its count. Every (prompt,
    agent) result goes to ``<output_dir>/eval/step_<updates>.jsonl`` (``row``: the
    prompt's row in eval.path; ``env``: the environment a row names in its ``env`` column, whose
    rows also get avg@n and pass@k of their own, ``eval/<agent>/<env>/...``; ``rewards``,
    ``passed``, ``texts`` and ``metrics`` per episode, a text being the agent's response
    decoded, tool messages included, and the metrics the numbers the recipe put in the
    sample's ``metadata["metrics"]``), so two evaluations can be compared item by item and
    read."""
    t0 = time.perf_counter()
    buffer = DataBuffer(eval_data(cfg))
    if cfg.eval.temperature is not None:
        agents = {
            name: replace(h, sampling={**h.sampling, "temperature": cfg.eval.temperature})
            for name, h in ctx.agents.items()
        }
        ctx = replace(ctx, agents=agents)
    kept, _, _ = await manager.run(ctx, buffer.next_groups(len(buffer)))
    row: dict[str, float] = {}
    items = []
    for agent in sorted({s.agent for r in kept for s in r.samples}):
        per_prompt, scored_items = _score(cfg, agent, kept, ctx.agents[agent].tokenizer)
        items += scored_items
        row |= _reduce(cfg, agent, per_prompt)
    path = Path(cfg.output_dir) / "eval" / f"step_{updates}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    row["time/eval_s"] = time.perf_counter() - t0
    return row


def _score(
    cfg: TrainConfig, agent: str, kept: list[GroupResult], tokenizer: Any
) -> tuple[list[tuple[str | None, float, list[bool]]], list[dict]]:
    """``agent``'s scored episodes of each prompt: per prompt (its environment, the mean reward,
    whether each episode passed), and the prompt's item for the eval file."""
    per_prompt = []  # (environment, mean reward, passed per episode)
    items = []
    for r in kept:
        mine = [s for s in r.samples if s.agent == agent and s.raw_reward is not None]
        if mine:
            passed = [
                bool(s.metadata.get("correct", s.raw_reward >= cfg.eval.pass_threshold))
                for s in mine
            ]
            env = r.group[0].metadata.get("env")
            per_prompt.append((env, mean(s.raw_reward for s in mine), passed))
            items.append(
                {
                    "row": r.group[0].metadata["row"],
                    **({"env": env} if env else {}),
                    "agent": agent,
                    "rewards": [s.raw_reward for s in mine],
                    "passed": passed,
                    "texts": [tokenizer.decode(s.response_ids) for s in mine],
                    "metrics": [_numbers(s.metadata.get("metrics")) for s in mine],
                }
            )
    return per_prompt, items


def _reduce(
    cfg: TrainConfig, agent: str, per_prompt: list[tuple[str | None, float, list[bool]]]
) -> dict[str, float]:
    """avg@n and pass@k of ``agent`` over its prompts, ``eval/<agent>/...``, and over each
    environment's, ``eval/<agent>/<env>/...``."""
    row: dict[str, float] = {}
    k = cfg.eval.n_samples
    envs = sorted({e for e, _, _ in per_prompt if e})
    for prefix, env in [(f"eval/{agent}", None), *((f"eval/{agent}/{e}", e) for e in envs)]:
        scored = [(a, p) for e, a, p in per_prompt if env is None or e == env]
        if not scored:
            continue
        row[f"{prefix}/avg@{k}"] = mean(a for a, _ in scored)
        for j in cfg.eval.pass_k or [k]:
            row[f"{prefix}/pass@{j}"] = mean(
                pass_at_k(len(p), sum(p), min(j, len(p))) for _, p in scored
            )
    return row


def _numbers(metrics: Any) -> dict[str, float]:
    """The numeric entries of a sample's ``metadata["metrics"]`` ({} without any)."""
    if not isinstance(metrics, dict):
        return {}
    return {
        k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)
    }
