"""The training loop: Generate -> Reward -> Advantages -> Train -> Sync, step after step.

Read ``_train`` top to bottom. Per step:

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

With ``rollout.over_sample`` (partial rollouts, ``Runtime.rollout``) a step trains on the first
prompt groups that finish; the others run on into the next step or are cancelled and requeued.

In ``async_mode`` the rollout of step k+1 runs while step k trains (one step off-policy): the
samples carry the weight versions that made them, the staleness is logged and bounded, and
truncated importance sampling (``loss.tis_cap``, else ``loss.stale_tis_cap`` for batches with
stale samples) corrects the lag.

With agents as independent jobs (``kernel.run.jobs``) a job whose partner agents are remote
waits for their jobs before each rollout and commits their samples after the advantages; a
consuming job takes each step's batch from the queue instead of rolling out.

What the loop acts on -- per model its engines, trainer, weight sync and schedule; the data
buffer, agent handles, rollout manager and logger -- is started, held and stopped by
``kernel.run.runtime.Runtime``; checkpoints are described there.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kernel.advantages import compute_advantages
from kernel.engine.pool import EnginePool
from kernel.metrics import mean, process_age
from kernel.run.config import RunPlan, TrainConfig, resolve
from kernel.run.runtime import RunningModel, Runtime
from kernel.sample import Sample, Status


def train(
    run: TrainConfig | RunPlan,
    on_step: Callable[[dict], None] | None = None,
    placement: dict[str, Any] | None = None,
    pools: Sequence[EnginePool] = (),
) -> list[dict]:
    """Run ``run`` (a config, resolved here, or its plan); returns the metrics rows of the
    steps it ran. ``placement`` (from ``kernel launch``, a kernel.cluster.run.RayPlacement per
    owner agent) puts each model's Ray trainer ranks on their placed nodes and GPUs, and says
    which models are colocated. ``pools``: the models' engines, launched already
    (``kernel.run.engines.early_pools``); they are stopped with the run."""
    return asyncio.run(_train(resolve(run), on_step, placement or {}, pools))


def frozen(cfg: TrainConfig, checkpoint: str | None = None) -> TrainConfig:
    """``cfg`` with every agent frozen (no trainer is built), not yet resolved; ``checkpoint``
    (a run's ``checkpoints/step_N``) serves each model as that step saved it
    (``trainers/<owner>``): the trained weights, or for a LoRA model its base with each agent's
    adapter (``adapters/<agent>``)."""
    agents = []
    for spec in cfg.agent_specs():
        if spec.remote:  # another job's agent: served by that job as it is
            agents.append(spec)
            continue
        saved = Path(checkpoint or "") / "trainers" / (spec.share_model_with or spec.name)
        changes: dict[str, Any] = {"trainable": False}
        if checkpoint and (saved / "adapters").is_dir():
            if (saved / "adapters" / spec.name).is_dir():
                changes["lora"] = {**spec.lora, "path": str(saved / "adapters" / spec.name)}
        elif checkpoint and spec.share_model_with is None:  # an owner: the checkpoint's model
            if not (saved / "config.json").exists():
                raise ValueError(f"checkpoint {checkpoint} has no model for agent {spec.name!r}")
            changes["model"] = str(saved)
        agents.append(dataclasses.replace(spec, **changes))
    return dataclasses.replace(cfg, agents=agents)


def evaluate(cfg: TrainConfig, checkpoint: str | None = None) -> dict[str, float]:
    """Evaluate ``cfg``'s models on ``eval.path`` without training them: avg@n and pass@k per
    agent (``Runtime.evaluate``), also written to ``<output_dir>/eval.json`` and, per item, to
    ``<output_dir>/eval/step_0.jsonl``. ``checkpoint``: as in ``frozen``."""
    if not cfg.eval.path:
        raise ValueError("eval.path: kernel eval needs the data set to evaluate on")
    plan = frozen(cfg, checkpoint).plan()

    async def run() -> dict[str, float]:
        async with Runtime.open(plan, {}) as rt:
            return await rt.evaluate(0)

    row = asyncio.run(run())
    (Path(cfg.output_dir) / "eval.json").write_text(json.dumps(row, indent=1))
    return row


async def _train(
    plan: RunPlan, on_step, placement: dict[str, Any], pools: Sequence[EnginePool]
) -> list[dict]:
    rows: list[dict] = []
    cfg = plan.cfg  # its run-wide sections; per model and per agent, the plan
    async with Runtime.open(plan, placement, pools) as rt:
        models = rt.models
        startup_s = process_age()  # from the command to the first rollout (or eval)
        if cfg.eval.at_start and rt.start == 0:  # the starting weights, for before/after
            rt.logger.log({"step": -1, **await rt.evaluate(0)})
        next_batch = None
        replay = collections.deque(maxlen=cfg.replay_groups)  # recent groups, newest first
        t_first = time.monotonic()  # max_minutes counts from here
        for step in range(rt.start, cfg.num_steps):
            t_step, cpu_step, requests = time.perf_counter(), time.thread_time(), rt.requests
            # 1-2. rollout with rewards (in async mode it was started during the last step); a
            # job whose partners are other jobs waits for them to train far enough first, and
            # a consuming job takes the batch another job rolled out for it (kernel.run.jobs)
            waited = await rt.wait_for_partners(step) if rt.remote else 0.0
            if cfg.queue.consume:
                batch = await rt.fetch(step)
            else:
                batch = await (next_batch or rt.rollout(step))
            elapsed = time.monotonic() - t_first
            last = step + 1 == cfg.num_steps or 0 < cfg.max_minutes * 60 <= elapsed
            async_next = cfg.async_mode and not last
            next_batch = asyncio.ensure_future(rt.rollout(step + 1)) if async_next else None
            samples, stale = _drop_stale(batch.samples, models, cfg.max_staleness)

            # 3. advantages, per (prompt, agent[, turn]) (a consuming job's came with its
            # batch); the remote agents' samples go to their jobs
            adv_metrics = {} if cfg.queue.consume else compute_advantages(samples, cfg.advantage)
            if rt.critic is not None:  # MAAC: the run's one critic sets every agent's (gae)
                adv_metrics |= await rt.critic_step(samples)
            if rt.remote:
                adv_metrics |= await rt.commit(step, samples) | {"queue/wait_s": waited}

            # 4. train each model due this step on the samples of the agents it plays, and on
            # those it kept from the steps it sat out (update_every; TIS corrects the stale
            # ones); a model not due keeps this step's
            due = [m for m in models if m.trains_at(step)]
            trained_versions = {m.owner: m.version for m in models}
            batches, dropped, replayed = _batches(cfg, models, due, samples, rt.buffer, replay)
            replay.extendleft(r.samples for r in reversed(batch.results))  # newest first
            # the post-sync checks of the last pushes ran beside this rollout; they read the
            # weights this step changes, so they end here (or fail the run)
            checks = await rt.checked()
            t0 = time.perf_counter()
            train_metrics = await rt.train(due, batches)
            train_s = time.perf_counter() - t0

            # 5. weight sync of the models that trained (and of restarted engines)
            sync_metrics = await rt.sync(due, samples)
            if cfg.queue.consume:
                await rt.trained(step)
            if last:  # no rollout left to run the last checks beside
                checks = [c | after for c, after in zip(checks, await rt.checked(), strict=True)]

            # 6. log, evaluate, checkpoint
            row = {"step": step, **batch.metrics}
            if step == rt.start:
                row["time/startup_s"] = startup_s
                row |= {f"time/startup/{k}_s": v for k, v in rt.startup.items()}
            row |= _model_metrics(models, due, train_metrics, sync_metrics, checks)
            row["data/rows"] = sorted(r.group[0].metadata["row"] for r in batch.results)
            row |= _agent_metrics(samples, models, trained_versions, rt.buffer)
            row |= adv_metrics | batch.stats.as_metrics()
            row["staleness/dropped"] = float(stale + dropped)
            if cfg.replay_groups:
                row["replay/samples"] = float(replayed)
            row["time/rollout_s"] = batch.stats.seconds
            row["time/train_s"] = train_s
            row["engines/restarts"] = float(sum(m.pool.restarts for m in models))
            row["time/sync_s"] = sum(m["sync/time_s"] for m in sync_metrics)
            if cfg.eval.every and ((step + 1) % cfg.eval.every == 0 or last):
                row |= await rt.evaluate(step + 1)
            row["time/step_s"] = time.perf_counter() - t_step
            row["time/driver_cpu_s"] = time.thread_time() - cpu_step
            row["rollout/requests"] = rt.requests - requests
            tokens = sum(m.get("tokens", 0.0) for m in train_metrics)
            row["tokens_per_s"] = tokens / row["time/step_s"]
            rt.logger.log(row)
            rows.append(row)
            if on_step:
                on_step(row)
            rt.ctx.step = step + 1
            if last or (cfg.save_every and (step + 1) % cfg.save_every == 0):
                await rt.checkpoint(step + 1, next_batch)
            if last:
                break
    return rows


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


def _batches(cfg, models: list[RunningModel], due: list[RunningModel], samples, buffer, replay):
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


def _drop_stale(samples: list[Sample], models: list[RunningModel], max_staleness: int):
    """Keep samples whose oldest weight version is within max_staleness of the current version
    of their agent's model."""
    version = {spec.name: m.version for m in models for spec in m.agents}
    # a remote agent's samples are judged by the job that trains it (kernel.run.jobs)
    kept = [
        s
        for s in samples
        if s.agent not in version or _staleness(s, version[s.agent]) <= max_staleness
    ]
    return kept, len(samples) - len(kept)


def _staleness(sample: Sample, version: int) -> int:
    """How many weight versions behind its model the oldest token of ``sample`` is."""
    return version - min(sample.weight_versions) if sample.weight_versions else 0


def _agent_metrics(
    samples: list[Sample], models: list[RunningModel], trained_versions: dict[str, int], buffer
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
        if agent in version:  # not a remote agent (kernel.run.jobs)
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
