"""The engines of one model: embedded servers this run starts (on 127.0.0.1, stopped by PID at
the end, restarted when one dies) or the URLs it was given, optionally behind sglang-router;
their clients for generation and for control and weight sync. With ``enable_lora`` the engines
serve LoRA adapters by name over the one base model (SGLang's --enable-lora).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

from kernel.engine.client import ClientConfig, EngineClient
from kernel.engine.launch import free_port, launch_server
from kernel.engine.router import RouterConfig, launch_router, wait_for_workers
from kernel.engine.settings import ServerConfig
from kernel.metrics import process_age

log = logging.getLogger(__name__)


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
    onednn_linear: bool = True
    """Embedded servers on CPU: Linear layers through oneDNN (1.3-2x faster decode matmuls,
    the same math up to float rounding); false keeps PyTorch's default GEMM."""
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
    prefix_cache_mb: float = 1024.0
    """Embedded servers: most MiB of KV each keeps in its prefix cache, so a conversation's
    next turn prefills only its new tokens (0: off). Real SGLang has its own radix cache."""
    api_key: str | None = field(default=None, repr=False)
    """Bearer key of these engines and their router: every request sends it, and embedded
    servers and a router started by the run require it (SGLang's and sglang-router's
    ``--api-key``). Redacted in the saved config and the logs."""
    sglang_args: list[str] = field(default_factory=list)
    """kernel launch on real SGLang: more flags for this model's sglang.launch_server, after
    cluster.sglang_args (e.g. --context-length 32768 for one agent's model only)."""
    enable_lora: bool = False
    """Serve LoRA adapters by name over the one base model (SGLang's --enable-lora); set by the
    run from the model's LoRA settings."""
    lora_paths: list[str] = field(default_factory=list)
    """LoRA adapters (PEFT folders) the engines load at start, each NAME=PATH (--lora-paths);
    set by the run for agents that serve a fixed adapter. Needs enable_lora."""
    max_loras_per_batch: int = 8
    """Most distinct LoRA adapters in an engine's running batch (--max-loras-per-batch)."""
    max_lora_rank: int = 0
    """Largest LoRA rank served (--max-lora-rank); set by the run from the model's LoRA
    settings. Real SGLang needs it, and lora_target_modules, to load adapters at run time when
    it starts with none; the embedded server does not."""
    lora_target_modules: list[str] = field(default_factory=list)
    """Layers LoRA adapters may target (--lora-target-modules); set by the run from the model's
    LoRA settings (see max_lora_rank)."""

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
        if not 0 <= self.prefix_cache_mb < float("inf"):
            raise ValueError(f"engine.prefix_cache_mb must be >= 0, got {self.prefix_cache_mb}")
        for name in ("batch_window_ms", "gather_window_ms"):
            if not 0 <= getattr(self, name) <= 1000:
                raise ValueError(f"engine.{name} must be in [0, 1000], got {getattr(self, name)}")
        if any(not isinstance(a, str) for a in self.sglang_args):
            raise ValueError(f"engine.sglang_args must be strings, got {self.sglang_args}")
        if self.max_loras_per_batch < 1:
            raise ValueError(
                f"engine.max_loras_per_batch must be >= 1, got {self.max_loras_per_batch}"
            )
        if self.max_lora_rank < 0:
            raise ValueError(f"engine.max_lora_rank must be >= 0, got {self.max_lora_rank}")
        if self.lora_paths and not self.enable_lora:
            raise ValueError("engine.lora_paths needs engine.enable_lora")
        return self

    def server_config(
        self, model: str, *, host: str = "127.0.0.1", port: int, seed: int, weights_dir=None
    ) -> ServerConfig:
        """The settings of one embedded server of these engines."""
        return ServerConfig(
            model=model,
            host=host,
            port=port,
            device=self.device,
            max_batch_size=self.max_batch_size,
            gather_window_ms=self.gather_window_ms,
            prefix_cache_mb=self.prefix_cache_mb,
            num_threads=self.num_threads,
            onednn_linear=self.onednn_linear,
            seed=seed,
            weights_dir=None if weights_dir is None else str(weights_dir),
            api_key=self.api_key,
            enable_lora=self.enable_lora,
            lora_paths=list(self.lora_paths),
            max_loras_per_batch=self.max_loras_per_batch,
        )


class EnginePool:
    """The engines of one model: started here (embedded, optionally behind a real sglang-router
    started here too) or given by URL.

    Faults: an embedded engine that dies is noticed by ``watch`` (or by a failed request) and
    taken out of rotation at once -- removed from the router, skipped by the agent handles -- so
    its requests are retried on the others. Between steps the loop calls ``restart_dead`` (same
    port), pushes the current weights to every engine, and ``readmit`` puts the restarted ones
    back into the router and the rotation: a restarted engine never serves stale weights.
    """

    def __init__(
        self,
        cfg: EngineConfig,
        model_path: str,
        log_dir: Path,
        seed: int = 0,
        weights_dir: Path | None = None,
    ):
        self.cfg, self.model_path, self.log_dir, self.seed = cfg, model_path, log_dir, seed
        self.weights_dir = weights_dir  # the only folder its engines load weights from
        self.processes: list = []  # LaunchedProcess per embedded engine, in url order
        self.router = None  # LaunchedProcess of a router started here
        self.urls: list[str] = list(cfg.urls)
        self.down: set[str] = set()  # engine URLs out of rotation
        self.restarts = 0
        self.launched_at: float | None = None  # the process's age when its engines were spawned

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
        self.launched_at = process_age()

    def _start_engine(self, i: int, port: int | None):
        server = self.cfg.server_config(
            self.model_path,
            port=port or free_port(),
            seed=self.seed + i,
            weights_dir=self.weights_dir,
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
                config = RouterConfig(
                    port=free_port(),
                    worker_urls=self.urls,
                    policy="round_robin",
                    prometheus_port=free_port(),  # one router per model: each its own port
                    api_key=self.cfg.api_key,
                )
                self.router = launch_router(config, self.log_dir / "router.log")
                self.router.wait_healthy(self.cfg.startup_timeout_s)
                wait_for_workers(
                    self.router.url, len(self.urls), self.cfg.startup_timeout_s, self.cfg.api_key
                )
        except BaseException:
            self.__exit__()
            raise

    def terminate(self) -> None:
        """Ask every process this pool started to end (SIGTERM, by PID), without waiting: a
        run's pools shut down at once, so a Ctrl-C ends it within one grace period."""
        for p in [*self.processes, *([self.router] if self.router else [])]:
            p.terminate()

    def __exit__(self, *exc) -> None:
        self.terminate()
        for p in [*self.processes, *([self.router] if self.router else [])]:
            p.stop()  # only what this pool started, by PID (SIGKILL after the grace period)
        self.processes, self.router = [], None

    def clients(self) -> tuple[list, list]:
        """(clients to generate with, clients of every engine for control and weight sync)."""

        cfg = ClientConfig(timeout_s=self.cfg.request_timeout_s, api_key=self.cfg.api_key)
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
                wait_for_workers,
                self.router_url,
                len(self.urls),
                self.cfg.startup_timeout_s,
                self.cfg.api_key,
            )
        self.down -= set(urls)

    async def _router(self, call) -> None:

        config = ClientConfig(api_key=self.cfg.api_key)
        async with EngineClient(self.router_url, config) as router:
            await call(router)


async def _remove_worker(router, url: str) -> None:
    for worker in await router.list_workers():
        if worker.get("url") == url:
            await router.remove_worker(worker["id"])
