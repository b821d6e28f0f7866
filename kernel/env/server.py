"""The environment server: ``python -m kernel env serve --environments math,code`` hosts
environments (``kernel.env``) over HTTP, one session per episode, as MRLM's ``mrlm serve`` does
over gRPC. HTTP because every other Tandem service speaks it (the engines, the router, the
retriever): one auth scheme (``kernel.auth``), one client library, and curl can drive an episode
by hand.

Routes (JSON; with a key every route but /health needs ``Authorization: Bearer KEY``):

- ``GET /health``: the environments it hosts, its open sessions and its worker processes;
- ``POST /sessions`` ``{"env": NAME, "item": {...}}``: a new episode, reset on the item ->
  ``{"session": ID, "observation": {...}}``;
- ``POST /sessions/ID/step`` ``{"action": TEXT}`` -> ``{"observation": {...}}``;
- ``DELETE /sessions/ID``: the episode closed (the client does this at the end of each).

The key comes from the ``TANDEM_API_KEY`` environment variable or ``--api_key_file PATH`` (a
file only the server's user may read), never from the command line (``kernel.auth``).

No request can stall it. The server's event loop only parses bounded requests and waits: every
reset, step and close runs in a worker process (``kernel.env.workers``) under ``step_timeout_s``,
and a call that outlives it has its worker killed with every process it started (504, the
session closed). So a policy's action -- a quadratic scan, a tower of powers, code that forks or
floods -- costs its own episode a worker, never ``/health`` or another session. Between calls an
episode's environment lives in the server as its pickled state (a hosted environment must
pickle; one holding what cannot defines ``__getstate__``), so a killed worker loses nothing but
the step it was taking.

Bounds and errors, every one an answer with a JSON ``{"error": {"message": ...}}`` that names
what is wrong (and never echoes input it cannot encode): a request body over ``max_body_mb`` or
an action over ``max_action_chars`` 413; a POST that is not ``Content-Type: application/json``
415; a body that is not JSON, holds NaN/Infinity or a lone surrogate 400; a body of the wrong
shape 422; an unknown environment or session 404; at most ``max_sessions`` open episodes (429
beyond: the client waits and retries; a reset that fails holds no session); at most
``max_concurrent`` resets and steps running at once (others queue), and at most ``workers``
worker processes; an action the environment refuses (``BadAction``) or a step after the end
400; two steps of one session at once 409; a missing or wrong key 401. What the agent gets
wrong inside an action is the environment's to answer as an observation (the tools environment
turns every tool error into one). Only an environment's own bug (it raises, or its worker dies)
is a 500 naming it, that session closed; a session idle for ``session_ttl_s`` is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from kernel.auth import API_KEY_ENV, BearerAuth, BodyGuard, error_body, server_key
from kernel.env import BadAction, Observation
from kernel.env.spec import EnvSpec, env_specs
from kernel.env.workers import WorkerFailed, WorkerLost, WorkerPool, WorkerTimeout


@dataclass
class EnvServerConfig:
    """``python -m kernel env serve``: which environments, where, and its bounds."""

    environments: str = "math"
    """The environments to host, comma-separated: short names (kernel.env.spec.KNOWN: math,
    code, tools) or NAME=dotted.path of a class, e.g. ``math,slow=my_pkg.envs.SlowEnv``."""
    env_args: dict = field(default_factory=dict)
    """Keyword arguments per environment, e.g. '{"math": {"format_penalty": -0.5}}'."""
    host: str = "127.0.0.1"
    """Address to bind (0.0.0.0 to serve other machines; then give a key)."""
    port: int = 8300
    """Port to bind."""
    api_key: str | None = field(default=None, repr=False)
    """The Bearer key every route but /health then needs. Never on the command line (refused
    there: any local user can read it): ``serve`` takes it from --api_key_file or the
    TANDEM_API_KEY environment variable."""
    api_key_file: str | None = None
    """A file holding the key, readable by the server's user only (chmod 600)."""
    max_sessions: int = 512
    """Open episodes at most; a new one beyond gets 429 until one closes."""
    max_concurrent: int = 64
    """Resets and steps running at once; more wait their turn."""
    workers: int = 8
    """Worker processes at most (started as needed): each runs one reset, step or close at a
    time, so this bounds the CPU the hosted environments take."""
    worker_memory_mb: int = 4096
    """Address-space limit of each worker process (a runaway call gets MemoryError); 0: none."""
    step_timeout_s: float = 120.0
    """Longest one reset or step may take (504: its worker killed, the session closed)."""
    session_ttl_s: float = 900.0
    """An episode idle this long is closed (its client is gone)."""
    max_action_chars: int = 200_000
    """Longest action a step takes (413 beyond)."""
    max_body_mb: float = 4.0
    """Largest request body in MiB (413 beyond, counted as it arrives)."""

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
        for bound in (
            "max_sessions",
            "max_concurrent",
            "workers",
            "step_timeout_s",
            "session_ttl_s",
            "max_action_chars",
            "max_body_mb",
        ):
            if getattr(self, bound) <= 0:
                raise ValueError(f"--{bound} must be > 0")
        if self.worker_memory_mb < 0:
            raise ValueError("--worker_memory_mb must be >= 0")
        return env_specs(settings)


class Open(BaseModel):
    """POST /sessions: the environment and the data row to reset it on."""

    env: str
    item: dict[str, Any] = {}


class Act(BaseModel):
    """POST /sessions/ID/step: the agent's action."""

    action: str


# ---- in a worker process: one call on an environment, its state pickled in and out ----------


def _observation(obs: Observation) -> bytes:
    """The observation as UTF-8 JSON, made here in the worker (a lone surrogate the environment
    put in a string becomes '?'; a non-finite reward is the environment's bug: ValueError)."""
    if not isinstance(obs, Observation):
        raise TypeError(f"the environment returned {type(obs).__name__}, not an Observation")
    data = obs.to_json()
    try:
        return json.dumps(data, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(data, ensure_ascii=True, allow_nan=False)
        clean = json.loads(text, object_hook=_replace_surrogates)
        return json.dumps(_replace_surrogates(clean), ensure_ascii=False).encode("utf-8")


def _replace_surrogates(value):
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_replace_surrogates(k): _replace_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_surrogates(v) for v in value]
    return value


async def _close_quietly(env) -> None:
    with contextlib.suppress(Exception):
        await env.close()


async def _open(spec: EnvSpec, item: dict) -> tuple:
    """A new episode: ("ok", state, observation) or ("bad", message) (nothing left open)."""
    env = spec.open()
    try:
        obs = await env.reset(item)
        return "ok", pickle.dumps(env), _observation(obs), bool(obs.done)
    except BadAction as e:
        await _close_quietly(env)
        return "bad", str(e)
    except BaseException:
        await _close_quietly(env)
        raise


async def _step(state: bytes, action: str) -> tuple:
    """One step: ("ok", state, observation, done) or ("bad", message, state)."""
    env = pickle.loads(state)
    try:
        obs = await env.step(action)
    except BadAction as e:
        return "bad", str(e), pickle.dumps(env)
    return "ok", pickle.dumps(env), _observation(obs), bool(obs.done)


async def _close(state: bytes) -> None:
    await pickle.loads(state).close()


# ---- in the server ---------------------------------------------------------------------------


class _Session:
    def __init__(self, name: str, state: bytes) -> None:
        self.name, self.state = name, state
        self.lock = asyncio.Lock()
        self.done = False
        self.used = time.monotonic()


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _parse(raw: bytes, model: type[BaseModel]) -> BaseModel:
    """A request body as ``model``: HTTPException 400 for what is not strict JSON (NaN,
    Infinity, a lone surrogate, nesting too deep), 422 naming the fields of the wrong shape."""
    try:
        data = json.loads(raw, parse_constant=_no_constant)
        json.dumps(data, ensure_ascii=False).encode("utf-8")  # a lone surrogate raises here
    except UnicodeError as e:
        raise HTTPException(400, f"the body is not valid UTF-8 text: {e.reason}") from None
    except RecursionError:
        raise HTTPException(400, "the body's JSON is nested too deeply") from None
    except ValueError as e:
        raise HTTPException(400, f"the body is not strict JSON: {_short(e)}") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise HTTPException(422, _fields(e)) from None


def _fields(exc: ValidationError | RequestValidationError) -> str:
    """pydantic's errors as 'field: problem; ...', never the input itself."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        msg = "field required" if err.get("type") == "missing" else err.get("msg", "invalid")
        parts.append(f"{loc}: {msg}" if loc else str(msg))
    return "; ".join(dict.fromkeys(parts[:4])) or "invalid request"


def _short(e: BaseException) -> str:
    return str(e)[:300]


def _json(payload: bytes) -> Response:
    return Response(payload, media_type="application/json")


async def _body(request: Request, model: type[BaseModel]):
    """The request's body parsed as ``model`` (``_parse``'s errors)."""
    raw = await request.body()  # at most max_body_mb: BodyGuard counts it
    return await asyncio.to_thread(_parse, raw, model)  # linear, but off the loop


class _Host:
    """The hosted episodes: the open sessions, the worker pool every reset, step and close runs
    in, and ``cfg``'s bounds on both. ``create_app`` serves its public coroutines as routes."""

    def __init__(self, cfg: EnvServerConfig, specs: dict[str, EnvSpec]) -> None:
        self.cfg, self.specs = cfg, specs
        self.sessions: dict[str, _Session] = {}
        self.opening = 0  # resets in flight: they count against max_sessions
        self.running = asyncio.Semaphore(cfg.max_concurrent)
        self.closing: set[asyncio.Task] = set()
        # the fork server imports the environments' modules once: every worker starts warm
        preload = ("kernel.env.server", *sorted({s.factory().__module__ for s in specs.values()}))
        self.pool = WorkerPool(cfg.workers, preload, cfg.worker_memory_mb)
        self.close_timeout = min(cfg.step_timeout_s, 30.0)

    # ---- sessions and workers

    async def _finish(self, state: bytes) -> None:
        with contextlib.suppress(Exception):
            await self.pool.run(self.close_timeout, _close, state)

    def close(self, sid: str) -> None:
        """Forget session ``sid`` now; its environment is closed in a worker meanwhile."""
        if (s := self.sessions.pop(sid, None)) is not None:
            task = asyncio.create_task(self._finish(s.state))
            self.closing.add(task)
            task.add_done_callback(self.closing.discard)

    async def _reap(self) -> None:
        """Close each session idle longer than session_ttl_s (none taking a step), for ever."""
        while True:
            await asyncio.sleep(min(self.cfg.session_ttl_s / 4, 30.0))
            now = time.monotonic()
            for sid, s in list(self.sessions.items()):
                if now - s.used > self.cfg.session_ttl_s and not s.lock.locked():
                    self.close(sid)

    @contextlib.asynccontextmanager
    async def lifespan(self, _app):
        """The app's lifespan: warm workers and the reaper while it serves; on the way out
        every session closed and the pool stopped."""
        await self.pool.warm(2)  # the fork server and two workers, before the port answers
        task = asyncio.create_task(self._reap())
        try:
            yield
        finally:
            task.cancel()
            for sid in list(self.sessions):
                self.close(sid)
            if self.closing:
                await asyncio.wait(set(self.closing), timeout=5.0)
            await asyncio.to_thread(self.pool.close)

    async def _call(self, fn, *args) -> tuple:
        """``fn(*args)`` in a worker, under max_concurrent and step_timeout_s."""
        async with self.running:
            return await self.pool.run(self.cfg.step_timeout_s, fn, *args)

    def _failed(self, name: str, what: str, e: Exception) -> HTTPException:
        """The answer to a worker call that failed: 504 when it timed out, else 500."""
        if isinstance(e, WorkerTimeout):
            message = f"{name}: {what} took longer than step_timeout_s={self.cfg.step_timeout_s}"
            return HTTPException(504, message)
        reason = "its worker died" if isinstance(e, WorkerLost) else str(e)
        return HTTPException(500, f"{name}: {what} failed: {reason}")

    # ---- routes

    async def health(self):
        return {
            "status": "ok",
            "environments": sorted(self.specs),
            "sessions": len(self.sessions),
            "workers": self.pool.started,
        }

    async def open_session(self, request: Request):
        cfg, specs = self.cfg, self.specs
        req: Open = await _body(request, Open)
        if req.env not in specs:
            name = req.env[:100]
            raise HTTPException(404, f"no environment {name!r} here (hosted: {sorted(specs)})")
        if len(self.sessions) + self.opening >= cfg.max_sessions:
            raise HTTPException(429, f"max_sessions={cfg.max_sessions} episodes are open")
        self.opening += 1
        try:
            result = await self._call(_open, specs[req.env], req.item)
        except (WorkerFailed, WorkerLost, WorkerTimeout) as e:
            raise self._failed(req.env, "reset", e) from None
        finally:
            self.opening -= 1
        if result[0] == "bad":
            raise HTTPException(400, f"{req.env}: {result[1]}")
        _, state, observation, done = result
        sid = secrets.token_hex(8)
        self.sessions[sid] = _Session(req.env, state)
        self.sessions[sid].done = done
        return _json(b'{"session":"%s","observation":%s}' % (sid.encode(), observation))

    async def step(self, sid: str, request: Request):
        req: Act = await _body(request, Act)
        s = self.sessions.get(sid)
        if s is None:
            raise HTTPException(404, f"no session {sid[:40]!r} (closed, timed out or never opened)")
        if s.lock.locked():
            raise HTTPException(409, f"session {sid!r} is already taking a step")
        if s.done:
            raise HTTPException(400, f"{s.name}: the episode of session {sid!r} is over")
        if len(req.action) > self.cfg.max_action_chars:
            message = f"an action of {len(req.action)} characters: max_action_chars is "
            raise HTTPException(413, message + str(self.cfg.max_action_chars))
        async with s.lock:
            try:
                result = await self._call(_step, s.state, req.action)
            except (WorkerFailed, WorkerLost, WorkerTimeout) as e:
                self.close(sid)
                raise self._failed(s.name, "step", e) from None
            except asyncio.CancelledError:  # the client left mid-step: its outcome is unknown
                self.close(sid)
                raise
        if self.sessions.get(sid) is not s:  # closed meanwhile (DELETE, the reaper)
            raise HTTPException(404, f"session {sid!r} was closed during its step")
        if result[0] == "bad":
            s.state, s.used = result[2], time.monotonic()
            raise HTTPException(400, f"{s.name}: {result[1]}")
        _, s.state, observation, s.done = result
        s.used = time.monotonic()
        return _json(b'{"observation":%s}' % observation)

    async def delete(self, sid: str):
        if sid not in self.sessions:
            raise HTTPException(404, f"no session {sid[:40]!r}")
        self.close(sid)
        return {"closed": sid}


def _answer_errors(app: FastAPI) -> None:
    """Every error as a JSON ``{"error": {"message": ...}}``: HTTP errors with their detail, a
    request of the wrong shape 422 naming its fields, the server's own bug a 500 naming only
    its type (never a traceback)."""

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException):
        return Response(error_body(str(exc.detail)), exc.status_code, media_type="application/json")

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        return Response(error_body(_fields(exc)), 422, media_type="application/json")

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception):  # the server's own bug: said, never a traceback
        message = f"internal error ({type(exc).__name__})"
        return Response(error_body(message), 500, media_type="application/json")


def create_app(cfg: EnvServerConfig):
    """The FastAPI app of ``cfg`` (its specs checked here, before it serves)."""
    host = _Host(cfg, cfg.specs())
    app = FastAPI(title="Tandem environments", lifespan=host.lifespan)
    app.state.environments = sorted(host.specs)
    app.state.pool = host.pool
    _answer_errors(app)
    app.get("/health")(host.health)
    app.post("/sessions")(host.open_session)
    app.post("/sessions/{sid}/step")(host.step)
    app.delete("/sessions/{sid}")(host.delete)

    limit = int(cfg.max_body_mb * 2**20)
    too_large = f"the request body exceeds max_body_mb ({limit} bytes)"
    app.add_middleware(BodyGuard, limit=limit, too_large=too_large)
    app.add_middleware(BearerAuth, api_key=cfg.api_key)  # outermost: before anything is read
    return app


def serve(cfg: EnvServerConfig) -> None:
    """Serve ``cfg`` until interrupted; its key from ``api_key_file`` or TANDEM_API_KEY."""
    import uvicorn

    if cfg.api_key is None:
        cfg.api_key = server_key(cfg.api_key_file)
    elif cfg.api_key_file:
        raise ValueError("give the key once: api_key (in a config file) or --api_key_file")
    os.environ.pop(API_KEY_ENV, None)  # read: no process this server starts inherits it
    app = create_app(cfg)
    print(f"environments {app.state.environments} on http://{cfg.host}:{cfg.port}", flush=True)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning", timeout_graceful_shutdown=5)
