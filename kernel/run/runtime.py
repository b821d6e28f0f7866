"""What a run holds while it runs, and how it starts and stops: per model its engines, trainer,
weight sync and update schedule (``RunningModel``), and for the run the data buffer, the agent
handles the hooks call, the rollout manager and the metrics logger (``Runtime``). The loop
(kernel.run.loop) only says what happens in a step; everything it acts on lives here.

Names: ``ModelSettings`` are one model's settings, ``ModelPlan`` the model resolved before the
run starts (``kernel.run.config``), ``RunningModel`` the model started; ``kernel.models`` finds,
builds and loads model files. ``Runtime.rollout`` is one step's rollout; ``kernel collect``
(``kernel.run.collect``) writes rollouts as data.

``Runtime.open`` starts a run: the hooks and recipe config load first (a bad path fails before
any process starts); then each model's engines launch and load while the data, tokenizers and
trainers (in this process, or Ray actor groups) are read and built (a bad data row stops them
again); a resumed run loads its checkpoint's state; the engines then serve the trainers'
weights from the first step on. On the way out everything it started stops, the engines by PID.

Evaluation is ``kernel.run.evaluation``; checkpoints (what they hold, how they are saved whole and
resumed) ``kernel.run.checkpoint``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from kernel.buffer import DataBuffer
from kernel.engine.batcher import RequestBatcher
from kernel.engine.client import ClientConfig
from kernel.engine.pool import EnginePool
from kernel.env.spec import env_specs
from kernel.hooks import (
    RolloutContext,
    load_generate,
    load_reward,
    package_file,
)
from kernel.metrics import MetricsLogger, process_age
from kernel.models import check_model, load_tokenizer, materialize_model
from kernel.redact import redact
from kernel.rollout import Flight, GroupResult, RolloutManager, RolloutStats
from kernel.run.agents import AgentHandle, AgentSpec
from kernel.run.checkpoint import checkpoints, resume_from, rng_state, save
from kernel.run.config import ModelPlan, ModelSettings, RunPlan, TrainConfig
from kernel.run.engines import model_pool
from kernel.run.evaluation import eval_data, evaluate
from kernel.run.jobs import JobQueue, RemoteEngine
from kernel.sample import Sample
from kernel.sync.push import WeightSync
from kernel.sync.settings import SyncConfig
from kernel.train.critic import Critic
from kernel.train.ray_trainer import RayTrainer
from kernel.train.thread import TrainerThread
from kernel.train.torch_backend import resolve_device
from kernel.train.trainer import Trainer, build_trainer

log = logging.getLogger(__name__)


@dataclass
class RunningModel:
    """One model of the started run: the agents it plays, its trainer, engines and weight
    version."""

    plan: ModelPlan  # the owner, its agents, settings, sampling temperature and LoRA adapters
    pool: EnginePool
    path: str = ""  # the model's folder (or name), as its engines and trainer load it
    tokenizer: Any = None
    trainer: Trainer | None = None  # None when every agent of the model is frozen
    thread: TrainerThread = None  # every call into the trainer runs on it (kernel.train.thread)
    sync: WeightSync | None = None
    batcher: RequestBatcher | None = None  # the one its agents' generate calls go through
    version: int = 0
    generators: list = field(default_factory=list)
    clients: list = field(default_factory=list)
    sync_config: SyncConfig = field(default_factory=SyncConfig)  # transport, buckets, check
    colocate: bool = False  # engines on the trainer's GPUs (kernel launch)
    gpu_pool: str | None = None  # GPUs shared with other models, in turns (kernel launch)
    engine_ranks: list[list[int]] | None = None  # per engine, the trainer ranks on its GPUs

    def __post_init__(self) -> None:
        if self.thread is None:
            self.thread = TrainerThread(f"trainer-{self.owner}")

    @property
    def owner(self) -> str:
        """The agent whose spec defines the model."""
        return self.plan.owner

    @property
    def agents(self) -> tuple[AgentSpec, ...]:
        """The owner first, then the agents sharing its model."""
        return self.plan.agents

    @property
    def settings(self) -> ModelSettings:
        return self.plan.settings

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


@dataclass
class Runtime:
    """A started run (``Runtime.open``): its models, data, agents, rollouts and logger."""

    cfg: TrainConfig
    models: list[RunningModel]
    buffer: DataBuffer
    ctx: RolloutContext  # what the hooks see: ctx.agents[name], ctx.config, ctx.step
    manager: RolloutManager
    logger: MetricsLogger
    start: int  # the first step to run (after a checkpoint's, when resumed)
    last_checkpoint: Path | None = None  # this run's last save, or its resume: the next keeps it
    queue: JobQueue | None = None  # agents as independent jobs (kernel.run.jobs): the run's Redis
    remote: tuple[str, ...] = ()  # the agents other jobs play (kernel.run.jobs)
    critic: Critic | None = None  # critic.scope run (MAAC): the run's one value model
    carried: list[Flight] = field(default_factory=list)  # over_sample: groups still rolling out
    startup: dict[str, float] = field(default_factory=dict)  # seconds per start-up phase

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, plan: RunPlan, placement: dict[str, Any], pools: Sequence[EnginePool] = ()
    ) -> AsyncIterator[Runtime]:
        """Start the run ``plan`` resolved (``placement``: kernel launch's, per owner agent;
        ``pools``: its models' engines launched already, ``kernel.run.engines.early_pools``);
        stop everything it started, and those pools, on the way out."""
        cfg = plan.cfg  # its run-wide sections; per model and per agent, the plan
        marks = {}  # the process's age as each start-up phase ends
        if pools:  # spawned while this process imported the training stack
            marks["engines_spawn"] = max(p.launched_at or 0.0 for p in pools)
        marks["imports"] = process_age()
        with contextlib.ExitStack() as stack:  # Ray, if this run starts it, stops last
            for pool in pools:
                stack.push(pool)  # stopped on every way out, a bad hook or folder too
            generate_path, reward_path = cfg.hooks()
            generate, reward = load_generate(generate_path), load_reward(reward_path)
            out, found = output_dir(cfg)
            random.seed(cfg.seed)
            torch.manual_seed(cfg.seed)
            plan.check_ray_ranks(placed=placement)
            if cfg.ray.enabled and cfg.ray.start():
                import ray  # optional: only runs on Ray need it

                stack.callback(ray.shutdown)
            # the data first: a missing file or a bad row fails before this run starts an
            # engine (kernel train's early ones, loading meanwhile, are stopped on the way out)
            buffer = DataBuffer(replace(cfg.data, path=package_file(cfg.data.path)))
            if cfg.eval.path:
                DataBuffer(eval_data(cfg))
            marks["hooks_and_data"] = process_age()
            models = plan_models(plan, out, placement, pools)
            critic = run_critic(plan, models)  # MAAC's tokenizer check before engines start
            launch_models(cfg, models, placement, stack, marks)
            start, ckpt = restore(found, models, critic, buffer) if found else (0, None)
            (out / "config.json").write_text(json.dumps(redact(jsonable(cfg)), indent=1))
            logger = MetricsLogger(out, cfg.log, redact(jsonable(cfg)), start)

            connect_engines(models, out)
            marks["engines_wait"] = process_age()
            queue = JobQueue(cfg.queue) if cfg.queue.url else None
            remote = remote_tokenizers(plan, out)  # agents other jobs play
            handles = agent_handles(plan, models, queue, remote)
            ctx = RolloutContext(
                agents=handles,
                config=plan.recipe,
                step=start,
                envs=env_specs(cfg.environments),
            )
            manager = RolloutManager(
                generate, reward, cfg.reward, cfg.rollout.concurrency, cfg.rollout.timeout_s
            )
            runtime = cls(
                cfg, models, buffer, ctx, manager, logger, start, ckpt, queue, tuple(remote), critic
            )
            watchers = [asyncio.ensure_future(m.pool.watch()) for m in models]
            try:
                await runtime._serve_trainer_weights()
                await runtime._meet_partners()
                marks["first_weights"] = process_age()
                runtime.startup = startup_phases(marks)
                yield runtime
            finally:
                for w in watchers:
                    w.cancel()
                await runtime._close()
                for m in models:  # every engine and router ends at once; the stack waits
                    m.pool.terminate()

    async def _serve_trainer_weights(self) -> None:
        """Engines serve the trainers' weights from the first step on: a resumed run pushes its
        checkpoints, a fresh one only labels the base weights with version 0 (and loads its
        LoRA adapters)."""
        for m in self.models:
            if m.trainer is not None and (self.start > 0 or m.plan.trained_adapters):
                await m.sync.push(m.trainer, m.version)
            else:
                await asyncio.gather(*(c.update_weight_version(str(m.version)) for c in m.clients))

    async def _meet_partners(self) -> None:
        """Agents as independent jobs: a new run first checks that the run's Redis keys are its
        own; a consuming job then publishes where its agents are served and how many steps
        they have trained."""
        if self.queue is None:
            return
        fresh = self.start == 0 and not self.cfg.resume  # a resume may find no checkpoint yet
        if not self.cfg.queue.consume:
            if fresh:
                await self.queue.check_fresh(list(self.remote))
            return
        if fresh:
            await self.queue.check_consumer_fresh(self._consumed())
        for m in self.models:
            url = m.generators[0].base_url  # its router, or its one engine (RunPlan checked)
            for agent in sorted(m.trained):
                await self.queue.publish(agent, url, self.start)

    async def wait_for_partners(self, step: int) -> float:
        """Before the rollout of ``step``: until the jobs of the remote agents have trained
        ``step - queue.max_lag`` steps. Returns the seconds waited."""
        t0 = time.perf_counter()
        for agent in self.remote:
            await self.queue.wait_done(agent, step - self.cfg.queue.max_lag)
        return time.perf_counter() - t0

    async def commit(self, step: int, samples: list[Sample]) -> dict[str, float]:
        """The remote agents' samples of ``step`` (advantages computed here) committed as their
        jobs' batch ``step``, one per agent, empty or not; a step already committed (a resumed
        run repeating it) keeps its first batch."""
        repeated = 0
        for agent in self.remote:
            mine = [s for s in samples if s.agent == agent]
            repeated += not await self.queue.commit(agent, step, mine)
        return {"queue/repeated_batches": float(repeated)}

    async def fetch(self, step: int) -> Batch:
        """queue.consume: the batches of ``step`` that another job committed for this job's
        agents, in place of a rollout."""
        t0 = time.perf_counter()
        samples = [s for a in self._consumed() for s in await self.queue.fetch(a, step)]
        groups: dict[int, list[Sample]] = {}
        for s in samples:
            groups.setdefault(s.group_id, []).append(s)
        results = [GroupResult(group=[g[0]], samples=g) for g in groups.values()]
        episodes = len({(s.group_id, s.index) for s in samples})
        stats = RolloutStats(episodes=episodes, seconds=time.perf_counter() - t0)
        return Batch(results, [], stats, {"rollout/groups": float(len(results))})

    async def trained(self, step: int) -> None:
        """queue.consume: ``step`` is trained and its weights are on this job's engines."""
        for agent in self._consumed():
            await self.queue.mark_done(agent, step + 1)

    def _consumed(self) -> list[str]:
        """queue.consume: the agents this job trains on batches from the queue."""
        return sorted({a for m in self.models for a in m.trained})

    async def _close(self) -> None:
        """Close every client, sync, trainer and the logger; each is closed even when closing
        another fails (a dead node's engines, a lost queue), so no trainer's ranks outlive the
        run holding their GPUs; the first failure is raised at the end."""
        steps = [f.cancel for f in self.carried]  # partial rollouts still in flight
        steps += self.ctx.closers  # what the hooks started, while the engines still run
        steps += [self.ctx.agents[agent].clients[0].aclose for agent in self.remote]
        if self.queue is not None:
            steps.append(self.queue.aclose)
        for m in self.models:
            if m.sync is not None:
                steps.append(m.sync.aclose)
            steps += [c.aclose for c in {*m.generators, *m.clients}]
            if m.trainer is not None:
                steps.append(functools.partial(m.thread.run, m.trainer.close))
        errors = []
        for close in steps:
            try:
                await close()
            except BaseException as e:  # a cancelled close too: the rest still get theirs
                errors.append(e)
        self.logger.close()
        if errors:
            raise errors[0]

    @property
    def requests(self) -> int:
        """Generate requests sent to the engines so far."""
        return sum(m.batcher.stats["requests"] for m in self.models)

    async def rollout(self, step: int) -> Batch:
        """Roll out prompts_per_step groups; refill groups dropped (DAPO) or aborted."""
        cfg = self.cfg
        if cfg.rollout.over_sample:
            return await self._partial_rollout(step)
        want = cfg.data.prompts_per_step
        results: list[GroupResult] = []
        handed_out: list[list[Sample]] = []
        total = RolloutStats()
        for _ in range(1 + cfg.max_refill_rounds):
            groups = self.buffer.next_groups(want - len(results))
            handed_out += groups
            kept, aborted, stats = await self.manager.run(self.ctx, groups, cfg.dynamic_sampling)
            for r in aborted:  # rolled out again, whole, in a later round or step
                self.buffer.requeue(r.group)
            results += kept
            total.add(stats)
            if len(results) >= want:
                break
        return Batch(results, handed_out, total, {"rollout/groups": float(len(results))})

    async def _partial_rollout(self, step: int) -> Batch:
        """Partial rollouts (``rollout.over_sample``, slime's APRIL): keep prompts_per_step +
        over_sample groups rolling out (those carried from the last step first) and return the
        first prompts_per_step that finish; each dropped (DAPO) or aborted group is replaced, up
        to max_refill_rounds x prompts_per_step times. The groups still running then carry on
        into the next step (``leftover: carry``; a checkpoint saves them as requeued) or are
        cancelled and requeued (``abort``). No prompt is lost or trained on twice."""
        cfg = self.cfg
        want, refills = cfg.data.prompts_per_step, cfg.data.prompts_per_step * cfg.max_refill_rounds
        flights, self.carried = self.carried, []
        handed_out: list[list[Sample]] = []

        def launch(n: int) -> None:
            for group in self.buffer.next_groups(n):
                handed_out.append(group)
                flights.append(self.manager.start(self.ctx, group, step))

        launch(max(0, want + cfg.rollout.over_sample - len(flights)))
        results: list[GroupResult] = []
        ages: list[int] = []  # of the kept groups, the steps since each started
        total, t0 = RolloutStats(), time.perf_counter()
        try:
            while len(results) < want and flights:
                await asyncio.wait([f.task for f in flights], return_when=asyncio.FIRST_COMPLETED)
                for f in [f for f in flights if f.task.done()]:
                    flights.remove(f)
                    if len(results) == want:  # finished beyond this step's need: the next's
                        self.carried.append(f)
                        continue
                    result, stats = f.task.result()
                    total.add(stats)
                    if result.aborted:
                        total.aborted_groups += 1
                        self.buffer.requeue(result.group)
                    elif cfg.dynamic_sampling and result.constant_reward():
                        total.dropped_groups += 1
                    else:
                        results.append(result)
                        ages.append(step - f.step)
                        continue
                    if refills:
                        refills -= 1
                        launch(1)
        except BaseException:
            for f in flights:  # the step failed: nothing of it runs on
                await f.cancel()
            raise
        discarded, cancelled = 0, 0
        if cfg.rollout.leftover == "abort":
            cancelled = len(flights)
            for f in flights:
                discarded += await f.cancel()
                self.buffer.requeue(f.group)
        else:
            self.carried += flights
        total.seconds = time.perf_counter() - t0
        carried = [a for a in ages if a > 0]
        metrics = {
            "rollout/groups": float(len(results)),
            "rollout/carried_groups": float(len(carried)),  # kept, started in an earlier step
            "rollout/carried_age": sum(carried) / len(carried) if carried else 0.0,
            "rollout/in_flight_groups": float(len(self.carried)),  # carried on into the next
            "rollout/cancelled_groups": float(cancelled),
            "rollout/discarded_tokens": float(discarded),
        }
        return Batch(results, handed_out, total, metrics)

    async def critic_step(self, samples: list[Sample]) -> dict[str, float]:
        """MAAC (``critic.scope: run``): the run's one critic values the samples of every
        trained agent, sets their per-token GAE advantages (whitened together) for the
        trainers, and trains on all their returns: ``trainer.ppo_epochs`` passes over the
        step's samples, one update each, of the trainer settings it was built with
        (``RunPlan.critic_trainer``). Off the event loop (an async rollout goes on)."""
        trained = {a for m in self.models for a in m.trained}
        mine = [s for s in samples if s.agent in trained]
        epochs = self.critic.settings.ppo_epochs

        def run() -> dict[str, float]:
            step, metrics = self.critic.advantages(mine)
            return metrics | self.critic.train(step, [list(range(len(step.samples)))] * epochs)

        return await asyncio.to_thread(run)

    async def train(self, due: list[RunningModel], batches: dict[str, list[Sample]]) -> list[dict]:
        """Train the models due on their batches: off the event loop, so an async rollout keeps
        going, and concurrently; colocated engines give their GPU memory up meanwhile. The
        models of a shared GPU pool take turns (``_take_turns``)."""
        pools: dict[str, list[RunningModel]] = {}
        for m in self.models:
            if m.gpu_pool is not None:
                pools.setdefault(m.gpu_pool, []).append(m)

        async def alone(m: RunningModel) -> dict[str, dict]:
            return {m.owner: await m.train_step(batches[m.owner])}

        parts = [alone(m) for m in due if m.gpu_pool is None]
        parts += [
            self._take_turns(members, [m for m in members if m in due], batches)
            for members in pools.values()
            if any(m in due for m in members)
        ]
        metrics = {k: v for part in await asyncio.gather(*parts) for k, v in part.items()}
        return [metrics[m.owner] for m in due]

    async def _take_turns(
        self, members: list[RunningModel], due: list[RunningModel], batches
    ) -> dict[str, dict]:
        """A shared pool's models due train one after another on its GPUs (Dr.MAS), every
        engine of the pool paused and released meanwhile: those of a model in training give
        up weights and KV cache (the sync after refills them and continues them), the others
        their KV cache only, resumed and continued at the end of the turns."""
        clients = [c for m in members for c in m.clients]
        waiting = [c for m in members if m not in due for c in m.clients]
        await asyncio.gather(*(c.pause("abort") for c in clients))
        await asyncio.gather(
            *(
                c.release_memory_occupation(None if m in due else ["kv_cache"])
                for m in members
                for c in m.clients
            )
        )
        out = {}
        try:
            for m in due:
                out[m.owner] = await m.thread.run(m.trainer.train_step, batches[m.owner], m.version)
        finally:
            await asyncio.gather(*(c.resume_memory_occupation() for c in clients))
            await asyncio.gather(*(c.continue_generation() for c in waiting))
        return out

    async def sync(self, due: list[RunningModel], samples: list[Sample]) -> list[dict]:
        """Push the weights of the models that trained to their engines, and the current ones to
        engines restarted after a crash (which rejoin the rotation only once they serve them)."""
        restarted = {m.owner: await m.pool.restart_dead() for m in self.models}
        metrics = []
        for m in self.models:
            await m.sync.reset(restarted[m.owner])
            if m in due:
                m.version += 1
                # checked on the first prompt it trained on (SyncConfig.check_tokens)
                first = next(iter(m.own(samples)), None)
                probe, agent = (first.prompt_ids, first.agent) if first else (None, None)
                # no rollout runs beside a synchronous sync (but carried partial rollouts
                # do, and async mode's next one); colocated engines were paused
                # for their release (train_step) and wait for this push's continue; a
                # consuming job's engines serve another job's rollouts (kernel.run.jobs)
                idle = not (
                    self.cfg.async_mode or self.carried or m.colocate or self.cfg.queue.consume
                )
                metrics.append(
                    await m.sync.push(m.trainer, m.version, probe, idle=idle, agent=agent)
                )
            elif restarted[m.owner] and m.trainer is not None:
                await m.sync.push(m.trainer, m.version)
            await m.pool.readmit(restarted[m.owner])
        return metrics

    async def checked(self) -> list[dict]:
        """Per model, the post-sync checks of its last push (run beside the rollout since)."""
        return [await m.sync.checked() for m in self.models]

    async def evaluate(self, updates: int) -> dict[str, float]:
        """The held-out evaluation after ``updates`` updates (``evaluation.evaluate``)."""
        return await evaluate(self.cfg, self.ctx, self.manager, updates)

    async def checkpoint(self, step: int, next_batch: asyncio.Future | None) -> Path:
        """Save the run after ``step`` steps (``kernel.run.checkpoint.save``), keeping the last
        checkpoint before it. The groups of a rollout in flight (async mode) are requeued by
        it: that rollout finishes quickly once training is done; simplest and exact."""
        in_flight = [] if next_batch is None else (await next_batch).handed_out
        in_flight += [f.group for f in self.carried]  # partial rollouts running on
        state = {
            "step": step,
            "weight_versions": {m.owner: m.version for m in self.models},
            "buffer": self.buffer.state_dict(in_flight=in_flight),
            "python_rng": random.getstate(),
        }
        root = Path(self.cfg.output_dir) / "checkpoints"
        self.last_checkpoint = await save(
            root, step, self.models, state, self.last_checkpoint, self.critic
        )
        if self.queue is not None and self.cfg.queue.consume:  # batches before it: not needed
            for agent in self._consumed():
                await self.queue.trim(agent, step)
        return self.last_checkpoint


def plan_models(
    plan: RunPlan, out: Path, placement: dict[str, Any], pools: Sequence[EnginePool] = ()
) -> list[RunningModel]:
    """The models of the run, each with its folder and engine pool (``pools``' when given,
    launched already; else not launched yet; its tokenizer and trainer come later), placed as
    ``placement`` says for the owners it names."""
    cfg = plan.cfg
    models = []
    for i, mp in enumerate(plan.models):
        pool = pools[i] if pools else model_pool(plan, i, mp, out)
        model = RunningModel(mp, pool, path=pool.model_path, sync_config=cfg.sync)
        where = placement.get(model.owner)
        if where is not None:
            model.colocate, model.engine_ranks = where.colocate, where.engine_ranks
            model.gpu_pool = where.pool
            model.sync_config = replace(cfg.sync, transport=where.sync_transport)
        models.append(model)
    return models


def output_dir(cfg: TrainConfig) -> tuple[Path, list[Path]]:
    """The run's output folder, made, and the checkpoints it holds; ValueError when it holds
    some and the run does not resume."""
    out = Path(cfg.output_dir)
    found = checkpoints(out)
    if found and not cfg.resume:
        raise ValueError(
            f"{out} already holds checkpoints ({found[-1].name}): pass --resume true to "
            "continue that run, or choose another --output_dir"
        )
    out.mkdir(parents=True, exist_ok=True)
    return out, found


def launch_models(
    cfg: TrainConfig,
    models: list[RunningModel],
    placement: dict[str, Any],
    stack: contextlib.ExitStack,
    marks: dict[str, float],
) -> None:
    """Launch every model's engines, then, while they load, read each model's tokenizer and
    build its trainer; ``stack`` stops the engines and the trainer threads on the way out.
    ``marks`` gets the process's age once the engines are spawned and once the trainers are
    built."""
    for m in models:
        if m.pool.launched_at is None:  # launched early: on the stack already
            stack.push(m.pool)  # stopped on the way out (entering it would wait for them)
            m.pool.launch()
    marks.setdefault("engines_spawn", process_age())
    for m in models:
        m.tokenizer = load_tokenizer(m.plan.owner_spec.tokenizer or m.path)
        stack.callback(m.thread.close)
        m.trainer = m.thread.call(place_trainer, cfg, m, placement.get(m.owner))
    marks["trainers"] = process_age()


def startup_phases(marks: dict[str, float]) -> dict[str, float]:
    """Seconds of each start-up phase, from the process's age as each ended (``marks``, in
    order): ``imports`` (the interpreter, the CLI, the config and the training stack),
    ``hooks_and_data`` (the recipe's hooks, the data sets read), ``engines_spawn`` (the models'
    folders, the engine processes started), ``trainers`` (tokenizers and trainers built while
    the engines load), ``engines_wait`` (what is left of the engines' load: their health
    checks), ``first_weights`` (the engines given the trainers' weights or version). Under
    ``kernel train`` the engines are spawned first (``kernel.run.engines``): ``engines_spawn``
    then comes first and holds the interpreter, the CLI and the config, and ``imports`` the
    training stack."""
    ages = list(marks.values())
    return {
        name: age - before for name, age, before in zip(marks, ages, [0.0, *ages[:-1]], strict=True)
    }


def restore(
    found: list[Path], models: list[RunningModel], critic: Critic | None, buffer: DataBuffer
) -> tuple[int, Path]:
    """Load the last of the checkpoints ``found`` into the models (weights and versions), the
    critic, the data buffer and Python's RNG; returns the step to start from and the
    checkpoint."""
    ckpt, state = resume_from(found, models, critic)
    for m in models:
        m.version = state["weight_versions"][m.owner]
    buffer.load_state_dict(state["buffer"])
    start = state["step"]
    random.setstate(rng_state(state["python_rng"]))
    return start, ckpt


def connect_engines(models: list[RunningModel], out: Path) -> None:
    """Once each model's engines answer: its clients, and its weight sync to them."""
    for m in models:
        m.pool.wait_healthy()
        m.generators, m.clients = m.pool.clients()
        m.sync = WeightSync(
            m.sync_config,
            m.clients,
            out / "sync" / m.owner,
            m.plan.temperature,
            m.thread.run,
            m.engine_ranks,
            adapters=list(m.plan.trained_adapters),
        )


def remote_tokenizers(plan: RunPlan, out: Path) -> dict[str, Any]:
    """The tokenizer of each agent another job plays (kernel.run.jobs), by its name (it owns
    its model): only the model's files here, neither engines nor a trainer."""
    return {
        r.owner: load_tokenizer(
            r.owner_spec.tokenizer
            or materialize_model(check_model(r.settings.model), out / "models")
        )
        for r in plan.remote
    }


def place_trainer(cfg: TrainConfig, model: RunningModel, where) -> Trainer | None:
    """The trainer of ``model`` (None when none of its agents trains): in this process, or a
    Ray actor group on the ranks ``where`` (a kernel launch placement) or cfg.ray says."""
    if not model.trained:
        return None
    settings = model.settings
    args = (model.path, settings.optim, settings.loss, settings.trainer, cfg.num_steps)
    args += (model.plan.temperature, cfg.seed)
    if cfg.advantage.estimator == "gae" and cfg.critic.scope == "model":
        args += (cfg.critic, cfg.advantage)  # its own critic (IPPO, MAPPO)
    if not cfg.ray.enabled:
        return build_trainer(*args, adapters=model.plan.trained_adapters or None)
    if where:
        options = where.trainer_options
    else:
        ranks = model.plan.resources.train_gpus or cfg.ray.ranks
        # RunPlan.check_ray_ranks checked that tensor x pipeline parallel divides ranks
        options = {
            "world_size": ranks,
            "num_cpus": cfg.ray.num_cpus_per_rank,
            "num_gpus": cfg.ray.num_gpus_per_rank,
        }
    return RayTrainer(model.owner, *args, **options)


def run_critic(plan: RunPlan, models: list[RunningModel]) -> Critic | None:
    """MAAC (``critic.scope: run``, advantage.estimator gae): the run's one value model, in
    this process, with the first trained model's trainer settings (``RunPlan.critic_trainer``:
    device, micro-batches, epochs); it reads every trained model's token ids, so each must have
    its tokenizer (ValueError naming the one that does not). None for any other run."""
    cfg, settings = plan.cfg, plan.critic_trainer
    trained = [m for m in models if m.trained]
    if settings is None or not trained:
        return None
    path = cfg.critic.model or trained[0].path
    vocab = load_tokenizer(path).get_vocab()
    for m in trained:
        if load_tokenizer(m.plan.owner_spec.tokenizer or m.path).get_vocab() != vocab:
            raise ValueError(
                f"critic.scope run: one critic reads every trained model's token ids, but the "
                f"tokenizer of {m.owner!r}'s model differs from {path!r}'s; give each model its "
                "own critic (critic.scope model)"
            )
    device = resolve_device(getattr(settings, "device", "cpu"))
    return Critic(replace(cfg.critic, model=path), cfg.advantage, path, device, settings)


def agent_handles(
    plan: RunPlan,
    models: list[RunningModel],
    queue: JobQueue | None = None,
    remote: dict[str, Any] | None = None,
) -> dict[str, AgentHandle]:
    """ctx.agents, in the order of the run's agents: each agent samples from its model's engines
    through the model's request batcher, with its own sampling defaults and chat template (and
    its LoRA adapter, by its name, where its model has adapters); an agent another job plays,
    from that job's engines (kernel.run.jobs.RemoteEngine), with its tokenizer from ``remote``."""
    agents = {}
    for r in plan.remote:
        spec, rollout, engine = r.owner_spec, r.rollouts[r.owner], r.settings.engine
        config = ClientConfig(timeout_s=engine.request_timeout_s, api_key=engine.api_key)
        client = RemoteEngine(queue, spec.name, config)
        agents[spec.name] = AgentHandle(
            spec.name,
            [client],
            with_template(remote[spec.name], spec.chat_template),
            {"temperature": rollout.temperature, "top_p": rollout.top_p},
            rollout.max_response_len,
            rollout.max_context_len,
            batcher=RequestBatcher([client], None, engine.batch_window_ms / 1000),
        )
    for m in models:
        window = m.settings.engine.batch_window_ms / 1000
        m.batcher = batcher = RequestBatcher(m.generators, m.pool, window)
        for spec in m.agents:
            tokenizer = with_template(m.tokenizer, spec.chat_template)
            rollout = plan.rollout(spec.name)
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
                lora_path=spec.name if spec.name in m.plan.adapters else None,
            )
    return {name: agents[name] for name in (s.name for s in plan.agents)}


def with_template(tokenizer, template: str | None):
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


def jsonable(cfg) -> dict:
    return json.loads(json.dumps(asdict(cfg), default=str))
