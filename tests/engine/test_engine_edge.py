"""Hostile requests to the embedded server: every one gets an answer below 500 naming the field,
none takes the server down or fails an innocent request beside it, and /health keeps
answering. Each test is the regression test of a defect found by fuzzing (issue 21).

The server here is this module's own (a failure must not spill into the other engine tests)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

import httpx
import pytest

from kernel.engine.client import ClientConfig, EngineClient
from kernel.engine.launch import free_port, launch_server
from kernel.engine.settings import ServerConfig

PROMPT = [1, 2, 3, 4]
GOOD = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
KEY = "edge-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("weights")


@pytest.fixture(scope="module")
def url(tiny_model_dir, tmp_path_factory, weights_dir):
    config = ServerConfig(
        model=str(tiny_model_dir),
        port=free_port(),
        max_batch_size=16,
        num_threads=1,
        max_n=64,
        max_request_mb=4,
        weight_group_timeout_s=3,
        api_key=KEY,
        weights_dir=str(weights_dir),
    )
    proc = launch_server(config, tmp_path_factory.mktemp("edge") / "server.log")
    try:
        proc.wait_healthy(deadline_s=180)
        yield proc.url
    finally:
        proc.stop()


def post(url: str, path: str, body, **kw) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=30, headers=AUTH, **kw)


def client(**kw) -> httpx.AsyncClient:
    return httpx.AsyncClient(headers=AUTH, **kw)


def healthy_after(url: str) -> None:
    """The server still generates (no request stuck, nothing broken)."""
    r = post(url, "/generate", GOOD)
    assert r.status_code == 200, r.text
    loads = httpx.get(f"{url}/v1/loads", timeout=10, headers=AUTH).json()["loads"][0]
    assert loads["num_running_reqs"] == 0 and loads["num_waiting_reqs"] == 0, loads


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"top_k": 2**63}, "top_k"),
        ({"top_k": 10**30}, "top_k"),
        ({"max_new_tokens": 2**63}, "max_new_tokens"),
        ({"temperature": 1e400}, "temperature"),
        ({"top_p": float("nan")}, "top_p"),
        ({"min_p": -0.0001}, "min_p"),
        ({"stop_token_ids": [2**63]}, "stop_token_ids"),
        ({"n": 2**40}, "n"),
    ],
)
def test_out_of_range_sampling_numbers_get_400_naming_the_field(url, params, field):
    body = {"input_ids": PROMPT, "sampling_params": params}
    r = httpx.post(
        f"{url}/generate",
        content=json.dumps(body, allow_nan=True).replace("Infinity", "1e400"),
        headers={"content-type": "application/json", **AUTH},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"]
    healthy_after(url)


def test_a_huge_top_k_beside_innocent_requests_fails_none_of_them(url):
    """Defect 1: top_k >= 2**63 was accepted, stuck in `running`, and failed 16 innocent
    concurrent requests with 500 'Overflow when unpacking long long'."""

    async def run():
        async with client(timeout=60) as c:
            bad = {"input_ids": PROMPT, "sampling_params": {"top_k": 2**63, "max_new_tokens": 4}}
            calls = [c.post(f"{url}/generate", json=bad)]
            calls += [c.post(f"{url}/generate", json=GOOD) for _ in range(16)]
            return await asyncio.gather(*calls)

    bad, *good = asyncio.run(run())
    assert bad.status_code == 400, bad.text
    assert [r.status_code for r in good] == [200] * 16
    healthy_after(url)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/generate", {"text": "hello \ud800 world"}),
        ("/generate", {"text": ["fine", "\udfff"]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a\ud800"}]}),
    ],
)
def test_lone_surrogates_get_400(url, path, body):
    """Defect 2: a lone UTF-16 surrogate made the tokenizer raise: HTTP 500."""
    r = httpx.post(
        f"{url}{path}",
        content=json.dumps(body),  # ensure_ascii: the surrogate travels as \\ud800
        headers={"content-type": "application/json", **AUTH},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    assert "surrogate" in r.json()["error"]["message"]
    healthy_after(url)


def test_a_tiny_temperature_is_greedy_and_logprobs_stay_finite(url):
    """Defect 3: temperature 1e-40 with return_logprob gave 500 (NaN is not JSON) and without
    logprobs returned the last vocabulary id. Below 1e-5 it is greedy, as in SGLang."""
    params = {"max_new_tokens": 6, "ignore_eos": True}
    greedy = post(
        url, "/generate", {"input_ids": PROMPT, "sampling_params": params | {"temperature": 0}}
    )
    tiny = post(
        url,
        "/generate",
        {
            "input_ids": PROMPT,
            "sampling_params": params | {"temperature": 1e-40},
            "return_logprob": True,
        },
    )
    assert greedy.status_code == tiny.status_code == 200, tiny.text
    assert tiny.json()["output_ids"] == greedy.json()["output_ids"]
    lps = [lp for lp, _, _ in tiny.json()["meta_info"]["output_token_logprobs"]]
    assert all(-1e9 < lp <= 0 for lp in lps), lps


def test_caps_on_n_weight_version_and_body_size(url):
    """Defect 5: n, the weight_version string and the request body were unbounded."""
    r = post(url, "/generate", {"input_ids": PROMPT, "sampling_params": {"n": 65}})
    assert r.status_code == 400 and "n" in r.json()["error"]["message"], r.text
    r = post(url, "/update_weight_version", {"new_version": "v" * 10_000})
    assert r.status_code == 400 and "new_version" in r.text, r.text
    big = {"input_ids": PROMPT, "text_padding": "x" * (5 * 2**20)}  # an ignored key, 5 MB
    r = post(url, "/generate", big)
    assert r.status_code == 413 and "max_request_mb" in r.text, r.status_code
    healthy_after(url)


def test_tokenizing_a_large_body_does_not_stall_health(url):
    """Defect 4: tokenization ran on the event loop; a large text stalled /health."""

    async def run():
        async with client(timeout=120) as c:
            text = "lorem ipsum dolor sit amet " * 120_000  # ~3 MB, under the 4 MB cap
            body = {"text": text, "sampling_params": {"max_new_tokens": 1}}
            big = asyncio.create_task(c.post(f"{url}/generate", json=body))
            await asyncio.sleep(0.2)  # the big request is being tokenized
            worst = 0.0
            while not big.done():
                t0 = time.perf_counter()
                assert (await c.get(f"{url}/health")).status_code == 200
                worst = max(worst, time.perf_counter() - t0)
                await asyncio.sleep(0.05)
            return (await big), worst

    big, worst = asyncio.run(run())
    assert big.status_code == 400  # longer than the context: refused, after tokenizing
    assert worst < 1.0, worst


def test_dead_rendezvous_calls_do_not_starve_weight_updates(url):
    """Defect 6: eight /init_weights_update_group calls to a dead address held the engine's
    threads, so /update_weights_from_tensor and /update_weights_from_disk timed out."""
    dead = {
        "master_address": "127.0.0.1",
        "master_port": free_port(),  # nobody listens
        "rank_offset": 1,
        "world_size": 2,
        "backend": "gloo",
    }

    async def run():
        async with client(timeout=120) as c:
            inits = [
                asyncio.create_task(
                    c.post(f"{url}/init_weights_update_group", json=dead | {"group_name": f"g{i}"})
                )
                for i in range(8)
            ]
            await asyncio.sleep(0.5)
            t0 = time.perf_counter()
            version = await c.post(f"{url}/update_weight_version", json={"new_version": "7"})
            tensor = await c.post(
                f"{url}/update_weights_from_tensor",
                json={"serialized_named_tensors": [], "weight_version": "8"},
            )
            waited = time.perf_counter() - t0
            return version, tensor, waited, await asyncio.gather(*inits)

    version, tensor, waited, inits = asyncio.run(run())
    assert version.status_code == 200 and tensor.status_code == 200, tensor.text
    assert waited < 5, waited
    assert all(r.status_code == 400 for r in inits)  # each refused or timed out, and said so
    healthy_after(url)


def test_an_api_key_guards_every_route_but_health(url):
    """Defect 10: the engine had no authentication. With --api_key, as SGLang's --api-key."""
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    for method, path in [("POST", "/generate"), ("GET", "/get_model_info"), ("GET", "/v1/loads")]:
        r = httpx.request(method, f"{url}{path}", json=GOOD if method == "POST" else None)
        assert r.status_code == 401, (path, r.status_code)
        for wrong in ({"Authorization": "Bearer nope"}, {"Authorization": b"Bearer \xff\xfe"}):
            r = httpx.request(
                method, f"{url}{path}", headers=wrong, json=GOOD if method == "POST" else None
            )  # a non-ASCII header made the compare raise: 500 (kernel.auth compares bytes)
            assert r.status_code == 401, (path, r.status_code)
            assert r.json()["error"]["message"] == "missing or wrong Authorization: Bearer key"
    info = httpx.get(f"{url}/get_server_info", headers=AUTH, timeout=10).json()
    assert info["api_key"] == "***"  # never echoed

    async def with_client():
        c = EngineClient(url, ClientConfig(api_key=KEY))
        try:
            return await c.generate(PROMPT, {"max_new_tokens": 3, "ignore_eos": True})
        finally:
            await c.aclose()

    assert len(asyncio.run(with_client()).output_ids) == 3
    assert KEY not in repr(ClientConfig(api_key=KEY))


def test_a_web_page_cannot_release_pause_or_reload_the_engine(url, weights_dir, tmp_path):
    """Defect 10: a cross-origin GET /release_memory_occupation answered 200 (then /generate
    was 503) and a text/plain POST to /pause_generation answered 200; /update_weights_from_disk
    loaded any path."""
    page = {"Origin": "http://evil.example", **AUTH}
    r = httpx.get(f"{url}/release_memory_occupation", headers=page, timeout=10)
    assert r.status_code == 405 and "access-control-allow-origin" not in r.headers
    r = httpx.post(
        f"{url}/pause_generation",
        content="mode=abort",
        headers={**page, "content-type": "text/plain"},
        timeout=10,
    )
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]
    r = post(url, "/update_weights_from_disk", {"model_path": str(tmp_path)})
    assert r.status_code == 400 and "outside weights_dir" in r.json()["message"], r.text
    healthy_after(url)  # nothing was released or paused


@pytest.mark.parametrize("api_key", [None, KEY])
def test_a_pickled_payload_is_taken_only_from_this_machine_or_an_authenticated_caller(
    tiny_model_dir, api_key
):
    """The flattened_bucket payload is a pickle: from a remote caller of a keyless server it is
    refused (403) before it is read; from loopback, from the very address the server was
    reached at (a process of its own node calling the node's IP), or with a key, it is read
    (here it is not a valid payload, so the engine answers that). The app runs in-process so
    the caller's address can be set; the key is sent whenever the server has one."""
    from kernel.engine.server import create_app

    app = create_app(ServerConfig(model=str(tiny_model_dir), num_threads=1, api_key=api_key))
    body = {"serialized_named_tensors": ["bm90IGEgcGlja2xl"], "load_format": "flattened_bucket"}

    async def from_host(host: str, server: str = "192.0.2.2") -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=(host, 40000))
        headers = AUTH if api_key else None
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{server}") as c:
            return await c.post("/update_weights_from_tensor", json=body, headers=headers)

    async def main():
        async with app.router.lifespan_context(app):
            hosts = ("203.0.113.7", "127.0.0.1", "::1", "192.0.2.2")
            return [await from_host(h) for h in hosts] + [await from_host("192.0.2.3", "engine")]

    remote, *local, unnamed = asyncio.run(main())
    for r in local if api_key is None else [remote, *local, unnamed]:
        assert r.status_code == 400 and "not a flattened_bucket payload" in r.json()["message"]
    if api_key is None:  # another address, or a server reached by a name: remote
        for r in (remote, unnamed):
            assert r.status_code == 403 and "--api_key" in r.json()["error"]["message"]


def test_launched_servers_take_their_key_from_the_environment_not_the_command_line(
    tiny_model_dir, tmp_path, monkeypatch
):
    """launch_server passes the key in the environment (out of ``ps``), and a key in the
    launching process's own environment never reaches a server started without one."""
    monkeypatch.setenv("TANDEM_API_KEY", "inherited")
    keyless = ServerConfig(model=str(tiny_model_dir), port=free_port(), num_threads=1)
    keyed = dataclasses.replace(keyless, port=free_port(), api_key=KEY)
    procs = [launch_server(c, tmp_path / f"{i}.log") for i, c in enumerate((keyless, keyed))]
    try:
        for p in procs:
            p.wait_healthy(deadline_s=180)
            cmdline = Path(f"/proc/{p.pid}/cmdline").read_bytes()
            assert b"inherited" not in cmdline and KEY.encode() not in cmdline
        assert httpx.post(f"{procs[0].url}/generate", json=GOOD, timeout=30).status_code == 200
        assert httpx.post(f"{procs[1].url}/generate", json=GOOD, timeout=30).status_code == 401
        r = httpx.post(f"{procs[1].url}/generate", json=GOOD, timeout=30, headers=AUTH)
        assert r.status_code == 200
    finally:
        for p in procs:
            p.stop()
