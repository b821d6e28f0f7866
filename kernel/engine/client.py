"""Async client for engines that speak SGLang's native HTTP API.

One ``EngineClient`` per base URL (an SGLang server, the embedded server, or sglang-router in
front of several) holds one long-lived ``aiohttp`` connection pool, opened on first use in the
running event loop. aiohttp, not httpx: on 2 cores httpx spent ~2.4 ms of client CPU per
generate call (its pool bookkeeping), aiohttp ~0.16 ms (``scripts/bench_vs_peers.py`` prints
the client's CPU per request). Requests never block the event loop; connection errors and 5xx
replies are retried a bounded number of times with exponential backoff (tenacity), 4xx replies
raise ``EngineError`` with the server's message at once. Calls that must not run twice
(joining a process group, receiving a broadcast) are never retried.

``generate`` returns a small typed ``GenerateResult`` and tolerates the keys SGLang leaves out
of aborted replies (no ``output_token_logprobs``, sometimes no ``weight_version``). Its
``lora_path`` names the LoRA adapter that answers (SGLang's; None: the base model), and
``load_lora_adapter``, ``load_lora_adapter_from_tensors`` and ``unload_lora_adapter`` change the
engine's adapters.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from kernel.engine.weights import encode_named_tensors

# Transport failures before a reply: refused or timed-out connections, and a pooled keep-alive
# connection the server closed just as it was reused (ServerDisconnectedError). Re-sending is
# safe for every call that retries (generation has no side effect but compute; one-shot calls
# pass retry=False). A read timeout is not retried: the server may still be working on it.
RETRYABLE = (
    aiohttp.ClientConnectionError,
    aiohttp.ClientPayloadError,
)


@dataclass
class ClientConfig:
    """Timeouts, retries and pool size of an EngineClient."""

    timeout_s: float = 600.0
    """Read timeout of one request (a long generation must fit)."""
    connect_timeout_s: float = 10.0
    """Timeout to open a connection."""
    max_retries: int = 3
    """Retries after a connection error or a 5xx reply (0: none)."""
    backoff_s: float = 0.5
    """Wait before the first retry; doubles each retry, at most 10 s."""
    max_connections: int = 256
    """Size of the shared connection pool (bounds requests in flight per client)."""
    api_key: str | None = field(default=None, repr=False)
    """Sent as ``Authorization: Bearer <api_key>`` (engines started with a key: TANDEM_API_KEY
    or --api_key_file, SGLang's --api-key)."""

    def validate(self) -> ClientConfig:
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ValueError(
                f"timeout_s and connect_timeout_s must be > 0, got {self.timeout_s} and "
                f"{self.connect_timeout_s}"
            )
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.backoff_s < 0:
            raise ValueError(f"backoff_s must be >= 0, got {self.backoff_s}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        return self


class EngineError(RuntimeError):
    """A request failed: an error reply (``status`` set) or no reply after the retries."""

    def __init__(self, message: str, url: str, status: int | None = None) -> None:
        super().__init__(f"{url}: {message}" if status is None else f"{url} [{status}]: {message}")
        self.url = url
        self.status = status


@dataclass
class Reply:
    """A reply's status and body, read in full."""

    status: int
    content: bytes
    reason: str = ""

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")


class _ServerError(Exception):
    """A 5xx reply, raised inside the retry loop so that tenacity retries it."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.status)
        self.reply = reply


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, _ServerError) or (
        isinstance(exc, RETRYABLE) and not isinstance(exc, asyncio.TimeoutError)
    )


@dataclass
class GenerateResult:
    """One generated sequence, as a rollout needs it."""

    output_ids: list[int]
    logprobs: list[float]
    """Logprob of each output token (empty when the reply had none, e.g. an aborted request)."""
    finish_reason: dict[str, Any]
    """SGLang's: {"type": "stop", "matched": ...}, {"type": "length", ...}, {"type": "abort"}."""
    weight_version: str | None
    text: str = ""
    rid: str | None = None
    prompt_tokens: int | None = None
    meta_info: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def finish_type(self) -> str:
        return self.finish_reason.get("type", "unknown")

    @property
    def aborted(self) -> bool:
        return self.finish_type == "abort"

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> GenerateResult:
        meta = reply.get("meta_info") or {}
        pairs = meta.get("output_token_logprobs") or []
        ids = reply.get("output_ids")
        if ids is None:  # replies of some SGLang versions carry the ids only with the logprobs
            ids = [int(p[1]) for p in pairs]
        version = meta.get("weight_version")
        return cls(
            output_ids=list(ids),
            logprobs=[float(p[0]) for p in pairs],
            finish_reason=meta.get("finish_reason") or {},
            weight_version=None if version is None else str(version),
            text=reply.get("text") or "",
            rid=meta.get("id"),
            prompt_tokens=meta.get("prompt_tokens"),
            meta_info=meta,
        )


class EngineClient:
    """Async client of one SGLang-protocol base URL; use ``async with`` or ``aclose()``."""

    def __init__(self, base_url: str, config: ClientConfig | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.config = (config or ClientConfig()).validate()
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        """The connection pool, made in the running event loop on first use."""
        if self._session is None or self._session.closed:
            c = self.config
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=c.connect_timeout_s, sock_read=c.timeout_s
                ),
                connector=aiohttp.TCPConnector(limit=c.max_connections, keepalive_timeout=30),
                raise_for_status=False,
                headers={"Authorization": f"Bearer {c.api_key}"} if c.api_key else None,
            )
        return self._session

    # ---- transport -------------------------------------------------------------------------

    async def _send(self, method: str, url: str, body: Any, timeout_s: float | None) -> Reply:
        timeout = None if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        async with self._http().request(method, url, json=body, timeout=timeout) as r:
            return Reply(r.status, await r.read(), r.reason or "")

    async def request(
        self, method: str, path: str, json: Any = None, *, retry: bool = True
    ) -> Reply:
        """One call with bounded retries; raises EngineError on an error reply or no reply."""
        url = self.base_url + path
        attempts = 1 + (self.config.max_retries if retry else 0)
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(attempts),
                wait=wait_exponential(multiplier=self.config.backoff_s, max=10),
                retry=retry_if_exception(_retryable),
                reraise=True,
            ):
                with attempt:
                    reply = await self._send(method, url, json, None)
                    if reply.status >= 500:
                        raise _ServerError(reply)
        except _ServerError as exc:
            reply = exc.reply
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise EngineError(f"{method} {path} failed: {exc!r}", url) from exc
        if reply.status >= 400:
            raise EngineError(_message(reply), url, reply.status)
        return reply

    async def _json(self, method: str, path: str, json: Any = None, *, retry: bool = True) -> Any:
        reply = await self.request(method, path, json, retry=retry)
        return reply.json() if reply.content else None

    # ---- generation ------------------------------------------------------------------------

    async def generate(
        self,
        input_ids: list[int],
        sampling_params: dict[str, Any] | None = None,
        *,
        rid: str | None = None,
        return_logprob: bool = True,
        lora_path: str | None = None,
    ) -> GenerateResult:
        """One prompt, one sample (use ``generate_batch`` for n > 1), by LoRA adapter
        ``lora_path`` (None: the base model)."""
        params = dict(sampling_params or {})
        if params.get("n", 1) != 1:
            raise ValueError(f"sampling_params.n={params['n']}: use generate_batch for n > 1")
        body = {"input_ids": list(input_ids), "sampling_params": params}
        body["return_logprob"] = return_logprob
        if rid is not None:
            body["rid"] = rid
        if lora_path is not None:
            body["lora_path"] = lora_path
        return GenerateResult.from_reply(await self._json("POST", "/generate", body))

    async def generate_batch(
        self,
        input_ids: list[list[int]],
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        *,
        rid: str | None = None,
        return_logprob: bool = True,
        lora_path: str | list[str | None] | None = None,
    ) -> list[GenerateResult]:
        """Several prompts in one request; n per prompt, in prompt order. ``rid`` is a prefix
        (sglang-router rejects lists of rids), so ``abort(rid)`` stops the whole batch.
        ``lora_path``: the LoRA adapter of every prompt, or a list with each one's (None: the
        base model)."""
        body = {"input_ids": [list(p) for p in input_ids], "return_logprob": return_logprob}
        body["sampling_params"] = sampling_params or {}
        if rid is not None:
            body["rid"] = rid
        if lora_path is not None:
            body["lora_path"] = lora_path
        replies = await self._json("POST", "/generate", body)
        return [GenerateResult.from_reply(r) for r in replies]

    async def abort(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        """Abort requests whose id starts with ``rid`` (or all); they answer with partial output."""
        if rid is None and not abort_all:
            raise ValueError("give rid or abort_all=True")
        await self._json("POST", "/abort_request", {"rid": rid or "", "abort_all": abort_all})

    async def pause(self, mode: str = "abort") -> None:
        """Pause generation (SGLang's modes: abort, retract, in_place)."""
        await self._json("POST", "/pause_generation", {"mode": mode})

    async def continue_generation(self) -> None:
        await self._json("POST", "/continue_generation", {})

    # ---- weights ---------------------------------------------------------------------------

    async def get_weight_version(self) -> str:
        return str((await self._json("GET", "/get_weight_version"))["weight_version"])

    async def update_weight_version(self, new_version: str, *, abort_all_requests=False) -> None:
        body = {"new_version": str(new_version), "abort_all_requests": abort_all_requests}
        await self._json("POST", "/update_weight_version", body)

    async def update_weights_from_disk(
        self, model_path: str, *, weight_version: str | None = None, abort_all_requests=False
    ) -> dict:
        body = {"model_path": model_path, "abort_all_requests": abort_all_requests}
        path = "/update_weights_from_disk"
        return await self._json("POST", path, _versioned(body, weight_version))

    async def update_weights_from_tensor(
        self, named_tensors, *, weight_version: str | None = None, abort_all_requests=False
    ) -> dict:
        """Send named tensors (a dict or (name, tensor) pairs) as base64 safetensors bytes,
        encoded on a pool thread (see kernel/engine/weights.py)."""
        payload = await asyncio.to_thread(encode_named_tensors, named_tensors)
        return await self.update_weights_from_serialized(
            [payload], weight_version=weight_version, abort_all_requests=abort_all_requests
        )

    async def update_weights_from_serialized(
        self,
        payloads: list[str],
        *,
        load_format: str | None = None,
        weight_version: str | None = None,
        abort_all_requests=False,
    ) -> dict:
        """``/update_weights_from_tensor`` with payloads already made: base64 safetensors
        (``load_format`` None) or SGLang's ``flattened_bucket`` (one per engine TP rank, made by
        ``kernel.engine.weights.FlatBucketWriter``: handles to a buffer shared on this machine,
        not the bytes)."""
        body = {
            "serialized_named_tensors": list(payloads),
            "abort_all_requests": abort_all_requests,
        }
        if load_format is not None:
            body["load_format"] = load_format
        path = "/update_weights_from_tensor"
        return await self._json("POST", path, _versioned(body, weight_version))

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        *,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
    ) -> dict:
        """Make the engine join a process group; the trainer joins as rank 0 at the same time
        (kernel.sync.init_custom_process_group). Not retried: a rendezvous happens once."""
        body = {"master_address": master_address, "master_port": master_port}
        body |= {"rank_offset": rank_offset, "world_size": world_size}
        body |= {"group_name": group_name, "backend": backend}
        return await self._json("POST", "/init_weights_update_group", body, retry=False)

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        *,
        group_name: str = "weight_update_group",
        weight_version: str | None = None,
        flush_cache: bool = True,
    ) -> dict:
        """Tell the engine to receive these tensors; the trainer broadcasts them from rank 0
        while this call is in flight. Not retried: a broadcast is received once."""
        body = {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group_name}
        body["flush_cache"] = flush_cache
        path = "/update_weights_from_distributed"
        return await self._json("POST", path, _versioned(body, weight_version), retry=False)

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> dict:
        body = {"group_name": group_name}
        return await self._json("POST", "/destroy_weights_update_group", body, retry=False)

    async def flush_cache(self) -> None:
        await self.request("POST", "/flush_cache", {})

    # ---- LoRA adapters (engines started with --enable-lora) ---------------------------------

    async def load_lora_adapter(self, name: str, path: str) -> dict:
        """Load the PEFT adapter folder ``path`` as ``name`` (a loaded name must be unloaded
        first); the reply lists ``loaded_adapters``. Not retried: a second load of the name
        fails."""
        body = {"lora_name": name, "lora_path": path}
        return await self._json("POST", "/load_lora_adapter", body, retry=False)

    async def load_lora_adapter_from_tensors(
        self,
        name: str,
        config_dict: dict[str, Any],
        serialized_tensors: str,
        load_format: str | None = None,
    ) -> dict:
        """Load an adapter sent in the request as ``name``: ``config_dict`` its
        adapter_config.json, ``serialized_tensors`` its tensors named as in its
        adapter_model.safetensors, in one ``/update_weights_from_tensor`` payload
        (``encode_named_tensors``; ``load_format`` "flattened_bucket": ``FlatBucketWriter``)."""
        body = {"lora_name": name, "config_dict": config_dict}
        body |= {"serialized_tensors": serialized_tensors, "load_format": load_format}
        return await self._json("POST", "/load_lora_adapter_from_tensors", body, retry=False)

    async def unload_lora_adapter(self, name: str) -> dict:
        """Unload adapter ``name`` once the requests it serves have finished."""
        body = {"lora_name": name}
        return await self._json("POST", "/unload_lora_adapter", body, retry=False)

    # ---- memory occupation (colocated training) --------------------------------------------

    async def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Make the engine give up its GPU memory -- ``tags`` ``weights`` and/or ``kv_cache``,
        None: all -- while its GPUs train (SGLang needs ``--enable-memory-saver``). Generation
        fails until ``resume_memory_occupation``. Not retried: a second release is an error."""
        body = {} if tags is None else {"tags": list(tags)}
        await self._json("POST", "/release_memory_occupation", body, retry=False)

    async def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Take the released memory back (None: all of it). Resumed weights are not the old
        ones (SGLang keeps them only with ``--enable-weights-cpu-backup``): update them next."""
        body = {} if tags is None else {"tags": list(tags)}
        await self._json("POST", "/resume_memory_occupation", body, retry=False)

    # ---- health and info -------------------------------------------------------------------

    async def health(self) -> bool:
        try:
            reply = await self._send("GET", self.base_url + "/health", None, 5.0)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False
        return reply.status == 200

    async def wait_healthy(self, deadline_s: float = 120.0, interval_s: float = 0.25) -> None:
        """Poll GET /health until it answers 200; TimeoutError naming the URL after the deadline."""
        end = time.monotonic() + deadline_s
        while not await self.health():
            if time.monotonic() >= end:
                raise TimeoutError(
                    f"{self.base_url}/health did not answer 200 within {deadline_s:g} s"
                )
            await asyncio.sleep(interval_s)

    async def server_info(self) -> dict:
        return await self._json("GET", "/server_info")

    async def model_info(self) -> dict:
        return await self._json("GET", "/model_info")

    async def get_load(self) -> Any:
        return await self._json("GET", "/get_load")

    # ---- sglang-router worker admin (0.3.x) ------------------------------------------------

    async def add_worker(self, url: str, **fields: Any) -> dict:
        """Register a worker with the router (POST /workers); it is used once healthy."""
        return await self._json("POST", "/workers", {"url": url, **fields})

    async def list_workers(self) -> list[dict]:
        return (await self._json("GET", "/workers"))["workers"]

    async def remove_worker(self, worker_id: str) -> dict:
        """Unregister a worker by the ``id`` that ``list_workers`` reports."""
        return await self._json("DELETE", f"/workers/{worker_id}")


def _versioned(body: dict, weight_version: str | None) -> dict:
    return body if weight_version is None else body | {"weight_version": str(weight_version)}


def _message(reply: Reply) -> str:
    """The error text of a reply: SGLang's {"error": {"message"}}, {"message"}, or the body."""
    try:
        data = reply.json()
    except ValueError:
        return reply.text.strip() or reply.reason
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        for key in ("error_message", "message", "detail"):
            if key in data:
                return str(data[key])
    return str(data)
