"""The environment server: ``python -m kernel env serve --environments math,code`` hosts
environments (``kernel.env``) over HTTP, one session per episode, as MRLM's ``mrlm serve`` does
over gRPC. HTTP because every other Tandem service speaks it (the engines, the router, the
retriever): one auth scheme, one client library, and curl can drive an episode by hand.

Routes (JSON; with an ``api_key`` every route but /health needs ``Authorization: Bearer KEY``):

- ``GET /health``: the environments it hosts and its open sessions;
- ``POST /sessions`` ``{"env": NAME, "item": {...}}``: a new episode, reset on the item ->
  ``{"session": ID, "observation": {...}}``;
- ``POST /sessions/ID/step`` ``{"action": TEXT}`` -> ``{"observation": {...}}``;
- ``DELETE /sessions/ID``: the episode closed (the client does this at the end of each).

Bounds and errors: at most ``max_sessions`` open episodes (429 beyond, the client waits and
retries), at most ``max_concurrent`` resets and steps running at once (others queue), each
limited to ``step_timeout_s`` (504, the session closed); a session idle for ``session_ttl_s``
is closed. An unknown environment or session is a 404 naming it, an action the environment
refuses (``BadAction``) or a step after the end a 400, two steps of one session at once a 409,
an environment that raises a 500 with its error (that session closed). No request brings the
server down.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel

from kernel.env import API_KEY_ENV, BadAction, Environment
from kernel.env.spec import EnvSpec, env_specs


@dataclass
class EnvServerConfig:
    """``python -m kernel env serve``: which environments, where, and its bounds."""

    environments: str = "math"
    """The environments to host, comma-separated: short names (kernel.env.spec.KNOWN: math,
    code, tools) or NAME=dotted.path of a class, e.g. ``math,slow=my_pkg.envs.SlowEnv``."""
    env_args: dict = field(default_factory=dict)
    """Keyword arguments per environment, e.g. '{"math": {"format_penalty": -0.5}}'."""
    host: str = "127.0.0.1"
    """Address to bind (0.0.0.0 to serve other machines; then set api_key)."""
    port: int = 8300
    """Port to bind."""
    api_key: str | None = None
    """If set, every route but /health needs ``Authorization: Bearer <api_key>`` (default: the
    TANDEM_API_KEY environment variable)."""
    max_sessions: int = 512
    """Open episodes at most; a new one beyond gets 429 until one closes."""
    max_concurrent: int = 64
    """Resets and steps running at once; more wait their turn."""
    step_timeout_s: float = 120.0
    """Longest one reset or step may take (504, and the session is closed)."""
    session_ttl_s: float = 900.0
    """An episode idle this long is closed (its client is gone)."""

    def specs(self) -> dict[str, EnvSpec]:
        settings: dict[str, dict[str, Any]] = {}
        for entry in filter(None, (e.strip() for e in self.environments.split(","))):
            name, _, path = entry.partition("=")
            settings[name.strip()] = {"path": path.strip() or None}
        if unknown := sorted(set(self.env_args) - set(settings)):
            raise ValueError(f"env_args: {unknown} not among --environments {sorted(settings)}")
        for name, args in self.env_args.items():
            if not isinstance(args, Mapping):
                raise ValueError(f"env_args[{name!r}] must be a mapping of keyword arguments")
            settings[name]["args"] = dict(args)
        if not settings:
            raise ValueError("--environments: name at least one environment")
        for bound in ("max_sessions", "max_concurrent", "step_timeout_s", "session_ttl_s"):
            if getattr(self, bound) <= 0:
                raise ValueError(f"--{bound} must be > 0")
        return env_specs(settings)


class Open(BaseModel):
    """POST /sessions: the environment and the data row to reset it on."""

    env: str
    item: dict[str, Any] = {}


class Act(BaseModel):
    """POST /sessions/ID/step: the agent's action."""

    action: str


class _Session:
    def __init__(self, name: str, env: Environment) -> None:
        self.name, self.env = name, env
        self.lock = asyncio.Lock()
        self.done = False
        self.used = time.monotonic()


def create_app(cfg: EnvServerConfig):
    """The FastAPI app of ``cfg`` (its specs checked here, before it serves)."""
    specs = cfg.specs()
    sessions: dict[str, _Session] = {}
    running = asyncio.Semaphore(cfg.max_concurrent)

    async def close(sid: str) -> None:
        if (s := sessions.pop(sid, None)) is not None:
            with contextlib.suppress(Exception):  # a failing close must not fail the request
                await s.env.close()

    async def reap() -> None:
        while True:
            await asyncio.sleep(min(cfg.session_ttl_s / 4, 30.0))
            now = time.monotonic()
            for sid, s in list(sessions.items()):
                if now - s.used > cfg.session_ttl_s and not s.lock.locked():
                    await close(sid)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        task = asyncio.create_task(reap())
        try:
            yield
        finally:
            task.cancel()
            for sid in list(sessions):
                await close(sid)

    app = FastAPI(title="Tandem environments", lifespan=lifespan)
    app.state.environments = sorted(specs)

    async def authorized(request: Request) -> None:
        given = request.headers.get("authorization", "")
        if cfg.api_key and not hmac.compare_digest(given, f"Bearer {cfg.api_key}"):
            raise HTTPException(401, "missing or wrong Authorization: Bearer key")

    async def run(sid: str, s: _Session, what: str, call) -> dict[str, Any]:
        """One reset or step of session ``sid``, bounded; the session closed if it fails."""
        try:
            async with running:
                obs = await asyncio.wait_for(call, cfg.step_timeout_s)
        except BadAction as e:
            if what == "reset":
                await close(sid)
            raise HTTPException(400, f"{s.name}: {e}") from None
        except TimeoutError:
            await close(sid)
            raise HTTPException(
                504, f"{s.name}: {what} took longer than step_timeout_s={cfg.step_timeout_s}"
            ) from None
        except Exception as e:  # the environment's own bug: this episode ends, the server stays
            await close(sid)
            raise HTTPException(500, f"{s.name}: {what} failed: {e!r}") from None
        s.used, s.done = time.monotonic(), bool(obs.done)
        return obs.to_json()

    @app.get("/health")
    async def health():
        return {"status": "ok", "environments": sorted(specs), "sessions": len(sessions)}

    @app.post("/sessions", dependencies=[Depends(authorized)])
    async def open_session(body: Open):
        if body.env not in specs:
            raise HTTPException(404, f"no environment {body.env!r} here (hosted: {sorted(specs)})")
        if len(sessions) >= cfg.max_sessions:
            raise HTTPException(429, f"max_sessions={cfg.max_sessions} episodes are open")
        sid = secrets.token_hex(8)
        s = sessions[sid] = _Session(body.env, specs[body.env].open())
        async with s.lock:
            observation = await run(sid, s, "reset", s.env.reset(body.item))
        return {"session": sid, "observation": observation}

    @app.post("/sessions/{sid}/step", dependencies=[Depends(authorized)])
    async def step(sid: str, body: Act):
        s = sessions.get(sid)
        if s is None:
            raise HTTPException(404, f"no session {sid!r} (closed, timed out or never opened)")
        if s.lock.locked():
            raise HTTPException(409, f"session {sid!r} is already taking a step")
        if s.done:
            raise HTTPException(400, f"{s.name}: the episode of session {sid!r} is over")
        async with s.lock:
            return {"observation": await run(sid, s, "step", s.env.step(body.action))}

    @app.delete("/sessions/{sid}", dependencies=[Depends(authorized)])
    async def delete(sid: str):
        if sid not in sessions:
            raise HTTPException(404, f"no session {sid!r}")
        await close(sid)
        return {"closed": sid}

    return app


def serve(cfg: EnvServerConfig) -> None:
    """Serve ``cfg`` until interrupted (the key defaults to TANDEM_API_KEY)."""
    import os

    import uvicorn

    if cfg.api_key is None:
        cfg.api_key = os.environ.get(API_KEY_ENV) or None
    app = create_app(cfg)
    print(f"environments {app.state.environments} on http://{cfg.host}:{cfg.port}", flush=True)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning", timeout_graceful_shutdown=5)
