"""The training loop: Generate -> Reward -> Advantages -> Train -> Sync, step after step.

Read ``train`` top to bottom. Per step:

1. pull prompt groups from the DataBuffer and roll them out through the recipe's generate hook
   on the engines (bounded concurrency, per-episode timeouts, failures masked, aborted groups
   requeued, DAPO refill when dynamic sampling drops constant groups);
2. rewards (recipe hook + kernel weighting) come back with the episodes;
3. advantages, grouped per (prompt, agent[, turn]) - never batch-wide unless asked for;
4. train each model due this step (``update_every``) on the samples of the trainable agents
   it plays (agents sharing a model train it together; an agent with its own model trains its
   own): ``trainer.ppo_epochs`` x ``trainer.num_minibatches`` updates, one by default. A model
   not due keeps its samples in the buffer's per-agent queue for its next update (each rollout
   is trained on once); ``replay_groups`` adds recent groups again;
5. push each trained model's weights to its own engines (pause -> update -> version ->
   continue); engines restarted after a crash get the current weights before they rejoin;
6. log (metrics.jsonl, optional TensorBoard / W&B), evaluate every ``eval.every`` steps on
   held-out prompts (per-item results in ``<output_dir>/eval/step_<updates>.jsonl``;
   ``eval.at_start`` adds the starting weights), and checkpoint.

``max_minutes`` ends a run early: the step whose rollout ends past the limit is the last one,
evaluated and checkpointed as such.

In ``async_mode`` the rollout of step k+1 runs while step k trains (one step off-policy): the
samples carry the weight versions that made them, the staleness is logged and bounded, and
truncated importance sampling (``loss.tis_cap``, else ``loss.stale_tis_cap`` for batches with
stale samples) corrects the lag.

A checkpoint (``<output_dir>/checkpoints/step_N``) holds each model's trainer
(``trainers/<owner agent>``: weights, optimiser, schedule, RNG), the buffer position with
every prompt group handed out but not yet trained (so a crash mid-step neither skips nor
repeats a prompt) and the samples queued for a later update, the step and each model's weight
version.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from kernel.advantages import compute_advantages
from kernel.agents import AgentHandle, AgentSpec, model_groups
from kernel.buffer import DataBuffer
from kernel.config import ModelSettings, TrainConfig
from kernel.engine.batcher import RequestBatcher
from kernel.engine.pool import EnginePool
from kernel.hooks import (
    RolloutContext,
    default_recipe_config,
    load_generate,
    load_recipe_config,
    load_reward,
)
from kernel.metrics import MetricsLogger, mean, process_age
from kernel.models import load_tokenizer, materialize_model
from kernel.rollout import GroupResult, RolloutManager, RolloutStats
from kernel.sample import Sample, Status
from kernel.sync.push import SyncConfig, WeightSync
from kernel.train.ray_trainer import RayTrainer
from kernel.train.thread import TrainerThread
from kernel.train.trainer import build_trainer

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


def train(
    cfg: TrainConfig,
    on_step: Callable[[dict], None] | None = None,
    placement: dict[str, Any] | None = None,
) -> list[dict]:
    """Run ``cfg``; returns the metrics rows of the steps it ran. ``placement`` (from
    ``kernel launch``, kernel.cluster.run.ModelPlacement per owner agent) puts each model's
    Ray trainer ranks on planned nodes and GPUs, and says which models are colocated."""
    cfg.validate()
    return asyncio.run(_train(cfg, on_step, placement or {}))


async def _train(cfg: TrainConfig, on_step, placement: dict[str, Any]) -> list[dict]:
    # Everything that can fail before a process starts fails first: hooks, recipe config.
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

    # The models (one per agent that does not share another's): their engines start first and
    # load while the data, tokenizers and trainers (in this process, or Ray actor groups) are
    # read and built (a bad data row stops them again); then the state of a resumed run.
    with contextlib.ExitStack() as stack:  # Ray, if this run starts it, stops last
        if cfg.ray.enabled and cfg.ray.start():
            import ray

            stack.callback(ray.shutdown)
        models = _plan_models(cfg, out, placement)
        for m in models:
            stack.push(m.pool)  # stopped on the way out (entering it would wait for them)
            m.pool.launch()
        buffer = DataBuffer(replace(cfg.data, path=resolve_data_path(cfg.data.path)))
        for m in models:
            m.tokenizer = load_tokenizer(m.agents[0].tokenizer or m.path)
            stack.callback(m.thread.close)
            m.trainer = m.thread.call(_build_trainer, cfg, m, placement.get(m.owner))
        start = 0
        if ckpt is not None:
            state = json.loads((ckpt / "state.json").read_text())
            for m in models:
                if m.trainer is not None:
                    m.thread.call(m.trainer.load, ckpt / "trainers" / m.owner)
                m.version = state["weight_versions"][m.owner]
            buffer.load_state_dict(state["buffer"])
            start = state["step"]
            random.setstate(_tuple_state(state["python_rng"]))
        (out / "config.json").write_text(json.dumps(_jsonable(cfg), indent=1))
        logger = MetricsLogger(out, cfg.log, _jsonable(cfg), start)

        # Engines (started above, or given by URL) per model, agent handles, rollouts, sync.
        for m in models:
            m.pool.wait_healthy()
            m.generators, m.clients = m.pool.clients()
            m.sync = WeightSync(
                m.sync_config, m.clients, out / "sync" / m.owner, m.temperature, m.thread.run
            )
        agents = {}
        for m in models:
            window = m.settings.engine.batch_window_ms / 1000
            m.batcher = batcher = RequestBatcher(m.generators, m.pool, window)
            for spec in m.agents:
                tokenizer = _with_template(m.tokenizer, spec.chat_template)
                rollout = cfg.agent_rollout(spec)
                sampling = {"temperature": rollout.temperature, "top_p": rollout.top_p}
                agents[spec.name] = AgentHandle(
                    spec.name,
                    m.generators,
                    tokenizer,
                    sampling,
                    rollout.max_response_len,
                    rollout.max_context_len,
                    pool=m.pool,
                    batcher=batcher,
                )
        agents = {name: agents[name] for name in (s.name for s in cfg.agent_specs())}
        ctx = RolloutContext(agents=agents, config=recipe_config, run=cfg, step=start)
        manager = RolloutManager(
            generate, reward, cfg.reward, cfg.rollout.concurrency, cfg.rollout.timeout_s
        )
        rows: list[dict] = []
        watchers = [asyncio.ensure_future(m.pool.watch()) for m in models]
        try:
            # Engines serve the trainers' weights from the first step on: a resumed run pushes
            # its checkpoints, a fresh one only labels the base weights with version 0.
            for m in models:
                if start > 0 and m.trainer is not None:
                    await m.sync.push(m.trainer, m.version)
                else:
                    await asyncio.gather(
                        *(c.update_weight_version(str(m.version)) for c in m.clients)
                    )

            if cfg.eval.at_start and start == 0:  # the starting weights, for before/after
                logger.log({"step": -1, **await _evaluate(cfg, manager, ctx, 0)})

            next_batch = None
            replay = collections.deque(maxlen=cfg.replay_groups)  # recent groups, newest first
            startup_s = process_age()  # from the command to the first rollout
            t_first = time.monotonic()  # max_minutes counts from here
            for step in range(start, cfg.num_steps):
                t_step = time.perf_counter()
                cpu_step = time.thread_time()  # the driver: clients, hooks, advantages, logging
                requests = sum(m.batcher.stats["requests"] for m in models)
                # 1-2. rollout with rewards (in async mode it was started during the last step)
                batch = await (next_batch or _collect(cfg, manager, ctx, buffer, step))
                next_batch = None
                elapsed = time.monotonic() - t_first
                last = step + 1 == cfg.num_steps or 0 < cfg.max_minutes * 60 <= elapsed
                if cfg.async_mode and not last:
                    next_batch = asyncio.ensure_future(
                        _collect(cfg, manager, ctx, buffer, step + 1)
                    )
                samples, stale = _drop_stale(batch.samples, models, cfg.max_staleness)

                # 3. advantages, per (prompt, agent[, turn])
                adv_metrics = compute_advantages(samples, cfg.advantage)

                # 4. train each model due this step on the samples of the agents it plays, and
                # on those it kept from the steps it sat out (update_every; TIS corrects the
                # stale ones); a model not due keeps this step's. Off the event loop, so an
                # async rollout keeps going; models train concurrently; colocated engines give
                # their GPU memory up meanwhile.
                due = [m for m in models if m.trains_at(step)]
                trained_versions = {m.owner: m.version for m in models}
                batches, dropped, replayed = _batches(cfg, models, due, samples, buffer, replay)
                replay.extendleft(r.samples for r in reversed(batch.results))  # newest first
                # the post-sync checks of the last pushes ran beside this rollout; they read
                # the weights this step changes, so they end here (or fail the run)
                checks = [await m.sync.checked() for m in models]
                t0 = time.perf_counter()
                train_metrics = await asyncio.gather(*(m.train_step(batches[m.owner]) for m in due))
                train_s = time.perf_counter() - t0

                # 5. weight sync of the models that trained, and of engines restarted after a
                # crash (which rejoin the rotation only once they serve the current weights)
                restarted = {m.owner: await m.pool.restart_dead() for m in models}
                sync_metrics = []
                for m in models:
                    await m.sync.reset(restarted[m.owner])
                    if m in due:
                        m.version += 1
                        # checked on the first prompt it trained on (SyncConfig.check_tokens)
                        probe = next((s.prompt_ids for s in m.own(samples)), None)
                        sync_metrics.append(await m.sync.push(m.trainer, m.version, probe))
                    elif restarted[m.owner] and m.trainer is not None:
                        await m.sync.push(m.trainer, m.version)
                    await m.pool.readmit(restarted[m.owner])
                if last:  # no rollout left to run the last checks beside
                    for i, m in enumerate(models):
                        checks[i] |= await m.sync.checked()

                # 6. log and checkpoint
                row = {"step": step, **batch.metrics}
                if step == start:
                    row["time/startup_s"] = startup_s
                row |= _model_metrics(models, due, train_metrics, sync_metrics, checks)
                row["data/rows"] = sorted(r.group[0].metadata["row"] for r in batch.results)
                row |= _agent_metrics(samples, models, trained_versions, buffer)
                row |= adv_metrics | batch.stats.as_metrics()
                row["staleness/dropped"] = float(stale + dropped)
                if cfg.replay_groups:
                    row["replay/samples"] = float(replayed)
                row["time/rollout_s"] = batch.stats.seconds
                row["time/train_s"] = train_s
                row["engines/restarts"] = float(sum(m.pool.restarts for m in models))
                row["time/sync_s"] = sum(m["sync/time_s"] for m in sync_metrics)
                if cfg.eval.every and ((step + 1) % cfg.eval.every == 0 or last):
                    row |= await _evaluate(cfg, manager, ctx, step + 1)
                row["time/step_s"] = time.perf_counter() - t_step
                row["time/driver_cpu_s"] = time.thread_time() - cpu_step
                sent = sum(m.batcher.stats["requests"] for m in models)
                row["rollout/requests"] = sent - requests
                tokens = sum(m.get("tokens", 0.0) for m in train_metrics)
                row["tokens_per_s"] = tokens / row["time/step_s"]
                logger.log(row)
                rows.append(row)
                if on_step:
                    on_step(row)
                ctx.step = step + 1
                if last or (cfg.save_every and (step + 1) % cfg.save_every == 0):
                    in_flight = [] if next_batch is None else await _handed_out(next_batch)
                    await _checkpoint(cfg, models, buffer, step + 1, in_flight)
                if last:
                    break
            return rows
        finally:
            for w in watchers:
                w.cancel()
            for m in models:
                if m.sync is not None:
                    await m.sync.aclose()
                await asyncio.gather(*(c.aclose() for c in {*m.generators, *m.clients}))
                if m.trainer is not None and hasattr(m.trainer, "close"):
                    await m.thread.run(m.trainer.close)
            logger.close()


@dataclass
class Model:
    """One model of the run: the agents it plays, its trainer, engines and weight version."""

    owner: str  # the agent whose spec defines the model
    agents: list[AgentSpec]  # the owner first, then the agents sharing its model
    settings: ModelSettings
    pool: EnginePool
    path: str = ""  # the model's folder (or name), as its engines and trainer load it
    tokenizer: Any = None
    trainer: Any = None  # TorchTrainer / MegatronTrainer; None when every agent is frozen
    thread: TrainerThread = None  # every call into the trainer runs on it (kernel.train.thread)
    sync: WeightSync | None = None
    batcher: Any = None  # the RequestBatcher its agents' generate calls go through
    version: int = 0
    generators: list = field(default_factory=list)
    clients: list = field(default_factory=list)
    sync_config: SyncConfig = field(default_factory=SyncConfig)  # transport, buckets, check
    colocate: bool = False  # engines on the trainer's GPUs (kernel launch)
    temperature: float = 1.0  # the owner's sampling temperature: the trainer's and the check's

    def __post_init__(self) -> None:
        if self.thread is None:
            self.thread = TrainerThread(f"trainer-{self.owner}")

    @property
    def trained(self) -> set[str]:
        """The agents whose samples this model trains on."""
        return {s.name for s in self.agents if s.trainable}

    def trains_at(self, step: int) -> bool:
        return self.trainer is not None and step % self.settings.update_every == 0

    def own(self, samples: list[Sample]) -> list[Sample]:
        return [s for s in samples if s.agent in self.trained]

    async def train_step(self, samples: list[Sample]) -> dict[str, float]:
        """Train on ``samples`` (this model's), off the event loop, at the current weight
        version (samples of older ones are stale: TIS). Colocated engines release their memory
        (weights and KV cache) for it and resume it after; the weight sync that follows gives
        them the new weights before they generate again. A release needs an idle engine, so
        they first pause with abort: a straggler a rollout timeout gave up on ends there, and
        nothing new starts until the sync's continue."""
        if not self.colocate:
            return await self.thread.run(self.trainer.train_step, samples, self.version)
        await asyncio.gather(*(c.pause("abort") for c in self.clients))
        await asyncio.gather(*(c.release_memory_occupation() for c in self.clients))
        try:
            return await self.thread.run(self.trainer.train_step, samples, self.version)
        finally:
            await asyncio.gather(*(c.resume_memory_occupation() for c in self.clients))


def _plan_models(cfg: TrainConfig, out: Path, placement: dict[str, Any]) -> list[Model]:
    """The models of the run, each with its folder and engine pool (not launched yet; its
    tokenizer and trainer come later), placed as ``placement`` says for the owners it names."""
    models = []
    for i, specs in enumerate(model_groups(cfg.agent_specs()).values()):
        settings = cfg.model_settings(specs[0])
        path = materialize_model(settings.model, out / "models")
        logs = out / "logs" / specs[0].name
        pool = EnginePool(settings.engine, path, logs, seed=cfg.seed + 1000 * i)
        temperature = cfg.agent_rollout(specs[0]).temperature
        model = Model(
            specs[0].name,
            specs,
            settings,
            pool,
            path=path,
            sync_config=cfg.sync,
            temperature=temperature,
        )
        where = placement.get(model.owner)
        if where is not None:
            model.colocate = where.colocate
            model.sync_config = replace(cfg.sync, transport=where.sync_transport)
        models.append(model)
    return models


def _build_trainer(cfg: TrainConfig, model: Model, where):
    """The trainer of ``model`` (None when none of its agents trains): in this process, or a
    Ray actor group on the ranks ``where`` (a kernel launch placement) or cfg.ray says."""
    if not model.trained:
        return None
    settings = model.settings
    trainer_cfg = replace(settings.trainer, temperature=model.temperature, seed=cfg.seed)
    args = (model.path, settings.optim, settings.loss, trainer_cfg, cfg.num_steps)
    if not cfg.ray.enabled:
        return build_trainer(*args)
    if where:
        options = where.trainer_options
    else:
        options = {
            "world_size": model.agents[0].resources.get("train_gpus") or cfg.ray.ranks,
            "num_cpus": cfg.ray.num_cpus_per_rank,
            "num_gpus": cfg.ray.num_gpus_per_rank,
        }
    return RayTrainer(model.owner, *args, **options)


def _with_template(tokenizer, template: str | None):
    """``tokenizer``, or a copy of it that renders dialogues with ``template`` (Jinja text or
    a file path); the ids of its tokens are unchanged, so the engine and trainer agree."""
    if template is None:
        return tokenizer
    path = Path(template)
    text = path.read_text() if "{" not in template and path.is_file() else template
    if "{" not in text:
        raise ValueError(f"chat_template {template!r} is neither a Jinja template nor a file")
    tokenizer = copy.copy(tokenizer)
    tokenizer.chat_template = text
    return tokenizer


def _model_metrics(models, due, train_metrics, sync_metrics, checks) -> dict[str, float]:
    """Weight versions, training and sync metrics: ``train/loss`` for a run of one model,
    ``train/<owner>/loss`` (and so on) per model when agents have their own models. ``checks``
    (per model) are the post-sync checks that ended this step (of the previous step's push,
    and at the last step of its own)."""
    row: dict[str, float] = {}
    single = len(models) == 1
    for m, check in zip(models, checks, strict=True):
        row["weight_version" if single else f"weight_version/{m.owner}"] = m.version
        scope = "" if single else f"{m.owner}/"
        row |= {f"sync/{scope}{k.removeprefix('sync/')}": v for k, v in check.items()}
    for m, train, sync in zip(due, train_metrics, sync_metrics, strict=True):
        scope = "" if single else f"{m.owner}/"
        row |= {f"train/{scope}{k}": v for k, v in train.items()}
        row |= {f"sync/{scope}{k.removeprefix('sync/')}": v for k, v in sync.items()}
    return row


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


def _batches(cfg, models: list[Model], due: list[Model], samples, buffer, replay):
    """What each model due this step trains on: the samples its agents kept in the buffer from
    the steps it sat out, the replayed groups' samples of its agents, and this step's (those
    beyond max_staleness dropped and counted); a trained model not due keeps this step's
    samples in the buffer instead. Returns ({owner: samples}, dropped, replayed)."""
    batches, dropped, replayed = {}, 0, 0
    for m in models:
        if m in due:
            queued = [s for a in sorted(m.trained) for s in buffer.take(a)]
            queued, lost = _drop_stale(queued, models, cfg.max_staleness)
            again = [s for group in replay for s in m.own(group)]
            again, _ = _drop_stale(again, models, cfg.max_staleness)  # aged out: not lost
            batches[m.owner] = queued + again + m.own(samples)
            dropped, replayed = dropped + lost, replayed + len(again)
        elif m.trainer is not None:
            buffer.put(m.own(samples))
    return batches, dropped, replayed


def _drop_stale(samples: list[Sample], models: list[Model], max_staleness: int):
    """Keep samples whose oldest weight version is within max_staleness of the current version
    of their agent's model."""
    version = {spec.name: m.version for m in models for spec in m.agents}
    kept = [s for s in samples if _staleness(s, version[s.agent]) <= max_staleness]
    return kept, len(samples) - len(kept)


def _staleness(sample: Sample, version: int) -> int:
    """How many weight versions behind its model the oldest token of ``sample`` is."""
    return version - min(sample.weight_versions) if sample.weight_versions else 0


def _agent_metrics(
    samples: list[Sample], models: list[Model], trained_versions: dict[str, int], buffer
) -> dict[str, float]:
    """Per agent: reward, sampled tokens, truncation and failure rates, the share of its
    dialogue's tokens it trains on, how stale its samples are (against the weights trained
    this step, ``trained_versions`` per model owner: 0 in sync mode, 1 one step off-policy),
    how many of its samples wait in the buffer for its model's next update; per episode: the
    recipe's ``metadata["metrics"]``, averaged over the episodes that report each key (one
    sample per episode carries them)."""
    row: dict[str, float] = {}
    version = {spec.name: trained_versions[m.owner] for m in models for spec in m.agents}
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
        row[f"{agent}/staleness"] = mean(_staleness(s, version[agent]) for s in mine)
        row[f"{agent}/queued"] = float(buffer.pending(agent))
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


async def _evaluate(cfg, manager, ctx, updates: int) -> dict[str, float]:
    """avg@k and pass@k per agent on the held-out prompts (no training on them), on the
    rewards as the recipe scored them (before the kernel's weighting), at ``eval.temperature``.
    Every (prompt, agent) result goes to ``<output_dir>/eval/step_<updates>.jsonl`` (``row``:
    the prompt's row in eval.path, ``rewards`` and ``passed`` per episode), so two evaluations
    can be compared item by item."""
    t0 = time.perf_counter()
    data = replace(
        cfg.data,
        path=resolve_data_path(cfg.eval.path),
        n_samples_per_prompt=cfg.eval.n_samples,
        shuffle=False,
        max_prompts=cfg.eval.max_prompts,
    )
    buffer = DataBuffer(data)
    if cfg.eval.temperature is not None:
        agents = {
            name: replace(h, sampling={**h.sampling, "temperature": cfg.eval.temperature})
            for name, h in ctx.agents.items()
        }
        ctx = replace(ctx, agents=agents)
    kept, _, _ = await manager.run(ctx, buffer.next_groups(len(buffer)))
    row: dict[str, float] = {}
    items = []
    k = cfg.eval.n_samples
    for agent in sorted({s.agent for r in kept for s in r.samples}):
        per_prompt = []
        for r in kept:
            mine = [s for s in r.samples if s.agent == agent and s.raw_reward is not None]
            if mine:
                passed = [
                    bool(s.metadata.get("correct", s.raw_reward >= cfg.eval.pass_threshold))
                    for s in mine
                ]
                per_prompt.append((mean(s.raw_reward for s in mine), any(passed)))
                items.append(
                    {
                        "row": r.group[0].metadata["row"],
                        "agent": agent,
                        "rewards": [s.raw_reward for s in mine],
                        "passed": passed,
                    }
                )
        if per_prompt:
            row[f"eval/{agent}/avg@{k}"] = mean(a for a, _ in per_prompt)
            row[f"eval/{agent}/pass@{k}"] = mean(float(p) for _, p in per_prompt)
    path = Path(cfg.output_dir) / "eval" / f"step_{updates}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    row["time/eval_s"] = time.perf_counter() - t0
    return row


async def _checkpoint(cfg, models: list[Model], buffer, step: int, in_flight) -> Path:
    """Save everything a resume needs; state.json is written last, marking it complete."""
    root = Path(cfg.output_dir) / "checkpoints"
    path = root / f"step_{step}"
    for m in models:
        if m.trainer is not None:
            await m.thread.run(m.trainer.save, path / "trainers" / m.owner)
    state = {
        "step": step,
        "weight_versions": {m.owner: m.version for m in models},
        "buffer": buffer.state_dict(in_flight=in_flight),
        "python_rng": random.getstate(),
    }
    (path / "state.json").write_text(json.dumps(state))
    for old in root.glob("step_*"):  # keep the newest two
        if old != path and int(old.name[5:]) < step - max(cfg.save_every, 1):
            shutil.rmtree(old, ignore_errors=True)
    return path


def _tuple_state(state):
    """random.getstate() after a JSON round trip: lists back to tuples."""
    return tuple(tuple(x) if isinstance(x, list) else x for x in state)


def _jsonable(cfg) -> dict:
    return json.loads(json.dumps(asdict(cfg), default=str))
