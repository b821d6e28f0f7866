"""One OS thread per trainer: every call into a trainer runs on that same thread.

torch runs its CPU kernels on an OpenMP team owned by the calling thread. A process whose
training, scoring and weight export ran on whichever pool thread was free grew one team per
thread, and once a second team exists both run slower: on 2 cores a tiny model's training step
went from 10 ms to 21 ms (measured by scripts/bench_vs_peers.py's Tandem runner). So the loop
builds, trains, scores, exports and saves each trainer on its own ``TrainerThread``, and keeps
torch work of any size off the event loop's thread.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class TrainerThread:
    """A single worker thread; ``run`` awaits a call on it, ``call`` blocks on one."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Await ``fn(*args, **kwargs)`` run on this thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def call(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` run on this thread, from code outside an event loop."""
        return self._executor.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        self._executor.shutdown(wait=True)
