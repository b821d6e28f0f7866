"""The gateway's HTTP app: OpenAI's chat-completions API in front of a run's agents.

``model`` names an agent of the run; the episode comes from the path
(``/episodes/{id}/v1/...``: a program given that base URL needs nothing else), else the
``X-Episode-Id`` header, else the ``user`` field. Requests are checked against the ``openai``
package's own request types; replies are its ``ChatCompletion`` model. Every bad request is a
4xx in OpenAI's error shape (``{"error": {"message", "type", "param", "code"}}``).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from openai.types.chat import ChatCompletion, completion_create_params
from pydantic import TypeAdapter, ValidationError

from kernel.auth import BearerAuth, BodyGuard
from kernel.gateway.episodes import (
    BadRequest,
    Episode,
    canonical,
    parse_tool_calls,
    rendered,
    with_tools,
)
from kernel.rollout import EpisodeAborted

REQUEST = TypeAdapter(completion_create_params.CompletionCreateParamsNonStreaming)
MAX_N = 16  # choices a call may ask for
MAX_BODY_MB = 8


def error(status: int, message: str, param: str | None = None, code: str | None = None):
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def _listed(value: Any) -> Any:
    """A validated request with its lazily checked iterables (pydantic checks ``Iterable``
    fields as they are read) read into lists: a bad item raises here."""
    if isinstance(value, dict):
        return {k: _listed(v) for k, v in value.items()}
    if isinstance(value, str | bytes | int | float | bool) or value is None:
        return value
    return [_listed(v) for v in value]


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def parse_json(raw: bytes) -> Any:
    """A body as JSON: UTF-8, no NaN or Infinity, not nested past the parser (BadRequest)."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BadRequest(f"the body is not JSON: {str(e)[:200]}") from None


def parse_request(raw: bytes) -> dict[str, Any]:
    """The body as a chat-completions request, or BadRequest naming the field."""
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    try:
        request = _listed(REQUEST.validate_python(body))
    except (ValidationError, RecursionError) as e:
        if isinstance(e, RecursionError):
            raise BadRequest("the body is nested too deeply") from None
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise BadRequest(f"{where}: {first['msg']}", where) from None
    if body.get("stream"):
        raise BadRequest("stream: streaming is not supported by the gateway yet", "stream")
    n = request.get("n") or 1
    if not 1 <= n <= MAX_N:
        raise BadRequest(f"n must be in 1..{MAX_N}, got {n}", "n")
    if not request["messages"]:
        raise BadRequest("messages is empty", "messages")
    return request


def sampling_of(request: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the engine's sampling parameters, the request's fields not honoured). An agent samples
    at its run's temperature and top_p (its ``rollout`` settings: what it trains at, and the
    logprobs it trains on are those), so a request's own are not used; the reply's
    ``X-Tandem-Ignored`` header names them and the run counts such calls
    (``episode/ignored_sampling``)."""
    sampling = {}
    limit = request.get("max_completion_tokens") or request.get("max_tokens")
    if limit is not None:
        if limit < 1:
            raise BadRequest("max_tokens must be >= 1", "max_tokens")
        sampling["max_new_tokens"] = limit
    if request.get("stop"):
        stop = request["stop"]
        sampling["stop"] = [stop] if isinstance(stop, str) else list(stop)
    ignored = [key for key in ("temperature", "top_p") if request.get(key) is not None]
    return sampling, ignored


class Gateway:
    """The episodes of a run and the app that serves them (``app``)."""

    def __init__(
        self, agents: dict[str, Any], api_key: str | None, per_call: bool, max_calls: int
    ) -> None:
        self.agents, self.per_call, self.max_calls = agents, per_call, max_calls
        self.episodes: dict[str, Episode] = {}
        self.app = self._app(api_key)

    def open(self, seed=None) -> Episode:
        """A new episode of ``seed`` (the data row's sample; needed for credit per call)."""
        episode = Episode.new(self.agents, seed, self.per_call)
        self.episodes[episode.id] = episode
        return episode

    def close(self, episode: Episode) -> None:
        episode.closed = True
        self.episodes.pop(episode.id, None)

    def _episode(self, request: Request, body: dict[str, Any], path_id: str | None) -> Episode:
        given = path_id or request.headers.get("x-episode-id") or body.get("user")
        if not given:
            raise BadRequest(
                "no episode: use the base URL the run gave (/episodes/ID/v1), the X-Episode-Id "
                "header or the user field",
                "user",
            )
        episode = self.episodes.get(given)
        if episode is None or episode.closed:
            raise BadRequest(f"episode {given[:64]!r} is not open", "user", "episode_not_open")
        return episode

    async def complete(self, request: Request, path_id: str | None = None) -> JSONResponse:
        try:
            body = parse_request(await request.body())
            episode = self._episode(request, body, path_id)
            agent = body["model"]
            if agent not in self.agents:
                raise BadRequest(
                    f"model {agent[:64]!r} is no agent of this run ({sorted(self.agents)})",
                    "model",
                    "model_not_found",
                )
            if episode.calls + episode.pending >= self.max_calls:
                message = f"the episode made {self.max_calls} calls, its limit (max_calls)"
                return error(429, message, None, "too_many_calls")
            sampling, ignored = sampling_of(body)
            messages = with_tools(body["messages"], body.get("tools"))
            result = await self._generate(episode, agent, messages, sampling, body.get("n") or 1)
        except BadRequest as e:
            status = 404 if e.code in ("model_not_found", "episode_not_open") else 400
            return error(status, str(e), e.param, e.code)
        except EpisodeAborted as e:
            return error(503, f"the engine aborted the call ({e}); the episode is rolled again")
        episode.ignored += bool(ignored)
        headers = {"x-tandem-ignored": ",".join(ignored)} if ignored else {}
        return JSONResponse(result, headers=headers)

    async def _generate(self, episode, agent, messages, sampling, n) -> dict[str, Any]:
        thread, known = episode.thread_for(agent, messages)
        threads = [thread]
        thread.busy = True
        episode.pending += 1
        try:
            _extend(episode, agent, thread, messages, known)
            threads += [thread.fork() for _ in range(n - 1)]  # busy, as the thread is
            episode.threads[agent] += threads[1:]
            try:
                texts = await _speak_all(threads, sampling)
            except EpisodeAborted as e:
                episode.aborted = str(e)
                raise
        finally:
            episode.pending -= 1
            for t in threads:
                t.busy = False
        episode.calls += 1
        choices, prompt_tokens, completion_tokens = [], 0, 0
        for i, (t, text) in enumerate(zip(threads, texts, strict=True)):
            if text is None:
                raise BadRequest(
                    "the agent's context is spent (rollout.max_context_len)",
                    "messages",
                    "context_length_exceeded",
                )
            content, calls = parse_tool_calls(text, episode.id, episode.calls)
            message = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            t.seen.append(_canonical(message, -1))
            episode.record_turn(f"chatcmpl-{episode.id}-{episode.calls}", agent, t)
            finish = (
                "tool_calls" if calls else ("stop" if t.dialogue.finish == "stop" else "length")
            )
            choices.append({"index": i, "message": message, "finish_reason": finish})
            prompt_tokens = t.dialogue.turn_start  # the dialogue before the turn
            completion_tokens += len(t.dialogue.reply.output_ids)
        reply = ChatCompletion(
            id=f"chatcmpl-{episode.id}-{episode.calls}",
            object="chat.completion",
            created=int(time.time()),
            model=agent,
            choices=choices,
            usage={
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        )
        return reply.model_dump(mode="json", exclude_none=True)

    async def reward(self, request: Request, episode_id: str) -> JSONResponse:
        """``POST /v1/episodes/{id}/reward``: ``{"reward": x}`` for every agent,
        ``{"agent": name, "reward": x}`` for one, or (credit per call) ``{"completion_id": id,
        "reward": x}`` for one call's turn; a later one replaces an earlier."""
        try:
            body = parse_json(await request.body())
            episode = self.episodes.get(episode_id)
            if episode is None or episode.closed:
                raise BadRequest(
                    f"episode {episode_id[:64]!r} is not open", None, "episode_not_open"
                )
            if not isinstance(body, dict) or set(body) - {"agent", "reward", "completion_id"}:
                raise BadRequest(
                    'give {"reward": x}, {"agent": name, "reward": x} or '
                    '{"completion_id": id, "reward": x}'
                )
            agent, value = body.get("agent", "*"), body.get("reward")
            call = body.get("completion_id")
            if call is not None and call not in {c for c, _ in episode.turns}:
                raise BadRequest(
                    f"completion_id {str(call)[:80]!r} is no call of this episode with credit "
                    "per call (recipe_args.credit: call)",
                    "completion_id",
                )
            if agent != "*" and agent not in self.agents:
                raise BadRequest(f"agent {str(agent)[:64]!r} is no agent of this run", "agent")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise BadRequest("reward must be a number", "reward")
        except BadRequest as e:
            return error(404 if e.code == "episode_not_open" else 400, str(e), e.param, e.code)
        if call is not None:
            episode.call_rewards[call] = float(value)
        else:
            episode.rewards[agent] = float(value)
        return JSONResponse({"episode": episode_id, "agent": agent, "reward": float(value)})

    def _app(self, api_key: str | None) -> FastAPI:
        app = FastAPI(title="Tandem gateway", docs_url=None, redoc_url=None, openapi_url=None)

        @app.get("/health")
        async def health():
            return {"status": "ok", "episodes": len(self.episodes)}

        @app.get("/v1/models")
        @app.get("/episodes/{episode_id}/v1/models")
        async def models(episode_id: str | None = None):
            data = [
                {"id": a, "object": "model", "created": 0, "owned_by": "tandem"}
                for a in self.agents
            ]
            return {"object": "list", "data": data}

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            return await self.complete(request)

        @app.post("/episodes/{episode_id}/v1/chat/completions")
        async def chat_in(request: Request, episode_id: str):
            return await self.complete(request, episode_id)

        @app.post("/v1/episodes/{episode_id}/reward")
        async def reward(request: Request, episode_id: str):
            return await self.reward(request, episode_id)

        too_large = f"the body exceeds {MAX_BODY_MB} MB"
        app.add_middleware(BodyGuard, limit=MAX_BODY_MB << 20, too_large=too_large)
        app.add_middleware(BearerAuth, api_key=api_key)  # outermost: the key first
        return app


def _extend(episode: Episode, agent: str, thread, messages: list, known: int) -> None:
    """Add the messages new to ``thread`` (from ``known`` on) to its dialogue."""
    for i, m in enumerate(messages[known:], start=known):
        role, text = rendered(m, f"messages[{i}]")
        if not thread.dialogue.say(role, text):
            if not known:  # a thread that never held a turn: gone with the call
                episode.threads[agent].remove(thread)
            raise BadRequest(
                "the messages exceed the agent's context (rollout.max_context_len)",
                "messages",
                "context_length_exceeded",
            )
        thread.seen.append(_canonical(m, i))


def _canonical(message: dict[str, Any], i: int) -> tuple:
    return canonical(message, f"messages[{i}]")


async def _speak_all(threads, sampling) -> list[str | None]:
    return list(await asyncio.gather(*(t.dialogue.speak(dict(sampling)) for t in threads)))
