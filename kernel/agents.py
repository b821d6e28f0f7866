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

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel.conversation import Conversation
from kernel.rollout import EpisodeAborted


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

    def validate(self) -> EngineConfig:
        if self.num_engines < 1:
            raise ValueError(f"engine.num_engines must be >= 1, got {self.num_engines}")
        if any(not u.startswith(("http://", "https://")) for u in self.urls):
            raise ValueError(f"engine.urls must be http(s) URLs, got {self.urls}")
        if self.router_url is not None and not self.urls:
            raise ValueError("engine.router_url needs engine.urls (the workers, for weight sync)")
        if self.startup_timeout_s <= 0 or self.request_timeout_s <= 0:
            raise ValueError("engine.startup_timeout_s and engine.request_timeout_s must be > 0")
        return self


class EnginePool:
    """The engines of one model: started here (embedded) or given by URL."""

    def __init__(self, cfg: EngineConfig, model_path: str, log_dir: Path, seed: int = 0):
        self.cfg, self.model_path, self.log_dir, self.seed = cfg, model_path, log_dir, seed
        self.processes: list = []
        self.urls: list[str] = list(cfg.urls)

    def __enter__(self) -> EnginePool:
        if self.urls:
            return self
        from kernel.engine.launch import free_port
        from kernel.engine.serve import launch_server
        from kernel.engine.server import ServerConfig

        try:
            for i in range(self.cfg.num_engines):
                server = ServerConfig(
                    model=self.model_path,
                    port=free_port(),
                    device=self.cfg.device,
                    max_batch_size=self.cfg.max_batch_size,
                    num_threads=self.cfg.num_threads,
                    seed=self.seed + i,
                )
                self.processes.append(launch_server(server, self.log_dir / f"engine{i}.log"))
            for p in self.processes:
                p.wait_healthy(self.cfg.startup_timeout_s)
        except BaseException:
            self.__exit__()
            raise
        self.urls = [p.url for p in self.processes]
        return self

    def __exit__(self, *exc) -> None:
        for p in self.processes:  # only what this pool started, by PID
            p.stop()
        self.processes = []

    def clients(self) -> tuple[list, list]:
        """(clients to generate with, clients of every engine for control and weight sync)."""
        from kernel.engine.client import ClientConfig, EngineClient

        cfg = ClientConfig(timeout_s=self.cfg.request_timeout_s)
        engines = [EngineClient(url, cfg) for url in self.urls]
        if self.cfg.router_url is None:
            return engines, engines
        return [EngineClient(self.cfg.router_url, cfg)], engines


@dataclass
class AgentHandle:
    """What a recipe calls to make one agent speak."""

    name: str
    clients: list  # EngineClient per engine (or one router)
    tokenizer: Any
    sampling: dict[str, Any]  # default sampling params (temperature, top_p, ...)
    max_response_len: int
    max_context_len: int
    _next: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.clients:
            raise ValueError(f"agent {self.name!r} has no engines")
        self._next = itertools.cycle(self.clients)

    async def generate(self, input_ids: list[int], sampling: dict[str, Any] | None = None):
        """Sample one continuation of ``input_ids``; raises EpisodeAborted if aborted."""
        params = {"max_new_tokens": self.max_response_len, **self.sampling, **(sampling or {})}
        result = await next(self._next).generate(list(input_ids), params)
        if result.aborted:
            raise EpisodeAborted(f"agent {self.name!r}: {result.finish_reason}")
        return result

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
