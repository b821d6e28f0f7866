"""The embedded inference server: SGLang's native HTTP API over any HF causal LM, on CPU or GPU.

Tandem's rollouts talk to inference engines over SGLang's protocol (kernel/engine/protocol.py).
On a GPU node those are real SGLang servers behind sglang-router; on a laptop or CI box this
server stands in for them with the same endpoints, so the same client, router and weight-sync
code runs everywhere. ``create_app(ServerConfig(...))`` returns the FastAPI app, its routes in
five groups (``generation_routes``, ``status_routes``, ``control_routes`` in
``kernel.engine.routes``; ``weight_routes``, ``lora_routes`` in ``kernel.engine.weight_routes``),
each handler given the ``ServerState`` (``kernel.engine.state``) by dependency (``State``); the
settings are ``kernel.engine.settings.ServerConfig``. The model is loaded at start-up (the port
opens once it is ready), and all model work runs on the worker thread of
``kernel.engine.scheduler.Scheduler`` -- handlers only validate, enqueue and await. This module
only builds the app: it mounts the routes, answers each error of ``kernel.engine.state`` with
its HTTP status, and adds the middleware.

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
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError

from kernel.auth import BearerAuth, BodyGuard
from kernel.engine.routes import control_routes, generation_routes, status_routes
from kernel.engine.settings import ServerConfig
from kernel.engine.state import BadInput, Forbidden, MemoryReleased, ServerState, error_reply
from kernel.engine.weight_routes import lora_routes, weight_routes


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
        return error_reply(400, _format_validation(exc))

    @app.exception_handler(BadInput)
    async def _bad(_: Request, exc: BadInput):
        return error_reply(400, str(exc))

    @app.exception_handler(MemoryReleased)
    async def _released(_: Request, exc: MemoryReleased):
        return error_reply(503, str(exc))

    @app.exception_handler(Forbidden)
    async def _forbidden(_: Request, exc: Forbidden):
        return error_reply(403, str(exc))

    for router in (generation_routes, status_routes, control_routes, weight_routes, lora_routes):
        app.include_router(router)
    too_large = f"the request body exceeds max_request_mb = {settings.max_request_mb} MiB"
    app.add_middleware(BodyGuard, limit=int(settings.max_request_mb * 2**20), too_large=too_large)
    app.add_middleware(BearerAuth, api_key=settings.api_key)  # outermost: the key first
    return app
