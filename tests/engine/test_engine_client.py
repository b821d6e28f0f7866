"""EngineClient against real HTTP servers: a flaky one that answers 503 (retries and their
bound), one that refuses input (4xx: no retry, the server's message), a closed port (connection
errors, health deadline), and SGLang's reply shapes including an aborted reply's missing keys."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from kernel.engine.client import ClientConfig, EngineClient, EngineError, GenerateResult
from kernel.engine.launch import free_port

FAST = ClientConfig(max_retries=2, backoff_s=0.01, connect_timeout_s=1.0)


@pytest.fixture(scope="module")
def flaky():
    """An HTTP server whose /generate fails with 503 the first `fail` times after a reset."""
    app, state = FastAPI(), {"calls": 0, "fail": 0}

    @app.post("/reset/{fail}")
    async def reset(fail: int):
        state.update(calls=0, fail=fail)

    @app.post("/generate")
    async def generate():
        state["calls"] += 1
        if state["calls"] <= state["fail"]:
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
        meta = {"id": "r", "finish_reason": {"type": "length", "length": 1}, "weight_version": "3"}
        meta["output_token_logprobs"] = [[-0.5, 11, None]]
        return {"text": "a", "output_ids": [11], "meta_info": meta}

    @app.post("/abort_request")
    async def refuse():
        return JSONResponse({"error": {"message": "rid: unknown"}}, status_code=400)

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}", state
    server.should_exit = True
    thread.join(10)


def test_5xx_is_retried_up_to_the_bound(flaky):
    url, state = flaky

    async def main(fail):
        async with EngineClient(url, FAST) as c:
            await c.request("POST", f"/reset/{fail}")
            try:
                return await c.generate([1, 2])
            except EngineError as exc:
                return exc

    res = asyncio.run(main(2))  # 2 failures, then success on the 3rd and last attempt
    assert state["calls"] == 3
    assert res.output_ids == [11] and res.logprobs == [-0.5] and res.weight_version == "3"
    err = asyncio.run(main(3))  # 3 failures: 1 try + 2 retries all fail
    assert state["calls"] == 3
    assert isinstance(err, EngineError) and err.status == 503 and "overloaded" in str(err)


def test_4xx_is_not_retried_and_carries_the_message(flaky):
    url, _ = flaky

    async def main():
        async with EngineClient(url, FAST) as c:
            with pytest.raises(EngineError) as err:
                await c.abort("x")
            return err.value

    err = asyncio.run(main())
    assert err.status == 400 and "rid: unknown" in str(err) and url in str(err)


def test_connection_errors_and_health_deadline_name_the_url():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there

    async def main():
        async with EngineClient(url, FAST) as c:
            start = time.monotonic()
            with pytest.raises(EngineError) as err:
                await c.generate([1])
            with pytest.raises(TimeoutError) as late:
                await c.wait_healthy(deadline_s=0.3, interval_s=0.05)
            return str(err.value), str(late.value), time.monotonic() - start

    message, late, elapsed = asyncio.run(main())
    assert url in message and "Connect" in message
    assert url in late and "0.3" in late
    assert elapsed < 10


def test_aborted_sglang_reply_without_logprobs_or_version():
    reply = {
        "text": "par",
        "output_ids": [5, 6],
        "meta_info": {"id": "q1", "finish_reason": {"type": "abort", "message": "Abort"}},
    }
    res = GenerateResult.from_reply(reply)
    assert res.aborted and res.finish_type == "abort"
    assert res.output_ids == [5, 6] and res.logprobs == [] and res.weight_version is None
    old_style = {"text": "", "meta_info": {"output_token_logprobs": [[-1.0, 9, None]]}}
    res = GenerateResult.from_reply(old_style)  # ids only inside the logprob triples
    assert res.output_ids == [9] and res.finish_type == "unknown"


def test_generate_rejects_n_and_config_is_validated():
    async def main():
        async with EngineClient("http://127.0.0.1:1") as c:
            await c.generate([1], {"n": 2})

    with pytest.raises(ValueError, match="generate_batch"):
        asyncio.run(main())
    for bad, field in [({"max_retries": -1}, "max_retries"), ({"timeout_s": 0}, "timeout_s")]:
        with pytest.raises(ValueError, match=field):
            ClientConfig(**bad).validate()


def test_client_round_trip_on_the_embedded_server(server_a):
    async def main():
        async with EngineClient(server_a) as c:
            await c.wait_healthy(deadline_s=10)
            batch = await c.generate_batch(
                [[1, 2, 3], [4, 5]], {"max_new_tokens": 4, "n": 2}, rid="cli"
            )
            info = await c.model_info()
            return batch, info

    batch, info = asyncio.run(main())
    assert [r.rid for r in batch] == ["cli-0-0", "cli-0-1", "cli-1-0", "cli-1-1"]
    assert all(len(r.output_ids) == 4 == len(r.logprobs) for r in batch)
    assert [r.prompt_tokens for r in batch] == [3, 3, 2, 2]
    assert info["is_generation"] is True
