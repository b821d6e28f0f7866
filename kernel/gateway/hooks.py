"""The gateway as a run's hooks: each episode runs the user's program against the gateway.

``python -m kernel train --agent_program pkg.module.function`` makes these the run's
``generate`` and ``reward``. Per episode, ``generate`` opens an episode in the gateway (started
once per run on 127.0.0.1, in the run's event loop, a bearer key of its own), calls the program
with the episode's base URL, the key, its id and the data row, and when the program has
returned turns what its calls recorded into samples (``kernel.gateway.episodes``). The reward
is what the program returned (a number for every agent, or ``{agent: number}``), else what it
posted to ``/v1/episodes/{id}/reward``. A program that raised, returned no reward and posted
none, or made no call, fails the episode: masked out of the loss and counted (the rollout's
``failed``), as is one past ``rollout.timeout_s`` (``timed_out``). An engine that aborted one of
its calls sends the whole prompt group back to be rolled out again.

A program is ``def f(base_url, api_key, episode_id, row)`` (run in a thread of its own, so
blocking clients such as ``openai.OpenAI`` work) or ``async def`` of the same (run in the loop),
or a command (``gateway.command``) started per episode with ``OPENAI_BASE_URL``,
``OPENAI_API_KEY``, ``TANDEM_EPISODE_ID`` and ``TANDEM_ROW`` (the row as JSON) in its
environment, which the ``openai`` client reads by itself; its reward is the last line of its
standard output (JSON), or a POST.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import math
import os
import secrets
import signal
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from kernel.gateway.app import Gateway
from kernel.gateway.episodes import Episode
from kernel.hooks import HookError, RolloutContext, load_function, recipe_config
from kernel.rollout import EpisodeAborted
from kernel.sample import Sample

ROW_FIELDS = ("prompt", "label")


@dataclass
class GatewayConfig:
    """The settings of a run driven by a program (``recipe_args`` of ``--agent_program``)."""

    program: str = ""
    """Dotted path of the program: ``f(base_url, api_key, episode_id, row)``, sync or async."""
    command: list[str] = field(default_factory=list)
    """Instead of ``program``: a command started per episode (the environment above)."""
    credit: str = "thread"
    """thread: each dialogue an agent's calls grew is one sample, one reward; call: each call's
    turn is a sample of its own, trained in its whole context, paid what was posted for its
    completion id (else its agent's or the episode's reward); with advantage.group_by
    prompt_agent_turn each turn has its own baseline."""
    max_calls: int = 64
    """Calls an episode may make (each is a turn to train on): past it, 429. A program that
    loops on the API cannot turn one episode into thousands of samples."""
    port: int = 0
    """The gateway's port on 127.0.0.1 (0: a free one)."""
    threads: int = 64
    """Threads running synchronous programs at once (the rollout's concurrency bounds them
    too)."""

    def validate(self) -> GatewayConfig:
        if bool(self.program) == bool(self.command):
            raise ValueError("agent_program: give a program's dotted path or gateway command")
        if self.program:
            fn = load_function(self.program)
            try:
                inspect.signature(fn).bind(base_url="", api_key="", episode_id="", row={})
            except TypeError as e:
                raise HookError(
                    f"agent_program {self.program!r} must accept (base_url, api_key, episode_id, "
                    f"row): {e}"
                ) from None
        if self.credit not in ("thread", "call"):
            raise ValueError(f"gateway credit must be thread or call, got {self.credit!r}")
        if not 0 <= self.port < 65536 or min(self.threads, self.max_calls) < 1:
            raise ValueError("gateway port must be in 0..65535, threads and max_calls >= 1")
        return self


class _Server(uvicorn.Server):
    """uvicorn in the run's loop, leaving signals (Ctrl-C) to the run."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


@dataclass
class Running:
    """The gateway of one run: its app's server, address, key and the program's threads."""

    gateway: Gateway
    server: _Server
    task: asyncio.Task
    base_url: str
    api_key: str
    threads: asyncio.Semaphore  # synchronous programs running at once

    async def close(self) -> None:
        self.server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.task, 10)


_RUNNING: dict[int, asyncio.Future] = {}  # id(ctx) -> its Running, started by the first episode


async def start(ctx: RolloutContext, cfg: GatewayConfig) -> Running:
    """Start the gateway for the run of ``ctx``, closed with the run (``ctx.closers``)."""
    api_key = secrets.token_urlsafe(24)
    gateway = Gateway(dict(ctx.agents), api_key, cfg.credit == "call", cfg.max_calls)
    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets
    # that say so, and with it on every call waited 40 ms for a delayed ACK
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", cfg.port))
    except OSError as e:
        sock.close()
        raise RuntimeError(f"the gateway cannot listen on 127.0.0.1:{cfg.port}: {e}") from None
    port = sock.getsockname()[1]
    config = uvicorn.Config(gateway.app, log_level="warning", lifespan="off", access_log=False)
    server = _Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            raise RuntimeError(f"the gateway did not start: {task.exception()!r}")
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{port}"
    running = Running(gateway, server, task, url, api_key, asyncio.Semaphore(cfg.threads))

    async def close() -> None:
        _RUNNING.pop(id(ctx), None)
        await running.close()

    ctx.closers.append(close)
    return running


async def running_for(ctx: RolloutContext, cfg: GatewayConfig) -> Running:
    """The run's gateway, started by the first episode that asks."""
    future = _RUNNING.get(id(ctx))
    if future is None:
        future = _RUNNING[id(ctx)] = asyncio.ensure_future(start(ctx, cfg))
    try:
        return await asyncio.shield(future)
    except BaseException:
        if future.done():
            _RUNNING.pop(id(ctx), None)  # a failed start is tried again by the next episode
        raise


def row_of(sample: Sample) -> dict[str, Any]:
    """The data row a program sees: prompt, label and the row's metadata keys."""
    return {"prompt": sample.prompt, "label": sample.label, **sample.metadata}


async def _call(cfg: GatewayConfig, run: Running, episode: Episode, row: dict) -> Any:
    url = f"{run.base_url}/episodes/{episode.id}/v1"
    kwargs = {"base_url": url, "api_key": run.api_key, "episode_id": episode.id, "row": row}
    if cfg.command:
        return await _command(cfg.command, kwargs)
    fn = load_function(cfg.program)
    if inspect.iscoroutinefunction(fn):
        return await fn(**kwargs)
    async with run.threads:
        return await _in_thread(functools.partial(fn, **kwargs))


async def _in_thread(call) -> Any:
    """``call()`` in a daemon thread of its own: a program that never returns is left behind
    when its episode times out, and never keeps the process from exiting (a thread pool's
    workers would: they are joined at exit)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # the episode timed out meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def work() -> None:
        try:
            outcome = (call(), None)
        except BaseException as e:
            outcome = (None, e)
        with contextlib.suppress(RuntimeError):  # the run ended and its loop closed meanwhile
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=work, name="agent-program", daemon=True).start()
    return await future


async def _command(command: list[str], kwargs: dict[str, Any]) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    env |= {
        "OPENAI_BASE_URL": kwargs["base_url"],
        "OPENAI_API_KEY": kwargs["api_key"],
        "TANDEM_EPISODE_ID": kwargs["episode_id"],
        "TANDEM_ROW": json.dumps(kwargs["row"], default=str),
    }
    proc = await asyncio.create_subprocess_exec(
        *command,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await proc.communicate()
    finally:
        if proc.returncode is None:  # cancelled (the episode timed out): the whole group goes
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    if proc.returncode != 0:
        tail = err.decode(errors="replace")[-400:]
        raise RuntimeError(f"{command[0]} exited with {proc.returncode}: {tail}")
    lines = out.decode(errors="replace").strip().splitlines()
    if not lines:
        return None
    try:
        return json.loads(lines[-1])
    except ValueError:
        return None  # no reward printed: a POSTed one, if any


def _rewards(result: Any, agents: dict[str, Any]) -> dict[str, float]:
    """A program's return value as rewards (``"*"``: every agent)."""
    if result is None:
        return {}
    if isinstance(result, dict):
        unknown = sorted(set(result) - set(agents))
        if unknown:
            raise ValueError(f"the program rewarded {unknown}, no agents of this run")
        return {a: _number(v, f"reward of {a!r}") for a, v in result.items()}
    return {"*": _number(result, "reward")}


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"the program's {what} must be a finite number, got {value!r}")
    return float(value)


async def generate(ctx: RolloutContext, sample: Sample) -> list[Sample]:
    """One episode: the program run against the gateway, its calls as samples."""
    cfg = recipe_config(ctx.config, GatewayConfig)
    run = await running_for(ctx, cfg)
    episode = run.gateway.open(sample)
    try:
        result = await _call(cfg, run, episode, row_of(sample))
    except Exception:
        if episode.aborted:  # the program gave up on the 503 of an aborted call
            raise EpisodeAborted(episode.aborted) from None
        raise
    finally:
        run.gateway.close(episode)  # later calls of a program that timed out get 404
    if episode.aborted:
        raise EpisodeAborted(episode.aborted)
    episode.rewards |= _rewards(result, ctx.agents)
    if not episode.rewards and not episode.call_rewards:
        raise ValueError("the program returned no reward and posted none")
    samples = episode.samples()
    if not samples:
        raise ValueError("the program made no call through the gateway")
    return samples


def reward(ctx: RolloutContext, samples: list[Sample]) -> list[float | None]:
    """Each sample's reward as the program gave it (None: none for its agent, not trained)."""
    return [s.metadata.get("gateway_reward") for s in samples]
