"""Start and stop the processes a run needs (embedded servers, sglang-router), by PID.

A ``LaunchedProcess`` is one child process with the URL it serves. It waits for health with
a deadline (and says so at once, with the tail of its log, if the child died), and ``stop()``
ends exactly that PID -- terminate, then kill after a grace period -- never anything found by
name. Used by tests, benchmarks and local launch scripts. ``launch_server`` starts an embedded
server (``python -m kernel.engine``) this way, every setting a flag (a list, such as the LoRA
adapters to load at start, as one JSON argument).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from kernel.auth import API_KEY_ENV  # the variable a server reads its key from

if TYPE_CHECKING:
    from kernel.engine.settings import ServerConfig


def _die_with_parent() -> None:
    """In the child before exec: on Linux, get SIGTERM when the parent dies (even by SIGKILL),
    so a crashed run leaves no orphaned server behind. Elsewhere a no-op."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


_PICK = random.SystemRandom()  # not the module's generator: a run seeds that one
LOWEST_PORT = 20000  # where free_port (and a test plan's ports) start looking


def ephemeral_start() -> int:
    """The first port of the OS's ephemeral range, from which it hands out the local ports of
    outgoing connections (and of a bind to port 0)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def bindable(host: str, port: int) -> bool:
    """Whether ``host``:``port`` can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, for a server that binds it a moment later. It is picked
    at random below the ephemeral range: a port the OS picks lies in that range, where any
    connection opened meanwhile (Ray's gRPC opens hundreds) can be handed the same number, and
    the server then fails with "address already in use" -- it did, in CI. Where that range
    starts too low to leave room, the OS picks."""
    top = ephemeral_start()
    if top - LOWEST_PORT >= 1000:
        for _ in range(100):
            port = _PICK.randrange(LOWEST_PORT, top)
            if bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class LaunchedProcess:
    """A child process serving HTTP at ``url``; its output goes to ``log_path``."""

    name: str
    url: str
    popen: subprocess.Popen
    log_path: Path
    _log_file: object = field(default=None, repr=False)

    @classmethod
    def start(
        cls,
        name: str,
        url: str,
        command: list[str],
        log_path: str | Path,
        env: dict[str, str] | None = None,
    ):
        """Start ``command`` (with ``env`` added to this process's environment)."""
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = log_path.open("ab")
        popen = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
            env={**os.environ, **env} if env else None,
        )
        return cls(name, url, popen, log_path, log_file)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_healthy(self, deadline_s: float = 120.0, path: str = "/health") -> LaunchedProcess:
        """Block until GET ``url + path`` answers 200; raise naming the URL if it does not."""
        end = time.monotonic() + deadline_s
        with httpx.Client(timeout=2.0) as http:  # one client: each new one builds an SSL context
            while True:
                if self.popen.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} at {self.url} exited with code {self.popen.returncode} "
                        f"before it was healthy; log {self.log_path}:\n{self.log_tail()}"
                    )
                try:
                    if http.get(self.url + path).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                if time.monotonic() >= end:
                    raise TimeoutError(
                        f"{self.name} at {self.url}{path} did not answer 200 within "
                        f"{deadline_s:g} s; log {self.log_path}:\n{self.log_tail()}"
                    )
                time.sleep(0.05)

    def terminate(self) -> None:
        """Ask this process to end (SIGTERM) without waiting: several processes stopped
        together then shut down at once (``stop`` waits for each)."""
        if self.popen.poll() is None:
            self.popen.terminate()

    def stop(self, grace_s: float = 10.0) -> None:
        """End this process (SIGTERM, then SIGKILL after ``grace_s``)."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> LaunchedProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def server_command(config: ServerConfig) -> list[str]:
    """The command line that starts an embedded server with these settings, but for its API
    key: that goes in the environment (``server_env``), out of sight of ``ps``. A list is one
    JSON argument (``--lora_paths '["a=/x"]'``)."""
    cmd = [sys.executable, "-m", "kernel.engine"]
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if value is not None and f.name != "api_key":
            cmd += [f"--{f.name}", json.dumps(value) if isinstance(value, list) else str(value)]
    return cmd


def server_env(config: ServerConfig) -> dict[str, str]:
    """The environment of a server started with ``server_command``: its API key, set even when
    empty, so a key in this process's own environment never reaches a keyless server."""
    return {API_KEY_ENV: config.api_key or ""}


def launch_server(config: ServerConfig, log_path: str | Path) -> LaunchedProcess:
    """Start an embedded server as a child process (then ``.wait_healthy()``; ``.stop()`` ends
    it)."""
    config.validate()
    url = f"http://{config.host}:{config.port}"
    command, env = server_command(config), server_env(config)
    return LaunchedProcess.start("embedded server", url, command, log_path, env)
