"""Run the real sglang-router (0.3.x) in front of engines, on GPU nodes and in CPU tests alike.

The router registers a worker once its ``GET /health`` answers 200, reads its
``/server_info`` and ``/model_info``, and from then on proxies ``/generate`` to it (batched
``input_ids`` pass; batched ``text`` and lists of ``rid`` are rejected by its schema). It does
not proxy the control endpoints -- abort, pause, weight updates -- which go to each worker
directly. Workers come and go at run time through ``POST /workers``, ``GET /workers`` and
``DELETE /workers/{id}`` (``EngineClient.add_worker`` and friends).

The router is a separate package (``pip install sglang-router``), started as a child process
with ``python -m sglang_router.launch_router``; nothing here imports it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kernel.engine.keyed import keyed_command, keyed_env
from kernel.engine.launch import LaunchedProcess

POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "manual")
LOG_LEVELS = ("debug", "info", "warn", "error")


@dataclass
class RouterConfig:
    """How to start sglang-router."""

    host: str = "127.0.0.1"
    """Interface to bind (the router's own default is 0.0.0.0; ours is local)."""
    port: int = 30000
    """TCP port to bind."""
    worker_urls: list[str] = field(default_factory=list)
    """Workers to register at start-up (more can join later through POST /workers)."""
    policy: str = "cache_aware"
    """Load balancing: random, round_robin, cache_aware, power_of_two or manual."""
    request_timeout_s: int = 1800
    """How long the router waits for one proxied request."""
    log_level: str = "warn"
    """debug, info, warn or error."""
    prometheus_port: int | None = None
    """Port of the router's Prometheus metrics exporter (None: the router's default, 29000,
    which a second router on the same host cannot bind: give each its own)."""
    api_key: str | None = field(default=None, repr=False)
    """If set, every route of the router needs ``Authorization: Bearer <api_key>`` and the
    router sends the same key to its workers (sglang-router's ``--api-key``: the workers must
    share it). The router takes it only as a flag, so it shows in ``ps`` on this machine."""
    extra_args: list[str] = field(default_factory=list)
    """More flags for sglang_router.launch_router, passed verbatim."""

    def validate(self) -> RouterConfig:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {LOG_LEVELS}, got {self.log_level!r}")
        if self.request_timeout_s < 1:
            raise ValueError(f"request_timeout_s must be >= 1, got {self.request_timeout_s}")
        for url in self.worker_urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"worker_urls: {url!r} is not an http(s) URL")
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The router's command line; its API key goes in the environment (``env``), out of
        sight of ``ps`` (``kernel.engine.keyed``)."""
        cmd = ["--host", self.host, "--port", str(self.port), "--policy", self.policy]
        cmd += ["--request-timeout-secs", str(self.request_timeout_s)]
        cmd += ["--log-level", self.log_level]
        if self.prometheus_port is not None:
            cmd += ["--prometheus-host", self.host, "--prometheus-port", str(self.prometheus_port)]
        if self.worker_urls:
            cmd += ["--worker-urls", *self.worker_urls]
        return keyed_command("sglang_router.launch_router", cmd + list(self.extra_args))

    def env(self) -> dict[str, str]:
        """The environment of ``command``: the router's API key."""
        return keyed_env(self.api_key)


def launch_router(config: RouterConfig, log_path: str | Path) -> LaunchedProcess:
    """Start the router as a child process (wait with ``wait_healthy`` / ``wait_for_workers``)."""
    config.validate()
    command, env = config.command(), config.env()
    return LaunchedProcess.start("sglang-router", config.url, command, log_path, env)


def wait_for_workers(
    router_url: str, n: int, deadline_s: float = 60.0, api_key: str | None = None
) -> list[dict]:
    """Block until the router lists ``n`` healthy workers; returns them."""
    end = time.monotonic() + deadline_s
    workers: list[dict] = []
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    while True:
        try:
            reply = httpx.get(f"{router_url}/workers", timeout=2.0, headers=headers)
            if reply.status_code == 401:
                raise PermissionError(f"{router_url}/workers: 401, missing or wrong api_key")
            workers = reply.json()["workers"]
        except (httpx.HTTPError, ValueError, KeyError):
            workers = []
        healthy = [w for w in workers if w.get("is_healthy")]
        if len(healthy) >= n:
            return healthy
        if time.monotonic() >= end:
            urls = [w.get("url") for w in workers]
            raise TimeoutError(
                f"{router_url} lists {len(healthy)} healthy workers, not {n}, after "
                f"{deadline_s:g} s (workers: {urls})"
            )
        time.sleep(0.25)
