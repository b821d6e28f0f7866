"""The embedded server's generation, status and control routes: ``/generate`` and
``/v1/chat/completions``; health, model and server info, loads; abort, pause and continue,
cache flush, memory release and resume. Weight and LoRA updates are in ``weight_routes``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from kernel.engine import protocol as P
from kernel.engine.scheduler import Request as EngineRequest
from kernel.engine.state import BadInput, State, error_reply, result_reply
from kernel.redact import redact

log = logging.getLogger(__name__)
VERSION = "tandem-embedded-0.1"


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


# The routes by area; create_app mounts them all.
generation_routes = APIRouter()
"""/generate and the OpenAI-compatible /v1/chat/completions."""
status_routes = APIRouter()
"""Health, model and server info, load."""
control_routes = APIRouter()
"""Abort, pause and continue, memory release and resume."""


@generation_routes.api_route("/generate", methods=["POST", "PUT"])
async def generate(e: State, body: P.GenerateRequest, request: Request):
    reqs, as_list = await asyncio.to_thread(e.build_requests, body)  # tokenizes: off the loop
    e.scheduler.submit(reqs)
    try:
        replies = await _await_all(request, reqs)
    except Exception as exc:
        log.exception("generation failed")
        return error_reply(500, f"generation failed: {exc}")
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
        return error_reply(503, f"memory is released ({', '.join(sorted(e.released))})")
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
        return error_reply(503, f"health generation failed: {exc!r}")
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
    return result_reply(True, f"Memory released: {released}.", released=released)


@control_routes.post("/resume_memory_occupation")
async def resume_memory_occupation(e: State, body: P.MemoryOccupationRequest | None = None):
    tags = body.tags if body else None
    released = await asyncio.wrap_future(e.scheduler.call(lambda: e.resume_memory(tags)))
    return result_reply(True, f"Memory resumed; still released: {released}.", released=released)
