"""The real sglang-router (0.3.x) in front of two embedded servers: it registers them, spreads
/generate over both, takes worker admin calls, and rejects what its schema rejects; weight
updates go to each worker directly and show up in replies through the router."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from kernel.engine.client import EngineClient, EngineError
from kernel.engine.launch import free_port
from kernel.engine.router import RouterConfig, launch_router, wait_for_workers


@pytest.fixture(scope="module")
def router(server_a, server_b, tmp_path_factory):
    config = RouterConfig(port=free_port(), worker_urls=[server_a, server_b], policy="round_robin")
    proc = launch_router(config, tmp_path_factory.mktemp("router") / "router.log")
    try:
        proc.wait_healthy(deadline_s=60)
        wait_for_workers(proc.url, 2, deadline_s=60)
        yield proc.url
    finally:
        proc.stop()  # only the PID this test started


def _finished(url: str) -> int:
    return httpx.get(f"{url}/v1/loads").json()["loads"][0]["num_finished_reqs"]


def test_router_spreads_generation_over_both_workers(router, server_a, server_b):
    before = {u: _finished(u) for u in (server_a, server_b)}

    async def main():
        async with EngineClient(router) as c:
            singles = [c.generate([1, 2, i], {"max_new_tokens": 4}) for i in range(8)]
            batch = c.generate_batch([[1, 2], [3, 4, 5]], {"max_new_tokens": 3}, rid="via-router")
            return await asyncio.gather(*singles), await batch

    singles, batch = asyncio.run(main())
    assert all(len(r.output_ids) == 4 == len(r.logprobs) for r in singles)
    assert [r.rid for r in batch] == ["via-router-0", "via-router-1"]
    served = {u: _finished(u) - before[u] for u in before}
    assert sum(served.values()) == 8 + 2
    assert min(served.values()) >= 3  # round robin: each worker took a share


def test_router_rejects_batched_text_with_its_own_schema(router):
    body = {"text": ["a", "b"], "sampling_params": {"max_new_tokens": 2}}
    r = httpx.post(f"{router}/generate", json=body)
    assert r.status_code == 422  # the router's, before any worker sees it


def test_weight_updates_go_to_each_worker_directly(router, server_a, server_b, tiny_model_dir):
    async def main():
        for url in (server_a, server_b):
            async with EngineClient(url) as w:
                await w.update_weights_from_disk(str(tiny_model_dir), weight_version="r2")
        async with EngineClient(router) as c:
            replies = await asyncio.gather(
                *(c.generate([9, i], {"max_new_tokens": 2}) for i in range(4))
            )
            with pytest.raises(EngineError):  # control endpoints are not proxied
                await c.update_weight_version("x")
            return replies

    try:
        replies = asyncio.run(main())
        assert {r.weight_version for r in replies} == {"r2"}
    finally:
        for url in (server_a, server_b):
            httpx.post(f"{url}/update_weight_version", json={"new_version": "0"})


def test_worker_admin_remove_and_add(router, server_b):
    async def main():
        async with EngineClient(router) as c:
            workers = await c.list_workers()
            b = next(w for w in workers if w["url"] == server_b)
            await c.remove_worker(b["id"])
            left = await _poll(c, lambda ws: server_b not in [w["url"] for w in ws])
            await c.add_worker(server_b)
            back = await _poll(c, lambda ws: len([w for w in ws if w["is_healthy"]]) == 2)
            return left, back

    left, back = asyncio.run(main())
    assert [w["url"] for w in left] != [] and server_b not in [w["url"] for w in left]
    assert sorted(w["url"] for w in back) == sorted([w["url"] for w in left] + [server_b])


async def _poll(client: EngineClient, done, deadline_s: float = 30.0) -> list[dict]:
    end = time.monotonic() + deadline_s
    while True:
        workers = await client.list_workers()
        if done(workers):
            return workers
        assert time.monotonic() < end, f"router workers never settled: {workers}"
        await asyncio.sleep(0.1)


def test_a_keyed_pool_guards_its_engines_and_router_and_its_own_clients_get_through(
    tiny_model_dir, tmp_path
):
    """engine.api_key: the embedded engine and the real sglang-router a run starts both refuse
    requests without the key (401), the router still registers the keyed worker, the pool's
    clients send it, and a wrong key is named at once rather than waited out."""
    from kernel.engine.pool import EngineConfig, EnginePool

    cfg = EngineConfig(start_router=True, num_threads=1, api_key="pool-key").validate()
    assert "pool-key" not in repr(cfg)
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
    with EnginePool(cfg, str(tiny_model_dir), tmp_path) as pool:
        for url in (pool.urls[0], pool.router_url):
            assert httpx.post(f"{url}/generate", json=body, timeout=30).status_code == 401, url
        generators, engines = pool.clients()

        async def main():
            async with generators[0] as via_router, engines[0] as direct:
                return [
                    await c.generate([1, 2, 3], {"max_new_tokens": 2}) for c in (via_router, direct)
                ]

        assert [len(r.output_ids) for r in asyncio.run(main())] == [2, 2]
        with pytest.raises(PermissionError, match="api_key"):
            wait_for_workers(pool.router_url, 1, deadline_s=5, api_key="wrong")
        # the key is on no command line: ps shows every local user those
        for proc in (pool.router, *pool.processes):
            cmdline = Path(f"/proc/{proc.popen.pid}/cmdline").read_bytes()
            assert b"pool-key" not in cmdline and cmdline, proc
