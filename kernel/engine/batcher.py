"""Client-side request batching: concurrent generate calls become a few /generate requests.

A rollout runs many episodes at once and each asks for its own samples: 4 prompts x 8 samples
used to be 32 HTTP requests, each prefilled whenever it happened to arrive. A model's
``RequestBatcher`` collects the calls made while the event loop is still busy starting them (it
sends once a loop turn adds no call, and at most ``window_s`` after the first) and sends them as
one request per engine: the calls for one prompt go as ONE prompt with ``sampling_params.n``
(SGLang's contract: one prefill, the prompt's KV cache shared by the n rows), distinct prompts
as one batch of ``input_ids``. Every caller gets back its own ``GenerateResult``, exactly as a
request of its own would have given it (ids, logprobs, weight version, finish reason): replies
come in SGLang's prompt-major order (prompt 0's n samples, then prompt 1's, ...). A call may
name a LoRA adapter (``lora_path``): calls for different adapters never share a prompt row, and
a batch names each prompt's adapter (a list, None for the base model).

Faults stay with the caller they belong to:
- a batch the server refuses (4xx) is sent again prompt by prompt, so only the bad prompt's
  callers get the ``EngineError``;
- an engine that fails (5xx, connection) is taken out of rotation (``pool.mark_down``) and the
  batch goes to the next engine; through a router, or with no engine left, every caller of the
  batch gets ``EpisodeAborted`` (its prompt group is rolled out again);
- a row the engine aborted (weight update in abort mode, shutdown) aborts its own caller only;
- a request whose every caller gave up (an episode timed out, a partial rollout cancelled its
  group) is cancelled: its connection closes and the engine aborts it, so it stops generating
  for no one.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from kernel.engine.client import EngineClient, EngineError, GenerateResult
from kernel.rollout import EpisodeAborted


@dataclass
class _Call:
    """One caller's request: a prompt, its sampling params, the future of its result."""

    ids: tuple[int, ...]
    params: dict[str, Any]
    key: str  # the params, canonical: calls with equal ids, key and adapter share a prompt row
    future: asyncio.Future
    lora_path: str | None = None  # the LoRA adapter that answers (None: the base model)


@dataclass
class _Unit:
    """The calls for one prompt with one set of params: one prompt of a request, n = len."""

    calls: list[_Call] = field(default_factory=list)

    @property
    def head(self) -> _Call:
        return self.calls[0]


class RequestBatcher:
    """Batches the generate calls of one model's engines (``clients``: the engines, or one
    router); ``pool`` (an EnginePool, optional) takes failed engines out of rotation."""

    def __init__(self, clients: list[EngineClient], pool=None, window_s: float = 0.005) -> None:
        if not clients:
            raise ValueError("RequestBatcher needs at least one engine client")
        self.clients, self.pool, self.window_s = clients, pool, window_s
        self.stats = {"calls": 0, "requests": 0}
        self._pending: list[_Call] = []
        self._seen = 0  # pending calls at the last look
        self._first = 0.0  # loop time of the first pending call
        self._next = 0  # round-robin position over the engines
        self._tasks: set[asyncio.Task] = set()

    def submit(
        self, input_ids: list[int], params: dict[str, Any], lora_path: str | None = None
    ) -> asyncio.Future:
        """Queue one call, answered by LoRA adapter ``lora_path`` (None: the base model); the
        future resolves to its GenerateResult (or raises)."""
        loop = asyncio.get_running_loop()
        key = json.dumps(params, sort_keys=True)
        call = _Call(tuple(input_ids), params, key, loop.create_future(), lora_path)
        self.stats["calls"] += 1
        if self.window_s <= 0:
            self._spawn(self._dispatch([call]))
            return call.future
        if not self._pending:
            self._first, self._seen = loop.time(), 0
            loop.call_soon(self._tick)
        self._pending.append(call)
        return call.future

    def _tick(self) -> None:
        """Send the pending calls once a loop turn added none (or the window is over)."""
        loop = asyncio.get_running_loop()
        grew, self._seen = len(self._pending) > self._seen, len(self._pending)
        if grew and loop.time() - self._first < self.window_s:
            loop.call_soon(self._tick)
            return
        calls, self._pending = self._pending, []
        self._spawn(self._dispatch(calls))

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # a reference until done, so the task is not collected
        task.add_done_callback(self._tasks.discard)

    def _live(self) -> list[int]:
        """Indices of the engines in rotation (all of them without a pool)."""
        down = self.pool.down if self.pool is not None else set()
        return [i for i, c in enumerate(self.clients) if c.base_url not in down]

    async def _dispatch(self, calls: list[_Call]) -> None:
        """Fold equal calls into units, spread the units over the engines round-robin, and
        send one request per (engine, n, params)."""
        units: dict[tuple, _Unit] = {}
        for c in calls:
            units.setdefault((c.ids, c.key, c.lora_path), _Unit()).calls.append(c)
        live = self._live() or [0]
        parts: dict[tuple, list[_Unit]] = {}
        for unit in units.values():
            engine = live[self._next % len(live)]
            self._next += 1
            parts.setdefault((engine, len(unit.calls), unit.head.key), []).append(unit)
        await asyncio.gather(*(self._send(us, engine) for (engine, _, _), us in parts.items()))

    async def _send(self, units: list[_Unit], first: int) -> None:
        """Send ``units`` (same n and params) to engine ``first``, or on to the next engines if
        it fails; resolve every caller's future."""
        n = len(self.clients)
        for attempt in range(n):
            client = self.clients[(first + attempt) % n]
            if self.pool is not None and client.base_url in self.pool.down:
                continue
            try:
                results = await _unless_abandoned(self._post(client, units), units)
            except _Abandoned:
                return
            except EngineError as e:
                if e.status is not None and e.status < 500:
                    if len(units) > 1:  # find the prompt the server refused; the rest go on
                        await asyncio.gather(*(self._send([u], first) for u in units))
                    else:
                        _fail(units, e)
                    return
                if self.pool is None:
                    _fail(units, e)
                    return
                if client.base_url == self.pool.router_url:  # a worker died under the router
                    _fail(units, EpisodeAborted(str(e)))
                    return
                await self.pool.mark_down(client.base_url, str(e))
                continue
            except Exception as e:  # a malformed reply: the callers fail, the batcher goes on
                _fail(units, e)
                return
            for unit, got in zip(units, results, strict=True):
                for call, result in zip(unit.calls, got, strict=True):
                    if call.future.done():  # the caller gave up (episode timeout)
                        continue
                    if result.aborted:
                        call.future.set_exception(EpisodeAborted(str(result.finish_reason)))
                    else:
                        call.future.set_result(result)
            return
        _fail(units, EpisodeAborted("no engine is up"))

    async def _post(self, client: EngineClient, units: list[_Unit]) -> list[list[GenerateResult]]:
        """One /generate for ``units``; the results of each unit's calls, in order."""
        self.stats["requests"] += 1
        k = len(units[0].calls)
        params = units[0].head.params
        if len(units) == 1 and k == 1:
            head = units[0].head
            return [[await client.generate(list(head.ids), params, lora_path=head.lora_path)]]
        # All base: no lora_path at all (SGLang without --enable-lora refuses any).
        loras = [u.head.lora_path for u in units]
        flat = await client.generate_batch(
            [list(u.head.ids) for u in units],
            {**params, "n": k},
            lora_path=loras if any(loras) else None,
        )
        if len(flat) != k * len(units):
            raise EngineError(
                f"/generate answered {len(flat)} results for {len(units)} prompts x n={k}",
                client.base_url,
            )
        return [flat[i * k : (i + 1) * k] for i in range(len(units))]


class _Abandoned(Exception):
    """Every caller of a request gave up on it before it was answered."""


async def _unless_abandoned(post, units: list[_Unit]):
    """Await ``post`` (one request for ``units``), cancelling it as soon as every caller's future
    is done (cancelled: their episodes were); raises _Abandoned then."""
    task = asyncio.ensure_future(post)
    futures = [call.future for unit in units for call in unit.calls]

    def check(_) -> None:
        if all(f.done() for f in futures) and not task.done():
            task.cancel()

    for f in futures:
        f.add_done_callback(check)
    try:
        return await task
    except asyncio.CancelledError:
        if task.cancelled() and not asyncio.current_task().cancelling():
            raise _Abandoned from None
        raise
    finally:
        for f in futures:
            f.remove_done_callback(check)
        task.cancel()  # this task itself was cancelled: the request with it


def _fail(units: list[_Unit], exc: BaseException) -> None:
    for unit in units:
        for call in unit.calls:
            if not call.future.done():
                call.future.set_exception(exc)
