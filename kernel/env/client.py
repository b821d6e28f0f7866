"""``RemoteEnvironment``: one episode of an environment a ``kernel env serve`` server hosts,
behind the same protocol as an in-process one (``kernel.env.Environment``).

A server that is full (429) is asked again with backoff until ``timeout_s``; one that cannot be
reached, times out, loses the session (404) or fails the step (5xx) raises ``EnvUnavailable``
(the rollout fails that episode: masked, never trained on); an action it refuses (400) raises
``BadAction``, as the environment itself would in-process. Nothing is retried once a step may
have reached the environment: a step is not idempotent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import httpx

from kernel.env import BadAction, EnvUnavailable, Observation


def _detail(r: httpx.Response) -> str:
    """The server's message: ``{"error": {"message": ...}}`` (older servers: ``detail``)."""
    try:
        data = r.json()
        error = data.get("error")
        return str(error.get("message") if isinstance(error, dict) else data.get("detail", r.text))
    except (ValueError, AttributeError):
        return r.text[:300]


class RemoteEnvironment:
    """Environment ``name`` of the server at ``url``, one session per instance."""

    def __init__(self, url: str, name: str, api_key: str | None = None, timeout_s: float = 60.0):
        self.url, self.name, self.timeout_s = url.rstrip("/"), name, timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self.http = httpx.AsyncClient(base_url=self.url, timeout=timeout_s, headers=headers)
        self.session: str | None = None

    async def _call(self, method: str, path: str, body: dict | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        wait = 0.1
        while True:
            try:
                r = await self.http.request(method, path, json=body)
            except httpx.HTTPError as e:
                what = f"{type(e).__name__}: {e or 'no answer'}"
                raise EnvUnavailable(f"environment {self.name!r} at {self.url}: {what}") from e
            if r.status_code == 429 and time.monotonic() + wait < deadline:
                await asyncio.sleep(wait)  # full: a session will close
                wait = min(wait * 2, 2.0)
                continue
            if r.status_code == 200:
                return r.json()
            message = f"environment {self.name!r} at {self.url}: HTTP {r.status_code}: {_detail(r)}"
            if r.status_code == 400:
                raise BadAction(message)
            raise EnvUnavailable(message)

    async def reset(self, item: Mapping[str, Any]) -> Observation:
        if self.session is not None:
            raise BadAction(f"environment {self.name!r}: reset once per episode (open another)")
        data = await self._call("POST", "/sessions", {"env": self.name, "item": dict(item)})
        self.session = data["session"]
        return Observation.from_json(data["observation"])

    async def step(self, action: str) -> Observation:
        if self.session is None:
            raise BadAction(f"environment {self.name!r}: step before reset")
        data = await self._call("POST", f"/sessions/{self.session}/step", {"action": action})
        return Observation.from_json(data["observation"])

    async def close(self) -> None:
        """End the session on the server (nothing to do if it is gone) and the connection."""
        try:
            if self.session is not None:
                await self.http.delete(f"/sessions/{self.session}")
        except httpx.HTTPError:
            pass
        finally:
            self.session = None
            await self.http.aclose()
