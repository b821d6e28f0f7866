"""A toy generate hook that kills one of its own embedded engines by PID in the middle of the
rollout of step 1, and records what the router and the engines look like at the last step
(read by tests/test_faults.py)."""

from __future__ import annotations

import asyncio
import os
import signal

from openai import DefaultHttpxClient, OpenAI

from kernel.engine.client import EngineClient
from kernel.gateway import hooks as gateway
from kernel.toy import generate as toy_generate

KILL_AT_STEP, RECORD_AT_STEP = 1, 3
seen: dict = {}


async def generate(ctx, sample):
    await _fault(ctx)
    return await toy_generate(ctx, sample)


async def _fault(ctx) -> None:
    pool = ctx.agents["default"].pool
    if ctx.step == KILL_AT_STEP and "killed" not in seen:
        victim = pool.processes[1]
        seen["killed"] = (victim.url, victim.pid)
        await asyncio.sleep(0.05)  # let the other episodes' requests reach the engines
        os.kill(victim.pid, signal.SIGKILL)
    if ctx.step == RECORD_AT_STEP and "workers" not in seen:
        seen["workers"] = None  # claim it: one episode records
        async with EngineClient(pool.router_url) as router:
            seen["workers"] = await router.list_workers()
        seen["pids"] = [p.pid for p in pool.processes]
        seen["versions"] = []
        for url in pool.urls:
            async with EngineClient(url) as engine:
                seen["versions"].append(await engine.get_weight_version())


async def gateway_generate(ctx, sample):
    """The same fault through the gateway (kernel.gateway): an engine killed while a program's
    calls are in flight."""
    await _fault(ctx)
    return await gateway.generate(ctx, sample)


HTTP = DefaultHttpxClient()


def program(base_url, api_key, episode_id, row):
    """One call of the agent, written for the OpenAI API; the toy's reward (digits)."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, http_client=HTTP)
    messages = [{"role": "user", "content": row["prompt"]}]
    text = client.chat.completions.create(model="default", messages=messages)
    text = text.choices[0].message.content or ""
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0
