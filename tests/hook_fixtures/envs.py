"""Environments that misbehave on purpose, hosted by the environment server in tests/test_env.py
by dotted path: one whose step outlasts any timeout, one whose step raises."""

from __future__ import annotations

import asyncio

from kernel.env import Observation


class SlowEnv:
    def __init__(self, seconds: float = 30.0) -> None:
        self.seconds = seconds

    async def reset(self, item) -> Observation:
        return Observation("wait")

    async def step(self, action: str) -> Observation:
        await asyncio.sleep(self.seconds)
        return Observation("late", 1.0, True)

    async def close(self) -> None:
        pass


class BrokenEnv(SlowEnv):
    async def step(self, action: str) -> Observation:
        raise RuntimeError("the environment's own bug")
