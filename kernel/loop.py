"""The training loop: Generate -> Reward -> Advantages -> Train -> Sync, step after step.

Read ``train`` top to bottom. Per step:

1. pull prompt groups from the DataBuffer and roll them out through the recipe's generate hook
   on the engines (bounded concurrency, per-episode timeouts, failures masked, aborted groups
   requeued, DAPO refill when dynamic sampling drops constant groups);
2. rewards (recipe hook + kernel weighting) come back with the episodes;
3. advantages, grouped per (prompt, agent[, turn]) - never batch-wide unless asked for;
4. one optimiser step of the shared model on every agent's samples;
5. push the new weights to the engines (pause -> update -> version -> continue);
6. log (metrics.jsonl, optional TensorBoard / W&B) and checkpoint.

In ``async_mode`` the rollout of step k+1 runs while step k trains (one step off-policy): the
samples carry the weight versions that made them, the staleness is logged and bounded, and
truncated importance sampling (``loss.tis_cap``) corrects the lag.

A checkpoint (``<output_dir>/checkpoints/step_N``) holds the trainer (weights, optimiser,
schedule, RNG), the buffer position with every prompt group handed out but not yet trained
(so a crash mid-step neither skips nor repeats a prompt), the step and the weight version.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from kernel.advantages import compute_advantages
from kernel.agents import AgentHandle, EnginePool
from kernel.buffer import DataBuffer
from kernel.config import TrainConfig
from kernel.hooks import (
    RolloutContext,
    default_recipe_config,
    load_generate,
    load_recipe_config,
    load_reward,
)
from kernel.metrics import MetricsLogger, mean
from kernel.models import load_tokenizer, materialize_model
from kernel.rollout import GroupResult, RolloutManager, RolloutStats
from kernel.sample import Sample, Status
from kernel.sync.push import WeightSync

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Batch:
    """The rollout of one step: kept prompt groups, and every group handed out for it."""

    results: list[GroupResult]
    handed_out: list[list[Sample]]
    stats: RolloutStats
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def samples(self) -> list[Sample]:
        return [s for r in self.results for s in r.samples]


def resolve_data_path(path: str) -> str:
    """A relative data path that is not under the working directory may be under the repo."""
    if path and not Path(path).exists() and (REPO_ROOT / path).exists():
        return str(REPO_ROOT / path)
    return path


def latest_checkpoint(out_dir: Path) -> Path | None:
    steps = sorted((out_dir / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]))
    done = [p for p in steps if (p / "state.json").exists()]  # written last: complete
    return done[-1] if done else None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def train(cfg: TrainConfig, on_step: Callable[[dict], None] | None = None) -> list[dict]:
    """Run ``cfg``; returns the metrics rows of the steps it ran."""
    cfg.validate()
    return asyncio.run(_train(cfg, on_step))


async def _train(cfg: TrainConfig, on_step: Callable[[dict], None] | None) -> list[dict]:
    # Everything that can fail cheaply fails first: hooks, recipe config, data rows.
    generate = load_generate(cfg.generate_fn or f"recipes.{cfg.recipe}.generate.generate")
    reward = load_reward(cfg.reward_fn or f"recipes.{cfg.recipe}.reward.reward")
    recipe_config = load_recipe_config(
        cfg.recipe_config or default_recipe_config(cfg.recipe), cfg.recipe_args
    )
    out = Path(cfg.output_dir)
    ckpt = latest_checkpoint(out)
    if ckpt is not None and not cfg.resume:
        raise ValueError(
            f"{out} already holds checkpoints ({ckpt.name}): pass --resume true to continue "
            "that run, or choose another --output_dir"
        )
    out.mkdir(parents=True, exist_ok=True)
    seed_everything(cfg.seed)
    buffer = DataBuffer(replace(cfg.data, path=resolve_data_path(cfg.data.path)))

    # The model, its trainer, and the state of a resumed run.
    model_path = materialize_model(cfg.model, out / "models")
    tokenizer = load_tokenizer(model_path)
    from kernel.train.torch_backend import TorchTrainer  # heavy: after every cheap check

    trainer_cfg = replace(cfg.trainer, temperature=cfg.rollout.temperature)
    trainer = TorchTrainer(model_path, cfg.optim, cfg.loss, trainer_cfg, cfg.num_steps)
    start, version = 0, 0
    if ckpt is not None:
        state = json.loads((ckpt / "state.json").read_text())
        trainer.load(ckpt / "trainer")
        buffer.load_state_dict(state["buffer"])
        start, version = state["step"], state["weight_version"]
        random.setstate(_tuple_state(state["python_rng"]))
    (out / "config.json").write_text(json.dumps(_jsonable(cfg), indent=1))
    logger = MetricsLogger(out, cfg.log, _jsonable(cfg), start)

    # Engines (started here, or given by URL), agent handles, rollouts, weight sync.
    pool = EnginePool(cfg.engine, model_path, out / "logs", seed=cfg.seed)
    with pool:
        generators, clients = pool.clients()
        sync = WeightSync(cfg.sync, clients, out)
        sampling = {"temperature": cfg.rollout.temperature, "top_p": cfg.rollout.top_p}
        agents = {
            name: AgentHandle(
                name,
                generators,
                tokenizer,
                sampling,
                cfg.rollout.max_response_len,
                cfg.rollout.max_context_len,
            )
            for name in cfg.agents
        }
        ctx = RolloutContext(agents=agents, config=recipe_config, run=cfg, step=start)
        manager = RolloutManager(
            generate, reward, cfg.reward, cfg.rollout.concurrency, cfg.rollout.timeout_s
        )
        rows: list[dict] = []
        try:
            # Engines serve the trainer's weights from the first step on: a resumed run pushes
            # its checkpoint, a fresh one only labels the base weights with version 0.
            if start > 0:
                await sync.push(trainer, version)
            else:
                await asyncio.gather(*(c.update_weight_version(str(version)) for c in clients))

            next_batch = None
            for step in range(start, cfg.num_steps):
                t_step = time.perf_counter()
                # 1-2. rollout with rewards (in async mode it was started during the last step)
                batch = await (next_batch or _collect(cfg, manager, ctx, buffer, step))
                next_batch = None
                if cfg.async_mode and step + 1 < cfg.num_steps:
                    next_batch = asyncio.ensure_future(
                        _collect(cfg, manager, ctx, buffer, step + 1)
                    )
                samples, stale = _drop_stale(batch.samples, version, cfg.max_staleness)

                # 3. advantages, per (prompt, agent[, turn])
                adv_metrics = compute_advantages(samples, cfg.advantage)

                # 4. train the shared model on every agent's samples (off the event loop, so an
                # async rollout keeps going)
                t0 = time.perf_counter()
                train_metrics = await asyncio.to_thread(trainer.train_step, samples)
                train_s = time.perf_counter() - t0

                # 5. weight sync
                version += 1
                sync_metrics = await sync.push(trainer, version)

                # 6. log and checkpoint
                row = {"step": step, "weight_version": version, **batch.metrics}
                row["data/rows"] = sorted(r.group[0].metadata["row"] for r in batch.results)
                row |= _agent_metrics(samples) | adv_metrics | batch.stats.as_metrics()
                row |= {f"train/{k}": v for k, v in train_metrics.items()} | sync_metrics
                row |= {"staleness/dropped": float(stale), "time/rollout_s": batch.stats.seconds}
                row |= {"time/train_s": train_s, "time/sync_s": sync_metrics["sync/time_s"]}
                if cfg.eval.every and (
                    (step + 1) % cfg.eval.every == 0 or step + 1 == cfg.num_steps
                ):
                    row |= await _evaluate(cfg, manager, ctx)
                row["time/step_s"] = time.perf_counter() - t_step
                row["tokens_per_s"] = train_metrics.get("tokens", 0.0) / row["time/step_s"]
                logger.log(row)
                rows.append(row)
                if on_step:
                    on_step(row)
                ctx.step = step + 1
                last = step + 1 == cfg.num_steps
                if last or (cfg.save_every and (step + 1) % cfg.save_every == 0):
                    in_flight = [] if next_batch is None else await _handed_out(next_batch)
                    _checkpoint(cfg, trainer, buffer, step + 1, version, in_flight)
            return rows
        finally:
            await sync.aclose()
            logger.close()
            await asyncio.gather(*(c.aclose() for c in {*generators, *clients}))


async def _collect(cfg, manager, ctx, buffer, step: int) -> Batch:
    """Roll out prompts_per_step groups; refill groups dropped (DAPO) or aborted."""
    want = cfg.data.prompts_per_step
    results: list[GroupResult] = []
    handed_out: list[list[Sample]] = []
    total = RolloutStats()
    for _ in range(1 + cfg.max_refill_rounds):
        groups = buffer.next_groups(want - len(results))
        handed_out += groups
        kept, aborted, stats = await manager.run(ctx, groups, cfg.dynamic_sampling)
        for r in aborted:  # rolled out again, whole, in a later round or step
            buffer.requeue(r.group)
        results += kept
        total.add(stats)
        if len(results) >= want:
            break
    return Batch(results, handed_out, total, {"rollout/groups": float(len(results))})


async def _handed_out(next_batch: asyncio.Future) -> list[list[Sample]]:
    """The groups of the rollout in flight (async mode), which a checkpoint must requeue."""
    batch = await next_batch  # it finishes quickly once training is done; simplest and exact
    return batch.handed_out


def _drop_stale(samples: list[Sample], version: int, max_staleness: int):
    """Keep samples whose oldest weight version is within max_staleness of ``version``."""
    kept = [
        s
        for s in samples
        if not s.weight_versions or version - min(s.weight_versions) <= max_staleness
    ]
    return kept, len(samples) - len(kept)


def _agent_metrics(samples: list[Sample]) -> dict[str, float]:
    """Per agent: reward, sampled tokens, truncation and failure rates, the share of its
    dialogue's tokens it trains on; per episode: the recipe's ``metadata["metrics"]``, averaged
    over the episodes that report each key (one sample per episode carries them)."""
    row: dict[str, float] = {}
    for agent in sorted({s.agent for s in samples}):
        mine = [s for s in samples if s.agent == agent]
        lengths = [sum(s.loss_mask) for s in mine]
        row[f"{agent}/reward"] = mean(s.raw_reward for s in mine)  # as the recipe scored it
        row[f"{agent}/weighted_reward"] = mean(s.reward for s in mine)  # what is optimised
        row[f"{agent}/response_length"] = mean(lengths)
        row[f"{agent}/mask_share"] = mean(
            sum(s.loss_mask) / (len(s.prompt_ids) + s.response_length) for s in mine if s.prompt_ids
        )
        row[f"{agent}/truncated"] = mean(float(s.status is Status.TRUNCATED) for s in mine)
        row[f"{agent}/failed"] = mean(float(s.status is Status.FAILED) for s in mine)
        row[f"{agent}/samples"] = float(len(mine))
    episodes: dict[tuple, dict] = {}
    tokens: dict[tuple, int] = {}  # every agent's dialogue tokens of the episode
    for s in samples:
        episode = (s.group_id, s.index)
        tokens[episode] = tokens.get(episode, 0) + len(s.prompt_ids) + s.response_length
        if "metrics" in s.metadata:
            episodes.setdefault(episode, s.metadata["metrics"])
    for key in sorted({k for m in episodes.values() for k in m}):
        row[f"episode/{key}"] = mean(m.get(key) for m in episodes.values())
    row["episode/tokens"] = mean(tokens.values())
    row["reward"] = mean(s.raw_reward for s in samples)
    return {k: v for k, v in row.items() if v is not None}


async def _evaluate(cfg, manager, ctx) -> dict[str, float]:
    """avg@k and pass@k per agent on the held-out prompts (no training on them), on the
    rewards as the recipe scored them (before the kernel's weighting)."""
    data = replace(
        cfg.data,
        path=resolve_data_path(cfg.eval.path),
        n_samples_per_prompt=cfg.eval.n_samples,
        shuffle=False,
        max_prompts=cfg.eval.max_prompts,
    )
    buffer = DataBuffer(data)
    kept, _, _ = await manager.run(ctx, buffer.next_groups(len(buffer)))
    row: dict[str, float] = {}
    agents = sorted({s.agent for r in kept for s in r.samples})
    for agent in agents:
        per_prompt = []
        for r in kept:
            mine = [s for s in r.samples if s.agent == agent and s.raw_reward is not None]
            if mine:
                passed = [
                    s.metadata.get("correct", s.raw_reward >= cfg.eval.pass_threshold) for s in mine
                ]
                per_prompt.append((mean(s.raw_reward for s in mine), any(passed)))
        if per_prompt:
            k = cfg.eval.n_samples
            row[f"eval/{agent}/avg@{k}"] = mean(a for a, _ in per_prompt)
            row[f"eval/{agent}/pass@{k}"] = mean(float(p) for _, p in per_prompt)
    return row


def _checkpoint(cfg, trainer, buffer, step: int, version: int, in_flight) -> Path:
    """Save everything a resume needs; state.json is written last, marking it complete."""
    root = Path(cfg.output_dir) / "checkpoints"
    path = root / f"step_{step}"
    trainer.save(path / "trainer")
    state = buffer.state_dict(in_flight=in_flight)
    (path / "state.json").write_text(
        json.dumps(
            {
                "step": step,
                "weight_version": version,
                "buffer": state,
                "python_rng": random.getstate(),
            }
        )
    )
    for old in root.glob("step_*"):  # keep the newest two
        if old != path and int(old.name[5:]) < step - max(cfg.save_every, 1):
            shutil.rmtree(old, ignore_errors=True)
    return path


def _tuple_state(state):
    """random.getstate() after a JSON round trip: lists back to tuples."""
    return tuple(tuple(x) if isinstance(x, list) else x for x in state)


def _jsonable(cfg) -> dict:
    import dataclasses

    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
