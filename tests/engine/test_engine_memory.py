"""Release and resume of an embedded server's memory (SGLang's /release_memory_occupation and
/resume_memory_occupation, used around colocated training), on server B: while released,
generation answers 503 and the weights' storage is gone; resumed weights are zeros (a uniform
next-token distribution) until a weight update, after which the server's logprobs equal a
training forward of the pushed weights. Bad tags and a busy engine are refused with 400; a
pause with abort first ends a straggling request, so the release goes through."""

from __future__ import annotations

import asyncio
import math
import time

import httpx
import pytest

from kernel.engine.client import EngineClient, EngineError

PROMPT = [3, 14, 15, 92, 65]
GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


def _run(coro):
    return asyncio.run(coro)


def _state(url: str) -> dict:
    return httpx.get(f"{url}/server_info").json()["internal_states"][0]


@pytest.fixture
def restore_b(server_b, tiny_model_dir):
    """Server B resumed, with its original weights and version "0", after the test."""
    yield
    with httpx.Client(timeout=60) as h:
        if _state(server_b)["memory_released"]:
            assert h.post(f"{server_b}/resume_memory_occupation", json={}).status_code == 200
        body = {"model_path": str(tiny_model_dir), "weight_version": "0"}
        assert h.post(f"{server_b}/update_weights_from_disk", json=body).status_code == 200


def test_release_refuses_generation_and_resume_plus_update_serves_the_pushed_weights(
    server_b, restore_b, tiny_model, reference_logprobs
):
    before = _state(server_b)

    async def main():
        async with EngineClient(server_b) as c:
            await c.release_memory_occupation()  # no tags: weights and kv_cache
            released = _state(server_b)
            refused = httpx.post(
                f"{server_b}/generate", json={"input_ids": PROMPT, "sampling_params": GREEDY}
            )
            health = httpx.get(f"{server_b}/health").status_code
            health_generate = httpx.get(f"{server_b}/health_generate").status_code
            await c.resume_memory_occupation(["kv_cache"])
            still = _state(server_b)["memory_released"]
            await c.resume_memory_occupation()  # the rest: the weights, as zeros
            zeros = await c.generate(PROMPT, GREEDY)
            await c.update_weights_from_tensor(tiny_model.state_dict(), weight_version="7")
            pushed = await c.generate(PROMPT, GREEDY)
            return released, refused, health, health_generate, still, zeros, pushed

    released, refused, health, health_generate, still, zeros, pushed = _run(main())
    assert released["memory_released"] == ["kv_cache", "weights"]
    assert released["num_memory_releases"] == before["num_memory_releases"] + 1
    assert refused.status_code == 503
    assert "resume_memory_occupation" in refused.json()["error"]["message"]
    assert (health, health_generate) == (200, 503)  # alive (the router keeps it), not serving
    assert still == ["weights"]
    assert _state(server_b)["num_memory_resumes"] == before["num_memory_resumes"] + 2
    # zero weights give zero logits: every token has probability 1 / vocab
    vocab = tiny_model.get_input_embeddings().num_embeddings
    assert all(abs(lp + math.log(vocab)) < 1e-4 for lp in zeros.logprobs)
    # after the update it serves exactly the pushed weights
    ref = reference_logprobs(tiny_model, PROMPT, pushed.output_ids, 0)
    assert max(abs(a - b) for a, b in zip(ref, pushed.logprobs, strict=True)) < 1e-4
    assert pushed.weight_version == "7"


def test_bad_tags_resuming_what_is_not_released_and_a_busy_engine_are_400(server_b, restore_b):
    with httpx.Client(timeout=30) as h:
        bad = h.post(f"{server_b}/release_memory_occupation", json={"tags": ["gpu"]})
        assert bad.status_code == 400 and "weights" in bad.json()["error"]["message"]
        idle = h.post(f"{server_b}/resume_memory_occupation", json={"tags": ["weights"]})
        assert idle.status_code == 400 and "not released" in idle.json()["error"]["message"]
        assert _state(server_b)["memory_released"] == []

    async def busy():
        async with EngineClient(server_b) as c:
            await c.pause("in_place")
            queued = asyncio.create_task(c.generate(PROMPT, GREEDY))
            end = time.monotonic() + 10
            while _state(server_b)["num_waiting_reqs"] < 1:
                assert time.monotonic() < end, "the request never reached the queue"
                await asyncio.sleep(0.02)
            with pytest.raises(EngineError, match="in flight") as err:
                await c.release_memory_occupation(["weights"])
            await c.continue_generation()
            return err.value.status, await queued

    status, queued = _run(busy())
    assert status == 400
    assert queued.finish_type == "length"  # it ran to the end on the weights it had
    assert _state(server_b)["memory_released"] == []


def test_pause_with_abort_ends_a_straggler_so_the_release_goes_through(server_b, restore_b):
    """What the loop does before a colocated training step: a request still generating (one a
    rollout timeout gave up on) would make the release fail; a pause with abort ends it with its
    partial output first, and nothing new starts until the continue."""

    async def main():
        async with EngineClient(server_b) as c:
            long = {"temperature": 0, "max_new_tokens": 2000, "ignore_eos": True}
            straggler = asyncio.create_task(c.generate(PROMPT, long))
            end = time.monotonic() + 10
            while _state(server_b)["num_running_reqs"] < 1:
                assert time.monotonic() < end, "the request never started"
                await asyncio.sleep(0.02)
            await c.pause("abort")
            await c.release_memory_occupation()
            released = _state(server_b)["memory_released"]
            await c.resume_memory_occupation()
            await c.continue_generation()
            return await straggler, released

    straggler, released = _run(main())
    assert straggler.finish_type == "abort" and 0 < len(straggler.output_ids) < 2000
    assert released == ["kv_cache", "weights"]
