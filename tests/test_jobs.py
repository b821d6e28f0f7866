"""Agents as independent jobs (kernel/run/jobs.py) against a real Redis server on 127.0.0.1.

The server is started by the tests as the launch script starts it (kernel.run.jobs.redis_command:
append-only file, fsync on every write) and killed with SIGKILL where a test says so: a
committed batch survives the kill, a step is committed once however often a resumed producer
repeats it, calls wait for a Redis that comes back and fail naming it when it does not, and a
remote agent's calls follow its job to the URL it publishes after a restart.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel.engine.launch import free_port
from kernel.run.jobs import JobQueue, QueueConfig, QueueTimeout, redis_command
from kernel.sample import Sample, Status
from tests.procs import engines_of

ROOT = Path(__file__).resolve().parent.parent


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


TINY = ROOT / "recipes" / "takes_two" / "presets" / "tiny.yaml"
URL = "--queue.url=redis://127.0.0.1:6379/0"
REMOTE = '--agents=[{"name": "doctor"}, {"name": "patient", "remote": true}]'
CONSUME = ["--queue.consume=true", '--agents=[{"name": "patient"}]', URL]
NO_EVAL = ["--eval.every=0", "--eval.path="]


@pytest.mark.parametrize(
    "flags, words",
    [
        ([REMOTE], "agents ['patient'] are remote (played by another job): queue.url"),
        ([REMOTE, URL, "--async_mode=true"], "use queue.max_lag"),
        ([REMOTE, URL, "--max_minutes=5"], "max_minutes with agents as independent jobs"),
        ([URL, '--agents=[{"name": "patient", "remote": true}]'], "every agent is remote"),
        (
            ['--agents=[{"name": "patient", "remote": true, "trainable": false}]'],
            "agents['patient'].remote: the agent is trained (or frozen",
        ),
        (
            [URL, '--agents=[{"name": "doctor", "remote": true}, "nurse"]'],
            "agents['nurse'] shares the model of 'doctor', which another job plays",
        ),
        (CONSUME, "queue.consume: a consuming job has no eval.path"),
        ([*CONSUME, *NO_EVAL, "--engine.num_engines=2"], "several engines: give them a router"),
        (
            [*CONSUME[:1], URL, *NO_EVAL, '--agents=[{"name": "patient", "trainable": false}]'],
            "a consuming job has no frozen agents",
        ),
    ],
)
def test_jobs_settings_are_refused_before_start_naming_the_flag(flags, words):
    from kernel.cli import train_config

    with pytest.raises(ValueError, match=re.escape(words)):
        train_config([f"--config={TINY}", *flags])


def test_a_consuming_job_with_one_engine_or_a_router_is_planned():
    from kernel.cli import train_config

    for extra in ([], ["--engine.num_engines=2", "--engine.start_router=true"]):
        plan = train_config([f"--config={TINY}", *CONSUME, *NO_EVAL, *extra]).plan()
        assert [m.owner for m in plan.models] == ["patient"] and plan.remote == ()
    plan = train_config([f"--config={TINY}", REMOTE, URL]).plan()
    assert [m.owner for m in plan.models] == ["doctor"]
    assert [r.owner for r in plan.remote] == ["patient"]
    assert plan.rollout("patient").max_response_len == 16  # the preset's, for its handle


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


def _train(out: Path, *flags: str) -> subprocess.Popen:
    """``kernel train`` of the tiny takes_two preset into ``out`` (its stderr in out.err)."""
    cmd = [sys.executable, "-m", "kernel", "train", "--recipe=takes_two", "--preset=tiny"]
    cmd += ["--num_steps=4", "--save_every=1", "--seed=3", "--eval.every=0", "--eval.path="]
    err = open(out.with_suffix(".err"), "ab")  # noqa: SIM115 (the child keeps it)
    return subprocess.Popen([*cmd, f"--output_dir={out}", *flags], cwd=ROOT, stderr=err)


def _rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _finish(run: subprocess.Popen, out: Path) -> None:
    assert run.wait(timeout=900) == 0, out.with_suffix(".err").read_text()[-3000:]


@pytest.mark.slow
def test_takes_two_as_two_jobs_survives_a_killed_patient_job(tmp_path, redis_server):
    """takes_two as two jobs, MrlX's shape: the doctor's job rolls out with the patient's job's
    engines and commits the patient's samples; the patient's job trains on them. The patient's
    job is SIGKILLed after its first step and resumed: the doctor's calls follow it to its new
    engines, and every batch is trained on once, the same prompts in the same steps as the
    doctor's job and as one job running both agents."""
    queue = [f"--queue.url={redis_server.url}", "--queue.name=takes_two_test"]
    patient_agent = {"name": "patient", "model": "tiny-smollm2-llama"}
    both = [{"name": "doctor"}, {**patient_agent, "remote": True}]
    doctor_dir, patient_dir = tmp_path / "doctor", tmp_path / "patient"
    doctor = _train(doctor_dir, f"--agents={json.dumps(both)}", *queue)
    consume = [f"--agents={json.dumps([patient_agent])}", "--queue.consume=true", *queue]
    patient = _train(patient_dir, *consume)
    deadline = time.monotonic() + 600
    while not _rows(patient_dir):
        assert patient.poll() is None, patient_dir.with_suffix(".err").read_text()[-3000:]
        assert doctor.poll() is None, doctor_dir.with_suffix(".err").read_text()[-3000:]
        assert time.monotonic() < deadline, "the patient's job trained no step"
        time.sleep(0.05)
    os.kill(patient.pid, signal.SIGKILL)
    patient.wait()
    deadline = time.monotonic() + 20
    while engines_of(patient_dir):  # its engine dies with it
        assert time.monotonic() < deadline, f"orphaned engines: {engines_of(patient_dir)}"
        time.sleep(0.2)
    patient = _train(patient_dir, *consume, "--resume=true")
    _finish(doctor, doctor_dir)
    _finish(patient, patient_dir)
    one_job = tmp_path / "one_job"
    _finish(_train(one_job, f"--agents={json.dumps([{'name': 'doctor'}, patient_agent])}"), one_job)

    d, p, one = _rows(doctor_dir), _rows(patient_dir), _rows(one_job)
    assert [r["step"] for r in p] == [r["step"] for r in d] == list(range(4))
    assert [r["data/rows"] for r in p] == [r["data/rows"] for r in d]
    assert [r["data/rows"] for r in d] == [r["data/rows"] for r in one]
    assert [r["patient/samples"] for r in p] == [r["patient/samples"] for r in d]
    trained = [r["train/n_samples"] + r["train/n_skipped"] for r in p]  # every sample, once
    assert trained == [r["patient/samples"] for r in d]
    assert all(r["queue/repeated_batches"] == 0 for r in d)
    assert sum(r["queue/wait_s"] for r in d) > 0  # the doctor's job waited for the patient's
    print("step | doctor reward (two jobs, one job) | patient reward (two jobs, one job)")
    for a, b in zip(d, one, strict=True):
        print(
            f"{a['step']} | {a['doctor/reward']:.3f}, {b['doctor/reward']:.3f} | "
            f"{a['patient/reward']:.3f}, {b['patient/reward']:.3f}"
        )
