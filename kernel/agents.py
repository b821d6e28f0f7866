"""Agents: the engines that serve them, and the handles a recipe's generate hook calls.

``ctx.agents[name]`` is an ``AgentHandle``: it samples from the agent's engines (a router URL
or embedded servers, round-robin across them) with the agent's default sampling parameters,
and builds token-exact dialogues with the agent's own tokenizer (``kernel.conversation``).
An engine that aborts a request (weight update in abort mode, shutdown) raises
``EpisodeAborted``; the RolloutManager then requeues the whole prompt group.

``EnginePool`` owns the engine processes a run started itself (embedded servers on
127.0.0.1, stopped by PID at the end) or just connects to the URLs it was given.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel.conversation import Conversation
from kernel.rollout import EpisodeAborted

log = logging.getLogger(__name__)


def parse_version(version: str | None) -> int | None:
    """Engine weight versions are strings on the wire; the kernel counts them as ints."""
    try:
        return int(version) if version is not None else None
    except ValueError:
        return None


@dataclass
class EngineConfig:
    """Inference engines of the run."""

    urls: list[str] = field(default_factory=list)
    """Engine URLs to use (weight sync goes to each); empty starts embedded servers."""
    router_url: str | None = None
    """sglang-router in front of the engines: generation goes through it, control and weight
    sync to each engine directly (the router does not proxy them)."""
    num_engines: int = 1
    """Embedded servers to start when no URLs are given."""
    start_router: bool = False
    """Embedded servers: start the real sglang-router in front of them (generation goes
    through it; a dead engine is removed from it and re-registered once restarted)."""
    max_batch_size: int = 64
    """Embedded servers: most requests decoded together."""
    device: str = "cpu"
    """Embedded servers: cpu, cuda or cuda:N."""
    num_threads: int | None = None
    """Embedded servers: torch CPU threads each (None: torch's choice)."""
    startup_timeout_s: float = 180.0
    """How long an embedded server may take to load its model."""
    request_timeout_s: float = 600.0
    """Timeout of one generate request."""
    batch_window_ms: float = 5.0
    """Client side: the generate calls a rollout makes together go to the engine as one request
    (one prompt with n for equal prompts). It is sent as soon as an event-loop turn adds no
    call, and at most this long after the first; 0 sends every call on its own."""
    gather_window_ms: float = 2.0
    """Embedded servers: an idle engine's first request waits up to this long for others, so
    that requests arriving close together share one prefill forward (0: admit at once)."""
    sglang_args: list[str] = field(default_factory=list)
    """kernel launch on real SGLang: more flags for this model's sglang.launch_server, after
    cluster.sglang_args (e.g. --context-length 32768 for one agent's model only)."""

    def validate(self) -> EngineConfig:
        if self.num_engines < 1:
            raise ValueError(f"engine.num_engines must be >= 1, got {self.num_engines}")
        if any(not u.startswith(("http://", "https://")) for u in self.urls):
            raise ValueError(f"engine.urls must be http(s) URLs, got {self.urls}")
        if self.router_url is not None and not self.urls:
            raise ValueError("engine.router_url needs engine.urls (the workers, for weight sync)")
        if self.start_router and (self.urls or self.router_url):
            raise ValueError("engine.start_router is for embedded engines: drop engine.urls")
        if self.startup_timeout_s <= 0 or self.request_timeout_s <= 0:
            raise ValueError("engine.startup_timeout_s and engine.request_timeout_s must be > 0")
        for name in ("batch_window_ms", "gather_window_ms"):
            if not 0 <= getattr(self, name) <= 1000:
                raise ValueError(f"engine.{name} must be in [0, 1000], got {getattr(self, name)}")
        if any(not isinstance(a, str) for a in self.sglang_args):
            raise ValueError(f"engine.sglang_args must be strings, got {self.sglang_args}")
        return self


BACKENDS = ("torch", "megatron")
OVERRIDABLE = ("rollout", "optim", "loss", "trainer", "engine", "resources")


@dataclass
class AgentSpec:
    """One agent of the run: which model plays it, how it is served and trained.

    Agents that share a model (``share_model_with``) share its trainer, engines and weight
    versions (Dr.MAS LLM sharing); the others each get their own (heterogeneous families
    allowed). In ``TrainConfig.agents`` a bare name is shorthand for a spec that shares the first
    agent's model, so ``agents: [solver, rewriter, selector]`` is one model playing three roles.
    """

    name: str
    """Name the recipe calls it by (ctx.agents[name]) and that tags its samples."""
    model: str | None = None
    """HF model path or name of this agent's own model (None: the run's --model)."""
    share_model_with: str | None = None
    """Another agent whose model, trainer and engines this agent uses (None: its own)."""
    tokenizer: str | None = None
    """Tokenizer path of this agent's model (None: the model's own)."""
    chat_template: str | None = None
    """Chat template (Jinja text, or a path to a .jinja file) that replaces the tokenizer's for
    this agent's dialogues (None: the tokenizer's own)."""
    trainable: bool = True
    """False freezes the agent: it is served and rolled out, never trained or synced."""
    update_every: int = 1
    """Train this agent's model every k steps (its samples in between are dropped)."""
    backend: str = "torch"
    """Training backend of this agent's model: torch or megatron."""
    rollout: dict[str, Any] = field(default_factory=dict)
    """Overrides of the run's rollout section for this agent (temperature, top_p,
    max_response_len, max_context_len)."""
    optim: dict[str, Any] = field(default_factory=dict)
    """Overrides of the run's optim section for this agent's model (lr, weight_decay, ...)."""
    loss: dict[str, Any] = field(default_factory=dict)
    """Overrides of the run's loss section for this agent's model (clip, kl_coef, ...)."""
    trainer: dict[str, Any] = field(default_factory=dict)
    """Overrides of the run's trainer section (max_tokens_per_microbatch, device, ...)."""
    engine: dict[str, Any] = field(default_factory=dict)
    """Overrides of the run's engine section for this agent's model (urls, router_url,
    num_engines, device, ...): every model has its own engines."""
    resources: dict[str, Any] = field(default_factory=dict)
    """Placement of this agent's model on a cluster (GPUs for training and inference,
    colocation, parallel sizes); see kernel.cluster.plan.ResourceConfig and `kernel launch`."""

    def validate(self) -> AgentSpec:
        where = f"agents[{self.name!r}]"
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"agents: name must be letters, digits, - or _, got {self.name!r}")
        if self.update_every < 1:
            raise ValueError(f"{where}.update_every must be >= 1, got {self.update_every}")
        if self.backend not in BACKENDS:
            raise ValueError(f"{where}.backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.share_model_with is not None:
            own = [k for k in ("model", "tokenizer", *OVERRIDABLE) if getattr(self, k)]
            own += [k for k in ("update_every", "backend") if getattr(self, k) != _DEFAULTS[k]]
            # Sampling settings are per agent even on a shared model; the rest belong to the model.
            own = [k for k in own if k != "rollout"]
            if own:
                raise ValueError(
                    f"{where} shares the model of {self.share_model_with!r}, so {', '.join(own)} "
                    f"must be set on {self.share_model_with!r}"
                )
        return self


_DEFAULTS = {"update_every": 1, "backend": "torch"}


def agent_specs(agents: list) -> list[AgentSpec]:
    """Normalise ``TrainConfig.agents`` (names or specs) and check the sharing graph."""
    if not agents:
        raise ValueError("agents is empty: name at least one agent")
    first = agents[0] if isinstance(agents[0], str) else agents[0].name
    specs = [
        AgentSpec(a, share_model_with=None if a == first else first) if isinstance(a, str) else a
        for a in agents
    ]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"agents must have distinct names, got {names}")
    by_name = {s.name: s for s in specs}
    for s in specs:
        s.validate()
        other = by_name.get(s.share_model_with) if s.share_model_with else s
        if other is None:
            raise ValueError(
                f"agents[{s.name!r}].share_model_with names {s.share_model_with!r}, "
                f"which is not an agent of this run ({names})"
            )
        if other.share_model_with is not None:
            raise ValueError(
                f"agents[{s.name!r}] shares with {other.name!r}, which itself shares with "
                f"{other.share_model_with!r}: share with {other.share_model_with!r} directly"
            )
    return specs


def model_groups(specs: list[AgentSpec]) -> dict[str, list[AgentSpec]]:
    """Owner agent name -> the specs of every agent its model plays (owner first)."""
    groups: dict[str, list[AgentSpec]] = {}
    for s in specs:
        groups.setdefault(s.share_model_with or s.name, []).append(s)
    for owner, members in groups.items():
        members.sort(key=lambda s: s.name != owner)
    return groups


class EnginePool:
    """The engines of one model: started here (embedded, optionally behind a real sglang-router
    started here too) or given by URL.

    Faults: an embedded engine that dies is noticed by ``watch`` (or by a failed request) and
    taken out of rotation at once -- removed from the router, skipped by the agent handles -- so
    its requests are retried on the others. Between steps the loop calls ``restart_dead`` (same
    port), pushes the current weights to every engine, and ``readmit`` puts the restarted ones
    back into the router and the rotation: a restarted engine never serves stale weights.
    """

    def __init__(self, cfg: EngineConfig, model_path: str, log_dir: Path, seed: int = 0):
        self.cfg, self.model_path, self.log_dir, self.seed = cfg, model_path, log_dir, seed
        self.processes: list = []  # LaunchedProcess per embedded engine, in url order
        self.router = None  # LaunchedProcess of a router started here
        self.urls: list[str] = list(cfg.urls)
        self.down: set[str] = set()  # engine URLs out of rotation
        self.restarts = 0

    @property
    def router_url(self) -> str | None:
        return self.cfg.router_url or (self.router.url if self.router else None)

    def __enter__(self) -> EnginePool:
        """Start the engines (if no URLs were given) and wait until they serve."""
        self.launch()
        self.wait_healthy()
        return self

    def launch(self) -> None:
        """Start this pool's embedded engines without waiting for them (so several pools load
        their models at once); a no-op when the pool was given URLs or already launched."""
        if self.cfg.urls or self.processes:
            return
        try:
            for i in range(self.cfg.num_engines):
                self.processes.append(self._start_engine(i, port=None))
        except BaseException:
            self.__exit__()
            raise

    def _start_engine(self, i: int, port: int | None):
        from kernel.engine.launch import free_port
        from kernel.engine.serve import launch_server
        from kernel.engine.server import ServerConfig

        server = ServerConfig(
            model=self.model_path,
            port=port or free_port(),
            device=self.cfg.device,
            max_batch_size=self.cfg.max_batch_size,
            gather_window_ms=self.cfg.gather_window_ms,
            num_threads=self.cfg.num_threads,
            seed=self.seed + i,
        )
        return launch_server(server, self.log_dir / f"engine{i}.log")

    def wait_healthy(self) -> None:
        """Block until every engine this pool started serves, and its router if it starts one
        (stops them all on failure)."""
        try:
            for p in self.processes:
                p.wait_healthy(self.cfg.startup_timeout_s)
            if self.processes:
                self.urls = [p.url for p in self.processes]
            if self.cfg.start_router and self.router is None:
                from kernel.engine.launch import free_port
                from kernel.engine.router import RouterConfig, launch_router, wait_for_workers

                config = RouterConfig(
                    port=free_port(),
                    worker_urls=self.urls,
                    policy="round_robin",
                    prometheus_port=free_port(),  # one router per model: each its own port
                )
                self.router = launch_router(config, self.log_dir / "router.log")
                self.router.wait_healthy(self.cfg.startup_timeout_s)
                wait_for_workers(self.router.url, len(self.urls), self.cfg.startup_timeout_s)
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc) -> None:
        for p in [*self.processes, *([self.router] if self.router else [])]:
            p.stop()  # only what this pool started, by PID
        self.processes, self.router = [], None

    def clients(self) -> tuple[list, list]:
        """(clients to generate with, clients of every engine for control and weight sync)."""
        from kernel.engine.client import ClientConfig, EngineClient

        cfg = ClientConfig(timeout_s=self.cfg.request_timeout_s)
        engines = [EngineClient(url, cfg) for url in self.urls]
        if self.router_url is None:
            return engines, engines
        return [EngineClient(self.router_url, cfg)], engines

    # ---------------------------------------------------------------- faults

    async def mark_down(self, url: str, why: str) -> None:
        """Take an engine out of rotation (and out of the router) until it is readmitted."""
        if url in self.down:
            return
        self.down.add(url)
        log.warning("engine %s is down (%s): out of rotation", url, why)
        if self.router_url is not None:
            await self._router(lambda r: _remove_worker(r, url))

    async def watch(self, interval_s: float = 0.25) -> None:
        """Run until cancelled: notice started engines that exited, take them out at once."""
        while True:
            for p in self.processes:
                if p.popen.poll() is not None and p.url not in self.down:
                    await self.mark_down(p.url, f"process {p.pid} exited {p.popen.returncode}")
            await asyncio.sleep(interval_s)

    async def restart_dead(self) -> list[str]:
        """Restart every started engine whose process exited, on its old port; returns their
        URLs (still out of rotation: push weights, then ``readmit``). Engines given by URL
        cannot be restarted here: one that is down raises, naming it."""
        lost = [u for u in self.down if u not in {p.url for p in self.processes}]
        if lost:
            raise RuntimeError(
                f"engines {sorted(lost)} are down and were not started by this run, so it cannot "
                "restart them; restart them and resume the run (--resume true)"
            )
        restarted = []
        for i, p in enumerate(self.processes):
            if p.popen.poll() is None:
                continue
            await self.mark_down(p.url, f"process {p.pid} exited {p.popen.returncode}")
            p.stop()
            port = int(p.url.rsplit(":", 1)[1])
            self.processes[i] = self._start_engine(i, port)
            await asyncio.to_thread(self.processes[i].wait_healthy, self.cfg.startup_timeout_s)
            self.restarts += 1
            restarted.append(p.url)
            log.warning("engine %s restarted (pid %d)", p.url, self.processes[i].pid)
        return restarted

    async def readmit(self, urls: list[str]) -> None:
        """Put engines back into rotation (and into the router) once they serve current weights."""
        if urls and self.router_url is not None:
            for url in urls:
                await self._router(lambda r, u=url: r.add_worker(u))
            await asyncio.to_thread(
                _wait_workers, self.router_url, len(self.urls), self.cfg.startup_timeout_s
            )
        self.down -= set(urls)

    async def _router(self, call) -> None:
        from kernel.engine.client import EngineClient

        async with EngineClient(self.router_url) as router:
            await call(router)


async def _remove_worker(router, url: str) -> None:
    for worker in await router.list_workers():
        if worker.get("url") == url:
            await router.remove_worker(worker["id"])


def _wait_workers(router_url: str, n: int, deadline_s: float) -> None:
    from kernel.engine.router import wait_for_workers

    wait_for_workers(router_url, n, deadline_s)


@dataclass
class AgentHandle:
    """What a recipe calls to make one agent speak.

    Calls are batched per model (``kernel.engine.batcher.RequestBatcher``): the episodes of a
    rollout that ask at the same time go to the engine as one request, the samples of one prompt
    as one prompt with ``n``. A recipe just awaits ``generate`` / ``generate_turn`` per episode;
    ``generate_group`` and ``generate_turns`` say the same in one call."""

    name: str
    clients: list  # EngineClient per engine (or one router)
    tokenizer: Any
    sampling: dict[str, Any]  # default sampling params (temperature, top_p, ...)
    max_response_len: int
    max_context_len: int
    pool: EnginePool | None = None  # set: a failed engine is taken out and the request retried
    batcher: Any = None  # RequestBatcher shared by the agents of one model (None: one of its own)

    def __post_init__(self) -> None:
        if not self.clients:
            raise ValueError(f"agent {self.name!r} has no engines")
        if self.batcher is None:
            from kernel.engine.batcher import RequestBatcher

            self.batcher = RequestBatcher(self.clients, self.pool)

    async def generate(self, input_ids: list[int], sampling: dict[str, Any] | None = None):
        """Sample one continuation of ``input_ids``; raises EpisodeAborted if aborted, or if no
        engine could serve it (the prompt group is then rolled out again later)."""
        params = {"max_new_tokens": self.max_response_len, **self.sampling, **(sampling or {})}
        try:
            return await self.batcher.submit(input_ids, params)
        except EpisodeAborted as e:
            raise EpisodeAborted(f"agent {self.name!r}: {e}") from e

    async def generate_group(
        self, input_ids: list[int], n: int, sampling: dict[str, Any] | None = None
    ) -> list:
        """``n`` samples of one prompt, as one request with ``sampling_params.n``."""
        return list(await asyncio.gather(*(self.generate(input_ids, sampling) for _ in range(n))))

    def conversation(self, system: str | None = None, **kwargs) -> Conversation:
        """A new token-exact dialogue in this agent's tokenizer and context budget."""
        return Conversation(self.tokenizer, self.max_context_len, system=system, **kwargs)

    async def generate_turn(self, conv: Conversation, sampling: dict[str, Any] | None = None):
        """Sample this agent's next turn into ``conv``; returns the engine result, or None when
        the context budget is exhausted (``conv.truncated`` is then set)."""
        max_new = conv.max_new_tokens_for_turn(self.max_response_len)
        if max_new <= 0:
            return None
        result = await self.generate(
            conv.assistant_prompt_ids(), {**(sampling or {}), "max_new_tokens": max_new}
        )
        conv.add_generation(
            result.output_ids, result.logprobs, weight_version=parse_version(result.weight_version)
        )
        return result

    async def generate_turns(
        self, convs: list[Conversation], sampling: dict[str, Any] | None = None
    ) -> list:
        """This agent's next turn in each of several dialogues (a group's episodes, turn by
        turn), as one request; a result per dialogue (None where its budget is exhausted)."""
        return list(await asyncio.gather(*(self.generate_turn(c, sampling) for c in convs)))
