"""The embedded server's weight and LoRA routes: weight versions, the three weight-update
paths (disk, tensor, distributed group) and their groups, and LoRA adapters loaded (from a
folder or from tensors) and unloaded.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from kernel.engine import protocol as P
from kernel.engine import weights as W
from kernel.engine.process_group import (
    GroupConfig,
    destroy_custom_process_group,
    init_custom_process_group,
)
from kernel.engine.scheduler import Scheduler, next_version
from kernel.engine.state import NO_LORA, Forbidden, ServerState, State, result_reply
from kernel.engine.weights import (
    apply_named_tensors,
    load_model,
    parse_dtype,
    read_adapter,
    receive_broadcast,
)

log = logging.getLogger(__name__)

weight_routes = APIRouter()
"""Weight versions and the three weight-update paths (disk, tensor, distributed group)."""
lora_routes = APIRouter()
"""LoRA adapters: load (from a folder or from tensors) and unload."""


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
        return result_reply(False, f"{what} failed: {exc}")
    return result_reply(True, f"Updated {n} tensors. Weight version is {s.weight_version}.")


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
    return result_reply(True, msg, new_version=body.new_version)


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
        return result_reply(False, refused, num_paused_requests=0)
    try:  # load beside the running model, off the worker thread: generation goes on
        new = await asyncio.to_thread(load_model, body.model_path, e.settings.dtype, "cpu")
    except Exception as exc:
        return result_reply(False, f"model_path {body.model_path!r}: {exc}", num_paused_requests=0)
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
    server (see kernel/engine/server.py's docstring); ValueError for an unknown format or a bad
    payload."""
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
        return result_reply(False, str(exc))
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
        return result_reply(False, f"group_name {body.group_name!r} is already initialised")
    device = next(e.model.parameters()).device
    if body.backend == "nccl" and device.type != "cuda":
        return result_reply(False, f"backend 'nccl' needs a CUDA model; this one is on {device}")
    if e.joining.locked():  # a dead peer's rendezvous must not pile up threads
        return result_reply(
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
            return result_reply(False, f"init_weights_update_group failed: {exc}")
    e.groups[body.group_name] = group
    return result_reply(True, f"Joined {body.group_name!r} as rank {body.rank_offset}.")


@weight_routes.post("/destroy_weights_update_group")
async def destroy_weights_update_group(e: State, body: P.DestroyWeightsUpdateGroupRequest):
    group = e.groups.pop(body.group_name, None)
    if group is None:
        return result_reply(False, f"group_name {body.group_name!r} is not initialised")
    await asyncio.to_thread(destroy_custom_process_group, group)
    return result_reply(True, f"Left {body.group_name!r}.")


@weight_routes.post("/update_weights_from_distributed")
async def update_weights_from_distributed(e: State, body: P.UpdateWeightsFromDistributedRequest):
    group = e.groups.get(body.group_name)
    if group is None:
        return result_reply(False, f"group_name {body.group_name!r} is not initialised")
    try:
        for d in body.dtypes:
            parse_dtype(d)
    except ValueError as exc:
        return result_reply(False, f"dtypes: {exc}")
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
