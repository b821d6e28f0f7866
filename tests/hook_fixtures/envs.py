"""Environments that misbehave on purpose, hosted by the environment server in tests/test_env.py
and tests/test_env_hostile.py by dotted path: one whose step outlasts any timeout, one whose step
raises, one whose step holds the CPU without ever yielding (on a server's event loop it would
stall every request), and one whose step starts a process in a session of its own and then
waits for ever (its process must not outlive the step's deadline)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

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


class SpinEnv(SlowEnv):
    """Each step spins the CPU for ``float(action)`` seconds in one piece of code that never
    awaits, then answers how long it spun."""

    async def step(self, action: str) -> Observation:
        began = time.monotonic()
        while time.monotonic() - began < float(action):
            pass
        return Observation(f"spun {time.monotonic() - began:.2f}", 0.0)


class ForkEnv(SlowEnv):
    """A step starts ``sleep 600`` in a new session, writes its PID to the file the action
    names, and waits far past any deadline."""

    async def step(self, action: str) -> Observation:
        child = subprocess.Popen(["sleep", "600"], start_new_session=True)
        Path(action).write_text(str(child.pid))
        await asyncio.sleep(3600)
        return Observation("late", 1.0, True)
