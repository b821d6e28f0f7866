"""64 clients against one embedded server while a chaos task aborts their requests, pauses and
continues generation in every mode and reloads the weights (by tensor and from disk): every
request is answered (200, aborted ones with their partial output), none stays stuck, the
weights served at the end are the model's, and the server then stops promptly on SIGTERM with
requests in flight (issue 21, liveness)."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from pathlib import Path

import httpx
import pytest
from safetensors.torch import load_file

from kernel.engine.launch import free_port, launch_server
from kernel.engine.settings import ServerConfig
from kernel.engine.weights import encode_named_tensors

CLIENTS, REQUESTS_PER_CLIENT = 64, 4


@pytest.fixture
def server(tiny_model_dir, tmp_path):
    config = ServerConfig(model=str(tiny_model_dir), port=free_port(), max_batch_size=32)
    proc = launch_server(config, tmp_path / "server.log")
    try:
        proc.wait_healthy(deadline_s=180)
        yield proc
    finally:
        proc.stop()


@pytest.mark.slow
def test_64_clients_with_aborts_pauses_and_reloads(server, tiny_model_dir):
    url = server.url
    weights = {}
    for f in Path(tiny_model_dir).glob("*.safetensors"):
        weights |= load_file(f)
    payload = encode_named_tensors(weights)
    rng = random.Random(0)
    done = asyncio.Event()
    chaos_log: list[str] = []

    async def client(c: httpx.AsyncClient, k: int) -> list[httpx.Response]:
        replies = []
        for j in range(REQUESTS_PER_CLIENT):
            body = {
                "input_ids": [1 + (k + j) % 50] * (1 + (k * 7 + j) % 30),
                "sampling_params": {"max_new_tokens": 4 + (k + j) % 24, "n": 1 + k % 2},
                "return_logprob": k % 3 == 0,
                "rid": f"c{k}-{j}",
            }
            replies.append(await c.post(f"{url}/generate", json=body))
        return replies

    async def chaos(c: httpx.AsyncClient) -> None:
        actions = itertools.cycle(["abort", "pause", "version", "tensor", "disk"])
        while not done.is_set():
            action = next(actions)
            if action == "abort":
                r = await c.post(
                    f"{url}/abort_request", json={"rid": f"c{rng.randrange(CLIENTS)}-"}
                )
            elif action == "pause":
                mode = rng.choice(["abort", "retract", "in_place"])
                r = await c.post(f"{url}/pause_generation", json={"mode": mode})
                assert r.status_code == 200, r.text
                await asyncio.sleep(0.05)
                r = await c.post(f"{url}/continue_generation", json={})
            elif action == "version":
                r = await c.post(f"{url}/update_weight_version", json={"new_version": "v"})
            elif action == "tensor":
                body = {
                    "serialized_named_tensors": [payload],
                    "abort_all_requests": rng.random() < 0.5,
                }
                r = await c.post(f"{url}/update_weights_from_tensor", json=body)
            else:
                body = {"model_path": str(tiny_model_dir)}
                r = await c.post(f"{url}/update_weights_from_disk", json=body)
            assert r.status_code == 200, (action, r.text)
            chaos_log.append(action)
            await asyncio.sleep(rng.uniform(0.02, 0.2))

    async def run():
        limits = httpx.Limits(max_connections=CLIENTS + 4)
        async with httpx.AsyncClient(timeout=120, limits=limits) as c:
            chaos_task = asyncio.create_task(chaos(c))
            replies = await asyncio.gather(*(client(c, k) for k in range(CLIENTS)))
            done.set()
            await chaos_task
            return [r for rs in replies for r in rs]

    replies = asyncio.run(run())
    assert len(replies) == CLIENTS * REQUESTS_PER_CLIENT
    bad = [(r.status_code, r.text[:200]) for r in replies if r.status_code != 200]
    assert bad == [], bad[:5]
    reasons = [
        out["meta_info"]["finish_reason"]["type"]
        for r in replies
        for out in (r.json() if isinstance(r.json(), list) else [r.json()])
    ]
    assert set(reasons) <= {"length", "stop", "abort"}
    assert {"abort", "pause", "tensor", "disk"} <= set(chaos_log), chaos_log
    loads = httpx.get(f"{url}/v1/loads", timeout=10).json()["loads"][0]
    assert loads["num_running_reqs"] == 0 and loads["num_waiting_reqs"] == 0, loads

    # SIGTERM with 32 long requests in flight: the server ends (well within the 10 s grace)
    async def flood():
        async with httpx.AsyncClient(timeout=5) as c:
            body = {
                "input_ids": [5] * 8,
                "sampling_params": {"max_new_tokens": 200, "ignore_eos": True},
            }
            tasks = [asyncio.create_task(c.post(f"{url}/generate", json=body)) for _ in range(32)]
            await asyncio.sleep(0.5)
            return tasks

    async def stop_under_load():
        tasks = await flood()
        t0 = time.perf_counter()
        await asyncio.to_thread(server.stop, 30.0)
        for t in tasks:
            t.cancel()
        return time.perf_counter() - t0

    took = asyncio.run(stop_under_load())
    print(f"chaos: {len(chaos_log)} actions; shutdown under load took {took:.2f} s")
    assert server.popen.returncode is not None and server.popen.returncode != -9, took


def test_a_paused_server_with_waiting_requests_stops_on_sigterm(server):
    """A server stopped (SIGTERM: its run ends, or its parent died) while paused with requests
    waiting ends within its graceful-shutdown limit: before the limit it waited for them for
    ever (a killed job's engine, held by a partner job's requests, outlived it)."""
    url = server.url
    assert httpx.post(f"{url}/pause_generation", json={"mode": "in_place"}, timeout=10).is_success

    async def main() -> tuple[int, float]:
        async with httpx.AsyncClient(timeout=120) as c:
            body = {"input_ids": [5] * 8, "sampling_params": {"max_new_tokens": 8}}
            tasks = [asyncio.create_task(c.post(f"{url}/generate", json=body)) for _ in range(4)]
            await asyncio.sleep(1.0)
            assert not any(t.done() for t in tasks)  # held by the pause
            t0 = time.perf_counter()
            server.popen.terminate()
            rc = await asyncio.to_thread(server.popen.wait, 60)
            took = time.perf_counter() - t0
            for t in tasks:
                t.cancel()
            return rc, took

    rc, took = asyncio.run(main())
    assert rc is not None and took < 30, took
