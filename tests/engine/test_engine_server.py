"""The embedded server end to end over HTTP: exact logprobs under continuous batching, stop
handling, reply shapes, bad input, abort, pause modes and the control endpoints."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from kernel.engine.client import EngineClient


def _run(coro):
    return asyncio.run(coro)


def _used_tokens(url: str) -> int:
    return httpx.get(f"{url}/v1/loads").json()["loads"][0]["num_used_tokens"]


def _wait_running(url: str, n: int = 1, deadline_s: float = 10.0) -> None:
    end = time.monotonic() + deadline_s
    while httpx.get(f"{url}/v1/loads").json()["loads"][0]["num_running_reqs"] < n:
        assert time.monotonic() < end, f"{n} requests never ran on {url}"
        time.sleep(0.02)


def test_logprobs_match_a_training_forward_under_batching(server_a, tiny_model, reference_logprobs):
    # Different prompt lengths, output lengths, temperatures and filters, arriving staggered so
    # that rows join a running batch and leave it at different steps.
    cases = [
        ([5, 17, 300], {"temperature": 0.7, "max_new_tokens": 24}),
        (list(range(100, 111)), {"temperature": 1.0, "max_new_tokens": 9, "top_p": 0.9}),
        ([42] * 19, {"temperature": 1.3, "max_new_tokens": 30, "top_k": 50}),
        ([7, 8], {"temperature": 0.0, "max_new_tokens": 16}),
        (list(range(2000, 2030)), {"temperature": 0.5, "max_new_tokens": 12, "min_p": 0.05}),
        ([9, 1000, 9, 1000, 9], {"temperature": 1.0, "max_new_tokens": 20}),
    ]

    async def main():
        async with EngineClient(server_a) as client:

            async def one(i, prompt, params):
                await asyncio.sleep(0.01 * i)
                return await client.generate(prompt, params | {"ignore_eos": True})

            results = await asyncio.gather(*(one(i, p, sp) for i, (p, sp) in enumerate(cases)))
            return results, await client.server_info()

    results, info = _run(main())
    assert info["internal_states"][0]["peak_running_reqs"] >= 2  # they really were batched
    for (prompt, params), res in zip(cases, results, strict=True):
        assert len(res.output_ids) == params["max_new_tokens"] == len(res.logprobs)
        assert res.finish_reason == {"type": "length", "length": params["max_new_tokens"]}
        ref = reference_logprobs(tiny_model, prompt, res.output_ids, params["temperature"])
        assert max(abs(a - b) for a, b in zip(ref, res.logprobs, strict=True)) < 1e-4
    # Greedy (temperature 0) took the argmax at every step: its logprob is the row's maximum.
    import torch

    greedy_prompt, greedy = cases[3][0], results[3]
    with torch.no_grad():
        logits = tiny_model(input_ids=torch.tensor([greedy_prompt + greedy.output_ids])).logits
    steps = logits[0, len(greedy_prompt) - 1 : -1]  # (O, V)
    assert steps.argmax(-1).tolist() == greedy.output_ids


def test_stop_token_ids_keep_the_matched_token(server_a, smollm2_tokenizer):
    evens = list(range(0, 49152, 2))  # each sampled token stops with probability ~1/2

    async def main():
        async with EngineClient(server_a) as c:
            params = {"max_new_tokens": 60, "ignore_eos": True, "stop_token_ids": evens}
            return await asyncio.gather(*(c.generate([1, 2, 3 + i], params) for i in range(6)))

    for res in _run(main()):
        ids = res.output_ids
        # It stopped at the first even token, kept it in output_ids and dropped it from text.
        assert ids[-1] % 2 == 0 and all(t % 2 == 1 for t in ids[:-1])
        assert res.finish_reason == {"type": "stop", "matched": ids[-1]}
        assert res.text == smollm2_tokenizer.decode(ids[:-1], skip_special_tokens=True)


def test_stop_strings_trim_the_text_but_not_the_ids(server_a, smollm2_tokenizer):
    decode = lambda ids: smollm2_tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731

    async def main():
        async with EngineClient(server_a) as c:
            params = {"max_new_tokens": 100, "ignore_eos": True, "stop": ["e", "zzz"]}
            trimmed = [c.generate([5, 6, 7 + i], params) for i in range(4)]
            kept = [c.generate([5, 6, 7 + i], params | {"no_stop_trim": True}) for i in range(4)]
            return await asyncio.gather(*trimmed), await asyncio.gather(*kept)

    trimmed, kept = _run(main())
    for res in trimmed + kept:
        full = decode(res.output_ids)
        # The step that completed "e" ended the request: no earlier prefix contains it.
        assert res.finish_reason == {"type": "stop", "matched": "e"}
        assert "e" in full and "e" not in decode(res.output_ids[:-1])
    for res in trimmed:
        assert res.text == decode(res.output_ids)[: decode(res.output_ids).index("e")]
    for res in kept:
        assert res.text == decode(res.output_ids)


def test_reply_shapes_for_batches_n_and_text(server_a):
    body = {"input_ids": [[1, 2], [3, 4, 5]], "rid": "shape", "return_logprob": True}
    body["sampling_params"] = {"max_new_tokens": 3, "n": 2}
    replies = httpx.post(f"{server_a}/generate", json=body, timeout=60).json()
    assert [r["meta_info"]["id"] for r in replies] == [
        "shape-0-0",
        "shape-0-1",
        "shape-1-0",
        "shape-1-1",
    ]
    assert [r["meta_info"]["prompt_tokens"] for r in replies] == [2, 2, 3, 3]
    for r in replies:
        assert len(r["output_ids"]) == 3 == r["meta_info"]["completion_tokens"]
        assert [p[1] for p in r["meta_info"]["output_token_logprobs"]] == r["output_ids"]
        assert all(p[2] is None for p in r["meta_info"]["output_token_logprobs"])
    single = httpx.post(
        f"{server_a}/generate",
        json={"text": "Hello", "sampling_params": {"max_new_tokens": 2}, "unknown_field": 1},
        timeout=60,
    ).json()
    assert isinstance(single, dict) and single["meta_info"]["weight_version"] == "0"
    assert "output_token_logprobs" not in single["meta_info"]  # not asked for
    zero = httpx.post(
        f"{server_a}/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 0}}
    ).json()
    assert zero["output_ids"] == [] and zero["meta_info"]["finish_reason"]["length"] == 0


BAD = [
    ({"input_ids": [1, 2], "sampling_params": {"temperature": -1}}, ["temperature"]),
    ({"input_ids": [1, 2], "sampling_params": {"top_p": 0}}, ["top_p"]),
    ({"input_ids": [1, 2], "sampling_params": {"top_p": 1.5}}, ["top_p"]),
    ({"input_ids": [1, 2], "sampling_params": {"top_k": 0}}, ["top_k"]),
    ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}}, ["max_new_tokens"]),
    ({"input_ids": [1, 2], "sampling_params": {"n": 0}}, [".n:"]),
    ({"input_ids": [1, 2], "sampling_params": {"frequency_penalty": 0.5}}, ["frequency_penalty"]),
    ({"input_ids": [1, 10**6]}, ["input_ids", "1000000", "vocabulary"]),
    ({"input_ids": [[1], [2, -3]]}, ["input_ids[1]", "-3"]),
    ({"input_ids": []}, ["input_ids", "empty"]),
    ({"text": "hi", "input_ids": [1]}, ["text", "input_ids"]),
    ({"sampling_params": {}}, ["text", "input_ids"]),
    # 10 prompt tokens + 2045 new ones = 2055 > the context length 2048
    ({"input_ids": list(range(10)), "sampling_params": {"max_new_tokens": 2045}}, ["2055", "2048"]),
    ({"input_ids": [1], "stream": True}, ["stream"]),
]


@pytest.mark.parametrize(("body", "words"), BAD)
def test_bad_input_is_400_naming_the_field_and_the_server_keeps_serving(server_a, body, words):
    r = httpx.post(f"{server_a}/generate", json=body, timeout=30)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    for w in words:
        assert w in message, message
    ok = httpx.post(
        f"{server_a}/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}
    )
    assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 2


def test_not_json_is_400(server_a):
    r = httpx.post(
        f"{server_a}/generate", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "error" in r.json()


def test_abort_answers_200_with_the_partial_output(server_a):
    async def main():
        async with EngineClient(server_a) as c:
            params = {"max_new_tokens": 1500, "ignore_eos": True}
            task = asyncio.create_task(c.generate([1, 2, 3], params, rid="abort-me-1"))
            await asyncio.to_thread(_wait_running, server_a)
            await asyncio.sleep(0.2)
            await c.abort("abort-me")  # a prefix of the rid
            return await task

    res = _run(main())
    assert res.aborted and "abort_request" in res.finish_reason["message"]
    assert 0 < len(res.output_ids) < 1500
    assert len(res.logprobs) == len(res.output_ids)


def test_pause_in_place_holds_everything_until_continue(server_a):
    async def main():
        async with EngineClient(server_a) as c:
            params = {"max_new_tokens": 300, "ignore_eos": True}
            long = asyncio.create_task(c.generate([4, 5, 6], params))
            await asyncio.to_thread(_wait_running, server_a)
            await c.pause("in_place")
            late = asyncio.create_task(c.generate([7], {"max_new_tokens": 3}))
            await asyncio.sleep(0.1)
            before = _used_tokens(server_a)  # the paused request's tokens + the queued prompt
            await asyncio.sleep(0.3)
            frozen = _used_tokens(server_a) == before and not long.done() and not late.done()
            await c.continue_generation()
            return frozen, await long, await late

    frozen, long, late = _run(main())
    assert frozen
    assert long.finish_reason == {"type": "length", "length": 300}
    assert late.finish_reason == {"type": "length", "length": 3}


def test_pause_abort_mode_returns_running_requests_and_queues_new_ones(server_a):
    async def main():
        async with EngineClient(server_a) as c:
            params = {"max_new_tokens": 1500, "ignore_eos": True}
            running = asyncio.create_task(c.generate([4, 5, 6], params))
            await asyncio.to_thread(_wait_running, server_a)
            await c.pause()  # SGLang's default mode: abort
            aborted = await asyncio.wait_for(running, 10)
            late = asyncio.create_task(c.generate([7], {"max_new_tokens": 3}))
            await asyncio.sleep(0.3)
            waited = not late.done()
            await c.continue_generation()
            return aborted, waited, await late

    aborted, waited, late = _run(main())
    assert aborted.aborted and "pause_generation" in aborted.finish_reason["message"]
    assert waited and late.finish_type == "length"


def test_pause_retract_resumes_with_exact_logprobs(server_a, tiny_model, reference_logprobs):
    prompt, params = [11, 12, 13, 14], {"max_new_tokens": 200, "ignore_eos": True}

    async def main():
        async with EngineClient(server_a) as c:
            task = asyncio.create_task(c.generate(prompt, params))
            await asyncio.to_thread(_wait_running, server_a)
            await asyncio.sleep(0.1)
            await c.pause("retract")  # back to the queue, prefilled again on continue
            await asyncio.sleep(0.2)
            assert not task.done()
            await c.continue_generation()
            return await task

    res = _run(main())
    assert res.finish_reason == {"type": "length", "length": 200}
    ref = reference_logprobs(tiny_model, prompt, res.output_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(ref, res.logprobs, strict=True)) < 1e-4


def test_control_and_info_endpoints(server_a, tiny_model_dir):
    get = lambda path: httpx.get(server_a + path, timeout=30)  # noqa: E731
    for path in ("/health", "/health_generate", "/v1/models"):
        assert get(path).status_code == 200, path
    assert httpx.post(f"{server_a}/flush_cache", json={}).status_code == 200
    assert get("/flush_cache").status_code == 405  # a write: POST only
    for path in ("/server_info", "/get_server_info"):
        info = get(path).json()
        assert info["model_path"] == str(tiny_model_dir) and info["context_length"] == 2048
    for path in ("/model_info", "/get_model_info"):
        info = get(path).json()
        assert info["model_path"] == str(tiny_model_dir) and info["is_generation"] is True
    load = get("/get_load").json()
    assert load[0]["dp_rank"] == 0 and {"num_reqs", "num_waiting_reqs", "num_tokens"} <= set(
        load[0]
    )
    loads = get("/v1/loads").json()["loads"][0]
    assert loads["num_finished_reqs"] > 0
    assert get("/get_weight_version").json() == {"weight_version": "0"}
    bad = httpx.post(f"{server_a}/abort_request", json={})
    assert bad.status_code == 400 and "rid" in bad.json()["error"]["message"]


def test_minimal_chat_completions(server_a):
    body = {"messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 4, "temperature": 0}
    r = httpx.post(f"{server_a}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "chat.completion"
    assert out["choices"][0]["message"]["role"] == "assistant"
    assert out["usage"]["completion_tokens"] <= 4
    assert (
        out["usage"]["total_tokens"]
        == out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]
    )


@pytest.mark.gpu
def test_cuda_server_logprobs_match_a_cuda_training_forward(
    tiny_model_dir, tiny_model, reference_logprobs, tmp_path
):
    """The same exactness check with the model on the GPU (skipped without one)."""
    import copy

    from kernel.engine.launch import free_port, launch_server
    from kernel.engine.settings import ServerConfig

    config = ServerConfig(model=str(tiny_model_dir), port=free_port(), device="cuda")
    prompts = [[5, 17, 300], list(range(100, 117)), [8]]
    with launch_server(config, tmp_path / "cuda.log") as proc:
        proc.wait_healthy(deadline_s=300)

        async def main():
            async with EngineClient(proc.url) as c:
                params = {"temperature": 0.9, "max_new_tokens": 20, "ignore_eos": True}
                return await asyncio.gather(*(c.generate(p, params) for p in prompts))

        results = _run(main())
    model = copy.deepcopy(tiny_model).to("cuda")
    for prompt, res in zip(prompts, results, strict=True):
        ref = reference_logprobs(model, prompt, res.output_ids, 0.9)
        assert max(abs(a - b) for a, b in zip(ref, res.logprobs, strict=True)) < 1e-4
