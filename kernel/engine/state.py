"""What one running embedded server holds (``ServerState``: tokenizer, scheduler and model,
memory release and resume, LoRA adapters, the engine requests a ``/generate`` body expands to)
and what its routes share: the ``State`` dependency that hands it to them, the errors they
raise (``create_app`` maps each to its HTTP status) and the two reply shapes they return.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse

from kernel.engine import protocol as P
from kernel.engine.process_group import destroy_custom_process_group
from kernel.engine.scheduler import Request as EngineRequest
from kernel.engine.scheduler import Scheduler, use_onednn_linears
from kernel.engine.settings import ServerConfig, lora_spec
from kernel.engine.weights import base_names, load_model, read_adapter
from kernel.models import load_tokenizer

log = logging.getLogger(__name__)


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


def error_reply(status: int, message: str) -> JSONResponse:
    """SGLang's error reply, ``{"error": {"message": ...}}``, with HTTP ``status``."""
    return JSONResponse({"error": {"message": message}}, status_code=status)


def result_reply(success: bool, message: str, **extra) -> JSONResponse:
    """SGLang's reply to a control or weight call, ``{"success", "message", **extra}`` (HTTP 400
    when it failed)."""
    return JSONResponse(
        {"success": success, "message": message, **extra}, status_code=200 if success else 400
    )


def _state(request: Request) -> ServerState:
    return request.app.state.engine


State = Annotated[ServerState, Depends(_state)]
"""A route's server state (the app's, loaded at start-up)."""
