"""Agents as independent jobs (kernel/jobs.py) against a real Redis server on 127.0.0.1.

The server is started by the tests as the launch script starts it (kernel.jobs.redis_command:
append-only file, fsync on every write) and killed with SIGKILL where a test says so: a
committed batch survives the kill, a step is committed once however often a resumed producer
repeats it, calls wait for a Redis that comes back and fail naming it when it does not, and a
remote agent's calls follow its job to the URL it publishes after a restart.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time

import pytest

from kernel.engine.launch import free_port
from kernel.jobs import JobQueue, QueueConfig, QueueTimeout, redis_command
from kernel.sample import Sample, Status


class Redis:
    """A real redis-server on 127.0.0.1 with its data in ``folder``; ``kill`` is SIGKILL."""

    def __init__(self, folder, port: int | None = None):
        self.folder, self.port = folder, port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Redis:
        log = open(self.folder / "redis.log", "ab")  # noqa: SIM115 (the server keeps it)
        self.proc = subprocess.Popen(redis_command(self.folder, self.port), stdout=log, stderr=log)
        import redis

        deadline = time.monotonic() + 30
        while True:
            try:
                redis.Redis(port=self.port, socket_connect_timeout=1).ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError((self.folder / "redis.log").read_text()) from None
                time.sleep(0.05)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


@pytest.fixture
def redis_server(tmp_path):
    server = Redis(tmp_path).start()
    yield server
    server.stop()


def samples(agent: str, group: int, n: int = 2) -> list[Sample]:
    return [
        Sample(
            prompt=f"case {group}",
            prompt_ids=[1, 2, 3],
            response_ids=[4, 5 + i],
            loss_mask=[1, 1],
            rollout_logprobs=[-0.5, -1.25],
            agent=agent,
            group_id=group,
            index=i,
            status=Status.COMPLETED,
            reward=0.5 * i,
            advantage=[0.1, -0.2],
            weight_versions=[group],
            metadata={"row": group, "facts": ["fever"]},
        )
        for i in range(n)
    ]


def test_batches_survive_a_killed_redis_and_each_step_is_committed_once(redis_server):
    async def main():
        q = JobQueue(QueueConfig(url=redis_server.url, name="run1", timeout_s=20))
        await q.check_fresh(["patient"])
        assert await q.commit("patient", 0, samples("patient", 0))
        assert await q.commit("patient", 1, samples("patient", 1, n=3))
        redis_server.kill()  # SIGKILL: no shutdown save
        redis_server.start()  # the same folder: its append-only file
        first = await q.fetch("patient", 0)
        assert [s.state() for s in first] == [s.state() for s in samples("patient", 0)]
        # a resumed producer repeats step 1 with other episodes: the first batch stands
        assert not await q.commit("patient", 1, samples("patient", 7))
        assert [s.group_id for s in await q.fetch("patient", 1)] == [1, 1, 1]
        assert await q.commit("patient", 2, [])  # an empty step is a batch too
        assert await q.fetch("patient", 2) == []
        with pytest.raises(ValueError, match="already holds 3 batches of agent 'patient'"):
            await q.check_fresh(["patient"])
        await q.trim("patient", 2)  # a consumer's checkpoint after 2 steps
        assert await q.redis.xlen(q.key("patient", "batches")) == 1
        await q.aclose()

    asyncio.run(main())


def test_a_consumer_publishes_where_it_serves_and_how_far_it_trained(redis_server):
    async def main():
        cfg = QueueConfig(url=redis_server.url, name="run2", timeout_s=0.6)
        producer, consumer = JobQueue(cfg), JobQueue(cfg)
        with pytest.raises(QueueTimeout, match="the job of agent 'patient' to finish 1 steps"):
            await producer.wait_done("patient", 1)
        await consumer.check_consumer_fresh(["patient"])
        await consumer.publish("patient", "http://127.0.0.1:1234", done=0)
        assert await producer.url("patient") == "http://127.0.0.1:1234"
        with pytest.raises(QueueTimeout, match="publish its engines' URL"):
            await producer.url("patient", not_this="http://127.0.0.1:1234")
        waiting = asyncio.ensure_future(producer.wait_done("patient", 1))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await consumer.mark_done("patient", 1)
        await waiting
        with pytest.raises(ValueError, match=r"a job already trained agent 'patient' \(1 steps\)"):
            await consumer.check_consumer_fresh(["patient"])
        with pytest.raises(QueueTimeout, match="batch 0 of agent 'patient'"):
            await consumer.fetch("patient", 0)
        await producer.aclose()
        await consumer.aclose()

    asyncio.run(main())


def test_calls_wait_for_redis_to_come_back_and_fail_naming_it_when_it_does_not(tmp_path):
    server = Redis(tmp_path)

    async def main():
        q = JobQueue(QueueConfig(url=server.url, name="run3", timeout_s=20))
        asyncio.get_running_loop().call_later(1.0, server.start)
        assert await q.commit("patient", 0, samples("patient", 0))  # waits for the server
        assert len(await q.fetch("patient", 0)) == 2
        server.kill()
        short = JobQueue(QueueConfig(url=server.url, name="run3", timeout_s=0.5))
        with pytest.raises(QueueTimeout, match=f"Redis at {server.url} unreachable"):
            await short.fetch("patient", 0)
        await q.aclose()
        await short.aclose()

    try:
        asyncio.run(main())
    finally:
        server.stop()


@pytest.mark.parametrize(
    "settings, words",
    [
        ({"url": "http://127.0.0.1:6379"}, "queue.url must be a redis:// URL"),
        ({"consume": True}, "queue.consume needs queue.url"),
        ({"url": "redis://x", "name": "a:b"}, "queue.name must be a non-empty key prefix"),
        ({"max_lag": -1}, "queue.max_lag must be >= 0"),
    ],
)
def test_queue_settings_are_checked_naming_the_flag(settings, words):
    with pytest.raises(ValueError, match=words):
        QueueConfig(**settings).validate()
