"""RequestBatcher and batched admission against real embedded servers: the concurrent calls of a
rollout become one request, a prompt's samples one prefill row shared by n, each caller gets
its own exact result, faults stay with their caller, and an idle engine gathers requests that
arrive apart into one prefill."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from kernel.engine.batcher import RequestBatcher
from kernel.engine.client import EngineClient, EngineError
from kernel.engine.launch import free_port, launch_server
from kernel.engine.pool import EngineConfig, EnginePool
from kernel.engine.settings import ServerConfig
from kernel.rollout import EpisodeAborted

PROMPTS = [[5, 17, 300], list(range(100, 111)), [42] * 7, [9, 1000]]
PARAMS = {"temperature": 1.0, "max_new_tokens": 6, "ignore_eos": True}


def _state(url: str) -> dict:
    return httpx.get(f"{url}/server_info", timeout=30).json()["internal_states"][0]


def test_a_rollouts_calls_are_one_request_and_a_prompts_samples_one_prefill_row(
    server_a, tiny_model, reference_logprobs
):
    before = _state(server_a)

    async def main():
        async with EngineClient(server_a) as client:
            batcher = RequestBatcher([client])
            calls = [batcher.submit(p, PARAMS) for p in PROMPTS for _ in range(8)]
            return await asyncio.gather(*calls), batcher.stats

    results, stats = asyncio.run(main())
    after = _state(server_a)
    assert stats == {"calls": 32, "requests": 1}
    # 32 rows on a server that runs 16 at a time: two admissions, each prefilling the 2 distinct
    # prompts of its 16 rows once
    assert after["num_prefills"] - before["num_prefills"] == 2
    assert after["num_prefill_rows"] - before["num_prefill_rows"] == 4
    for i, prompt in enumerate(PROMPTS):
        group = results[8 * i : 8 * i + 8]
        assert len({tuple(r.output_ids) for r in group}) > 1  # eight samples, not one copied
        for r in group:
            assert r.prompt_tokens == len(prompt) and len(r.output_ids) == 6
            ref = reference_logprobs(tiny_model, prompt, r.output_ids, 1.0)
            assert max(abs(a - b) for a, b in zip(ref, r.logprobs, strict=True)) < 1e-4


def test_distinct_params_and_window_zero(server_a):
    async def main():
        async with EngineClient(server_a) as client:
            batcher = RequestBatcher([client])
            cold = {**PARAMS, "temperature": 0.0}
            mixed = await asyncio.gather(
                *(batcher.submit(PROMPTS[0], p) for p in (PARAMS, PARAMS, cold, cold))
            )
            alone = RequestBatcher([client], window_s=0)
            await asyncio.gather(*(alone.submit(p, PARAMS) for p in PROMPTS))
            return mixed, batcher.stats, alone.stats

    mixed, stats, alone = asyncio.run(main())
    assert stats == {"calls": 4, "requests": 2}  # one per set of sampling params
    assert mixed[2].output_ids == mixed[3].output_ids  # greedy rows agree
    assert alone == {"calls": 4, "requests": 4}


def test_a_refused_prompt_fails_only_its_own_caller(server_a):
    too_long = [7] * 2045  # + 6 new tokens exceeds the tiny model's 2048 context

    async def main():
        async with EngineClient(server_a) as client:
            batcher = RequestBatcher([client])
            calls = [batcher.submit(p, PARAMS) for p in [*PROMPTS[:3], too_long]]
            return await asyncio.gather(*calls, return_exceptions=True), batcher.stats

    results, stats = asyncio.run(main())
    assert [type(r).__name__ for r in results[:3]] == ["GenerateResult"] * 3
    assert isinstance(results[3], EngineError) and results[3].status == 400
    assert "context length" in str(results[3])
    assert stats["requests"] == 1 + 4  # the refused batch, then each prompt on its own


def test_rows_the_engine_aborts_abort_their_callers(server_a):
    async def main():
        async with EngineClient(server_a) as client:
            batcher = RequestBatcher([client])
            long = {"max_new_tokens": 400, "ignore_eos": True}
            calls = [batcher.submit([1, 2, 3 + i], long) for i in range(3)]
            while httpx.get(f"{server_a}/v1/loads").json()["loads"][0]["num_running_reqs"] < 3:
                await asyncio.sleep(0.02)  # all three are decoding
            await client.pause("abort")
            aborted = await asyncio.gather(*calls, return_exceptions=True)
            await client.continue_generation()
            after = await batcher.submit([1, 2], {"max_new_tokens": 2})
            return aborted, after

    aborted, after = asyncio.run(main())
    assert all(isinstance(r, EpisodeAborted) and "abort" in str(r) for r in aborted)
    assert len(after.output_ids) == 2


def test_a_dead_engine_leaves_the_rotation_and_its_share_goes_to_the_next(server_a, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    pool = EnginePool(EngineConfig(urls=[dead, server_a]), "unused", tmp_path)

    async def main():
        clients = [EngineClient(u) for u in pool.urls]
        try:
            batcher = RequestBatcher(clients, pool)
            return await asyncio.gather(*(batcher.submit(p, PARAMS) for p in PROMPTS))
        finally:
            for c in clients:
                await c.aclose()

    results = asyncio.run(main())
    assert [r.prompt_tokens for r in results] == [len(p) for p in PROMPTS]
    assert pool.down == {dead}


@pytest.fixture(scope="module")
def patient_server(tiny_model_dir, tmp_path_factory):
    """A server whose idle engine waits long for company (a wide window for a clear test)."""
    config = ServerConfig(
        model=str(tiny_model_dir), port=free_port(), num_threads=1, gather_window_ms=300
    )
    log = tmp_path_factory.mktemp("patient") / "server.log"
    with launch_server(config, log).wait_healthy(180) as server:
        yield server.url


def test_an_idle_engine_gathers_requests_sent_apart_into_one_prefill(patient_server):
    before = _state(patient_server)

    async def main():
        async with EngineClient(patient_server) as client:

            async def one(i):
                await asyncio.sleep(0.03 * i)  # three requests, 30 ms apart
                return await client.generate(PROMPTS[i], PARAMS)

            return await asyncio.gather(*(one(i) for i in range(3)))

    results = asyncio.run(main())
    after = _state(patient_server)
    assert all(len(r.output_ids) == 6 for r in results)
    assert after["num_prefills"] - before["num_prefills"] == 1
    assert after["num_prefill_rows"] - before["num_prefill_rows"] == 3


@pytest.mark.slow  # 1900 tokens must still be decoding when the callers give up
def test_a_request_every_caller_gave_up_on_is_aborted_on_the_engine(server_a):
    """A timed-out episode, or a group a partial rollout cancelled, must not keep the engine
    generating for no one: once every caller of a batched request is cancelled, the batcher
    closes the request and the engine aborts its rows (one cancelled caller of two is not
    enough: the other still gets its result)."""

    def state() -> dict:
        return _state(server_a)

    async def main():
        async with EngineClient(server_a) as client:
            batcher = RequestBatcher([client])
            short, long = ({"max_new_tokens": n, "ignore_eos": True} for n in (300, 1900))
            aborted = state()["num_aborted_reqs"]
            kept, dropped = [batcher.submit([1, 2, 3 + i], short) for i in range(2)]
            while state()["num_running_reqs"] < 2:
                await asyncio.sleep(0.02)  # both are decoding, in one request
            dropped.cancel()
            result = await kept  # the request went on for the caller that waits
            assert len(result.output_ids) == 300 and state()["num_aborted_reqs"] == aborted
            both = [batcher.submit([7, 8, 9 + i], long) for i in range(2)]
            while state()["num_running_reqs"] < 2:
                await asyncio.sleep(0.02)
            for call in both:
                call.cancel()
            while state()["num_running_reqs"]:
                await asyncio.sleep(0.05)
            return state()["num_aborted_reqs"] - aborted, state()["num_finished_reqs"]

    newly_aborted, _ = asyncio.run(main())
    assert newly_aborted == 2
