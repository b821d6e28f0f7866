"""LoRA adapters on the embedded server, served as SGLang serves them: one base model, PEFT
adapters chosen per prompt by name (``lora_path``), loaded and unloaded at run time.

Two adapters (``alpha``, ``beta``: different ranks and target layers) are built with peft on the
tiny Qwen2 model, their A and B matrices seeded and non-zero, and saved with save_pretrained.
Every logprob a server reports is checked against a plain peft forward of the same adapter (as
a trainer computes it). Two servers run beside each other: ``wide`` (alpha loaded at start; a
test that loads more unloads them again) and ``narrow`` (both at start, one adapter per batch);
two more run in-process where a test needs a server of its own settings.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import httpx
import pytest
import torch

from kernel.engine.batcher import RequestBatcher
from kernel.engine.client import EngineClient, EngineError, GenerateResult
from kernel.engine.launch import free_port, launch_server
from kernel.engine.pool import EngineConfig
from kernel.engine.settings import ServerConfig, lora_spec

PROMPT = [3, 14, 15, 92, 65]
OTHER = [7, 1, 8, 2, 8, 1, 8]
LONG = list(range(100, 140))  # 40 tokens: two full blocks of the prefix cache
GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
CONFIGS = {
    "alpha": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
    "beta": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "o_proj", "up_proj"]},
}
Q_PROJ = "model.layers.0.self_attn.q_proj.weight"  # a base weight both adapters wrap


@pytest.fixture(scope="module")
def adapters(tiny_model, tmp_path_factory) -> dict[str, Path]:
    """The PEFT folders of alpha and beta (adapter_config.json, adapter_model.safetensors)."""
    from peft import LoraConfig, get_peft_model

    out = tmp_path_factory.mktemp("adapters")
    for seed, (name, settings) in enumerate(CONFIGS.items()):
        model = get_peft_model(copy.deepcopy(tiny_model), LoraConfig(**settings))
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # B starts at zero: move A and B, so the adapter does something
            for n, p in model.named_parameters():
                if "lora_" in n:
                    p.copy_(0.2 * torch.randn(p.shape, generator=gen))
        model.save_pretrained(out / name)
    return {name: out / name for name in CONFIGS}


def with_adapter(model, folder: Path | None):
    """A copy of ``model``, in peft with the adapter of ``folder`` (None: bare)."""
    from peft import PeftModel

    model = copy.deepcopy(model)
    return model if folder is None else PeftModel.from_pretrained(model, folder).eval()


@pytest.fixture(scope="module")
def references(tiny_model, adapters) -> dict:
    """Reference models by adapter name (None: the bare model)."""
    return {None: tiny_model} | {name: with_adapter(tiny_model, f) for name, f in adapters.items()}


@pytest.fixture(scope="module")
def servers(tiny_model_dir, adapters, tmp_path_factory) -> dict[str, str]:
    logs = tmp_path_factory.mktemp("lora_logs")
    common = {"model": str(tiny_model_dir), "max_batch_size": 16, "num_threads": 1}
    every = [f"{name}={folder}" for name, folder in adapters.items()]
    configs = {
        "wide": ServerConfig(port=free_port(), enable_lora=True, lora_paths=every[:1], **common),
        "narrow": ServerConfig(
            port=free_port(), enable_lora=True, lora_paths=every, max_loras_per_batch=1, **common
        ),
    }
    procs = {k: launch_server(c, logs / f"{k}.log") for k, c in configs.items()}
    try:
        for p in procs.values():
            p.wait_healthy(deadline_s=180)
        yield {k: p.url for k, p in procs.items()}
    finally:
        for p in procs.values():
            p.stop()


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60)


def generate(url: str, ids, lora=None, params=GREEDY) -> dict | list:
    body = {"input_ids": ids, "sampling_params": params, "return_logprob": True}
    if lora is not None:
        body["lora_path"] = lora
    r = post(url, "/generate", body)
    assert r.status_code == 200, r.text
    return r.json()


def logprobs(reply: dict) -> list[float]:
    return [lp for lp, _, _ in reply["meta_info"]["output_token_logprobs"]]


def assert_serves(reply: dict, model, prompt: list[int], reference_logprobs) -> None:
    """The reply's logprobs are ``model``'s in one forward over prompt + output."""
    ref = reference_logprobs(model, prompt, reply["output_ids"], 0.0)
    assert max(abs(a - b) for a, b in zip(ref, logprobs(reply), strict=True)) < 1e-4


def load(url: str, name: str, folder: Path) -> dict:
    r = post(url, "/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
    assert r.status_code == 200, r.text
    return r.json()


def unload(url: str, name: str) -> dict:
    r = post(url, "/unload_lora_adapter", {"lora_name": name})
    assert r.status_code == 200, r.text
    return r.json()


def stats(url: str) -> dict:
    return httpx.get(f"{url}/server_info", timeout=10).json()["internal_states"][0]


def test_each_adapter_serves_what_peft_computes(servers, adapters, references, reference_logprobs):
    url = servers["wide"]
    reply = load(url, "beta", adapters["beta"])
    assert reply == {
        "success": True,
        "error_message": None,
        "loaded_adapters": {name: str(folder) for name, folder in adapters.items()},
    }
    try:
        replies = {name: generate(url, PROMPT, name) for name in (None, "alpha", "beta")}
        info = httpx.get(f"{url}/server_info", timeout=10).json()
    finally:
        unload(url, "beta")
    for name, reply in replies.items():
        assert_serves(reply, references[name], PROMPT, reference_logprobs)
        assert reply["meta_info"]["weight_version"] == "0"  # adapters are not weight versions
    served = [logprobs(r) for r in replies.values()]
    for i in range(3):
        for j in range(i):
            assert max(abs(a - b) for a, b in zip(served[i], served[j], strict=True)) > 1e-3
    assert info["enable_lora"] and info["max_loras_per_batch"] == 8
    assert info["lora_paths"] == [f"alpha={adapters['alpha']}"]  # as started
    assert set(info["loaded_lora_adapters"]) == {"alpha", "beta"}


def test_a_mixed_batch_gives_each_row_what_it_gets_alone(servers, adapters):
    """Base, alpha and beta rows in one /generate: equal prompts of different adapters are
    different prefill rows (one prefill of four rows), and each row is what it is alone."""
    url = servers["wide"]
    load(url, "beta", adapters["beta"])
    try:
        prompts, loras = [PROMPT, PROMPT, PROMPT, OTHER], [None, "alpha", "beta", "alpha"]
        alone = [generate(url, p, lora) for p, lora in zip(prompts, loras, strict=True)]
        before = stats(url)
        batch = generate(url, prompts, loras)
        after = stats(url)

        async def batched() -> list[GenerateResult]:  # the client side: RequestBatcher
            async with EngineClient(url) as client:
                batcher = RequestBatcher([client])
                pairs = zip(prompts, loras, strict=True)
                return await asyncio.gather(*(batcher.submit(p, GREEDY, lo) for p, lo in pairs))

        via_batcher = asyncio.run(batched())
    finally:
        unload(url, "beta")
    assert after["num_prefills"] - before["num_prefills"] == 1
    assert after["num_prefill_rows"] - before["num_prefill_rows"] == 4
    for got, want, res in zip(batch, alone, via_batcher, strict=True):
        assert got["output_ids"] == want["output_ids"] == res.output_ids
        assert max(abs(a - b) for a, b in zip(logprobs(got), logprobs(want), strict=True)) < 1e-5
        assert max(abs(a - b) for a, b in zip(res.logprobs, logprobs(want), strict=True)) < 1e-5


def test_requests_for_adapters_not_loaded_get_400_naming_them(servers):
    url = servers["wide"]
    r = post(url, "/generate", {"input_ids": PROMPT, "lora_path": "gamma"})
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and "'gamma'" in message and "['alpha']" in message
    r = post(url, "/generate", {"input_ids": [PROMPT, OTHER], "lora_path": [None, "gamma"]})
    assert r.status_code == 400 and "lora_path[1]" in r.json()["error"]["message"]
    r = post(url, "/generate", {"input_ids": [PROMPT, OTHER], "lora_path": ["alpha"] * 3})
    assert r.status_code == 400 and "3 entries for 2 prompts" in r.json()["error"]["message"]
    r = post(url, "/unload_lora_adapter", {"lora_name": "gamma"})
    assert r.status_code == 400 and r.json()["success"] is False
    assert "'gamma' is not loaded" in r.json()["error_message"]


def test_a_name_loads_once_and_is_unknown_after_its_unload(servers, adapters):
    url = servers["wide"]

    async def main():
        async with EngineClient(url) as c:
            with pytest.raises(EngineError, match="already loaded") as twice:
                await c.load_lora_adapter("alpha", str(adapters["beta"]))
            await c.load_lora_adapter("beta", str(adapters["beta"]))
            await c.generate(PROMPT, GREEDY, lora_path="beta")
            reply = await c.unload_lora_adapter("beta")
            with pytest.raises(EngineError, match="'beta' is not loaded") as gone:
                await c.generate(PROMPT, GREEDY, lora_path="beta")
            return twice.value, reply, gone.value

    twice, reply, gone = asyncio.run(main())
    assert twice.status == 400 and gone.status == 400
    assert reply["loaded_adapters"] == {"alpha": str(adapters["alpha"])}


def test_a_reload_of_the_same_config_serves_the_new_tensors_and_parked_layers_stay_out(
    servers, adapters, references, reference_logprobs
):
    """A weight sync unloads an adapter and loads new tensors of the same config under its
    name: the engine copies them into the layers it kept (no new peft layers), and serves
    exactly the new adapter; while no adapter is served, base rows are the bare model's."""
    url = servers["wide"]

    def bare():
        reply = generate(url, PROMPT)
        return reply["output_ids"], logprobs(reply)

    base = bare()
    unload(url, "alpha")  # nothing served now: alpha's layers are parked
    assert bare() == base  # bit for bit
    load(url, "alpha", adapters["beta"])  # another config: new layers, alpha's parked ones go
    assert_serves(generate(url, PROMPT, "alpha"), references["beta"], PROMPT, reference_logprobs)
    unload(url, "alpha")
    load(url, "again", adapters["beta"])  # the same config: beta's layers, refilled
    assert_serves(generate(url, PROMPT, "again"), references["beta"], PROMPT, reference_logprobs)
    assert bare() == base
    unload(url, "again")
    load(url, "alpha", adapters["alpha"])  # back as the module's other tests expect
    assert_serves(generate(url, PROMPT, "alpha"), references["alpha"], PROMPT, reference_logprobs)


def test_loading_from_tensors_equals_loading_from_the_folder(servers, adapters):
    """The same adapter loaded from its folder, from base64 safetensors and from SGLang's
    flattened_bucket (shared memory, this machine) serves bit-identical logprobs."""
    from kernel.engine.weights import FlatBucketWriter, encode_named_tensors, read_adapter

    url = servers["wide"]
    config, tensors = read_adapter(str(adapters["beta"]))
    writer = FlatBucketWriter()

    async def main():
        async with EngineClient(url) as c:
            await c.load_lora_adapter("beta", str(adapters["beta"]))
            plain = encode_named_tensors(tensors)
            await c.load_lora_adapter_from_tensors("beta.plain", config, plain)
            flat = writer.payload(tensors)
            reply = await c.load_lora_adapter_from_tensors(
                "beta.flat", config, flat, load_format="flattened_bucket"
            )
            served = [
                await c.generate(PROMPT, GREEDY, lora_path=name)
                for name in ("beta", "beta.plain", "beta.flat")
            ]
            for name in ("beta", "beta.plain", "beta.flat"):
                await c.unload_lora_adapter(name)
            return reply, served

    reply, served = asyncio.run(main())
    writer.close()
    assert reply["loaded_adapters"]["beta.flat"] == "<tensors>"
    assert served[0].output_ids == served[1].output_ids == served[2].output_ids
    assert served[0].logprobs == served[1].logprobs == served[2].logprobs


def _bad_adapters():
    """(case, change to (config, tensors), words the 400 must hold)."""
    first = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"

    def nan(config, tensors, base):
        tensors[first] = tensors[first].clone().index_fill(1, torch.tensor([3]), float("nan"))

    def wrong_shape(config, tensors, base):
        tensors[first] = tensors[first][:, :-1]

    def unknown(config, tensors, base):
        tensors["base_model.model.model.layers.0.self_attn.x_proj.lora_A.weight"] = tensors[first]

    def missing(config, tensors, base):
        del tensors[first]

    def bias(config, tensors, base):
        config["bias"] = "all"

    def targets(config, tensors, base):
        config["target_modules"] = ["q_proj", "mlp"]  # wraps a q_proj, then fails on the MLP

    def dora(config, tensors, base):  # peft loads it but cannot batch it with other adapters
        from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

        config["use_dora"] = True
        model = get_peft_model(copy.deepcopy(base), LoraConfig(use_dora=True, **CONFIGS["alpha"]))
        tensors.update(get_peft_model_state_dict(model))  # with its magnitude vectors

    return [
        ("nan", nan, [first, "NaN"]),
        ("shape", wrong_shape, [first, "shape"]),
        ("unknown", unknown, ["x_proj", "unknown adapter tensor"]),
        ("missing", missing, [first, "missing adapter tensor"]),
        ("bias", bias, ["bias", "only LoRA matrices"]),
        ("targets", targets, ["config_dict does not fit the model"]),
        ("dora", dora, ["cannot run in a mixed-adapter batch", "DoRA"]),
    ]


@pytest.mark.parametrize(("case", "spoil", "words"), _bad_adapters(), ids=lambda x: x)
def test_a_bad_adapter_is_refused_whole(servers, adapters, tiny_model, case, spoil, words):
    """A 400 naming what is wrong, and nothing changes: the name stays unknown, the loaded
    adapters and the base serve bit for bit what they did, and the name loads fine after."""
    from kernel.engine.weights import encode_named_tensors, read_adapter

    url = servers["wide"]
    before = [logprobs(generate(url, PROMPT, name)) for name in (None, "alpha")]
    config, tensors = read_adapter(str(adapters["alpha"]))
    spoil(config, tensors, tiny_model)
    body = {"lora_name": "gamma", "config_dict": config}
    r = post(url, "/load_lora_adapter_from_tensors", body | {"serialized_tensors": ""})
    assert r.status_code == 400  # an empty payload, first
    body["serialized_tensors"] = encode_named_tensors(tensors)
    r = post(url, "/load_lora_adapter_from_tensors", body)
    assert r.status_code == 400 and r.json()["success"] is False, r.text
    assert all(w in r.json()["error_message"] for w in words), r.json()["error_message"]
    assert r.json()["loaded_adapters"] == {"alpha": str(adapters["alpha"])}
    assert post(url, "/generate", {"input_ids": PROMPT, "lora_path": "gamma"}).status_code == 400
    assert [logprobs(generate(url, PROMPT, name)) for name in (None, "alpha")] == before
    load(url, "gamma", adapters["beta"])
    unload(url, "gamma")


def test_loading_another_adapter_leaves_alpha_and_the_base_bit_identical(servers, adapters):
    url = servers["wide"]
    before = [generate(url, PROMPT, name) for name in (None, "alpha")]
    load(url, "beta", adapters["beta"])
    during = [generate(url, PROMPT, name) for name in (None, "alpha")]
    unload(url, "beta")
    after = [generate(url, PROMPT, name) for name in (None, "alpha")]
    assert [logprobs(r) for r in before] == [logprobs(r) for r in during]
    assert [logprobs(r) for r in before] == [logprobs(r) for r in after]


def test_the_prefix_cache_never_serves_one_adapters_kv_to_another(servers, adapters):
    """The same prompt under alpha, then beta: beta gets nothing from alpha's entry and serves
    bit for bit what it serves on an empty cache; alpha's own next request is served from it."""
    url = servers["wide"]
    load(url, "beta", adapters["beta"])
    try:
        post(url, "/flush_cache", {})
        fresh = generate(url, LONG, "beta")
        post(url, "/flush_cache", {})
        generate(url, LONG, "alpha")
        again = generate(url, LONG, "alpha")
        crossed = generate(url, LONG, "beta")
        base = generate(url, LONG)
    finally:
        unload(url, "beta")
    assert again["meta_info"]["cached_tokens"] == len(LONG) - 1
    assert crossed["meta_info"]["cached_tokens"] == 0 and base["meta_info"]["cached_tokens"] == 0
    assert crossed["output_ids"] == fresh["output_ids"] and logprobs(crossed) == logprobs(fresh)


def test_one_adapter_per_batch_serves_all_in_two_prefills(servers, references, reference_logprobs):
    """max_loras_per_batch=1: alpha's rows (and the base row, which takes no slot) run first,
    beta's wait for them and then run together; each is what peft computes."""
    url = servers["narrow"]
    prompts = [PROMPT, PROMPT, OTHER, PROMPT, OTHER]
    loras = ["alpha", "beta", "alpha", None, "beta"]
    before = stats(url)
    replies = generate(url, prompts, loras)
    after = stats(url)
    for reply, prompt, lora in zip(replies, prompts, loras, strict=True):
        assert reply["meta_info"]["finish_reason"]["type"] == "length"
        assert_serves(reply, references[lora], prompt, reference_logprobs)
    assert after["num_prefills"] - before["num_prefills"] == 2


def test_an_unload_waits_for_its_requests_or_leaves_paused_ones_to_a_reload(servers, adapters):
    """Running, the unload returns once beta's request has finished (not aborted). Paused, it
    returns at once: a row of beta goes on if beta is loaded again before the engine continues,
    and ends as an abort naming it if not."""
    url = servers["wide"]
    short = {"temperature": 0, "max_new_tokens": 200, "ignore_eos": True}
    long = {"temperature": 0, "max_new_tokens": 1800, "ignore_eos": True}
    beta = {"lora_name": "beta", "lora_path": str(adapters["beta"])}

    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:

            async def start(rid: str, params: dict) -> asyncio.Task:
                body = {"input_ids": PROMPT, "lora_path": "beta", "sampling_params": params}
                task = asyncio.create_task(c.post("/generate", json=body | {"rid": rid}))
                while (await c.get("/get_load")).json()[0]["num_reqs"] == 0:
                    await asyncio.sleep(0.005)
                return task

            async def call(path: str, body: dict) -> None:
                assert (await c.post(path, json=body)).status_code == 200

            await call("/load_lora_adapter", beta)
            drained = await start("drained", short)
            await call("/unload_lora_adapter", {"lora_name": "beta"})
            drained = (await drained).json()

            await call("/load_lora_adapter", beta)
            kept = await start("kept", long)
            await call("/pause_generation", {"mode": "in_place"})
            await call("/unload_lora_adapter", {"lora_name": "beta"})
            await call("/load_lora_adapter", beta)
            await call("/continue_generation", {})
            await call("/abort_request", {"rid": "kept"})
            kept = (await kept).json()

            orphan = await start("orphan", long)
            await call("/pause_generation", {"mode": "in_place"})
            await call("/unload_lora_adapter", {"lora_name": "beta"})
            await call("/continue_generation", {})
            return drained, kept, (await orphan).json()

    drained, kept, orphan = asyncio.run(main())
    assert drained["meta_info"]["finish_reason"] == {"type": "length", "length": 200}
    assert kept["meta_info"]["finish_reason"]["message"] == "aborted by /abort_request"
    assert orphan["meta_info"]["finish_reason"]["type"] == "abort"
    assert "'beta' was unloaded" in orphan["meta_info"]["finish_reason"]["message"]


def _in_process(settings: ServerConfig, calls):
    """Run ``await calls(client)`` against an in-process server of ``settings``."""
    from kernel.engine.server import create_app

    app = create_app(settings)

    async def main():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://engine") as c:
                return await calls(c)

    return asyncio.run(main())


def test_a_server_without_enable_lora_refuses_lora_path(tiny_model_dir, adapters):
    async def calls(c: httpx.AsyncClient):
        named = await c.post("/generate", json={"input_ids": PROMPT, "lora_path": "alpha"})
        base = await c.post("/generate", json={"input_ids": [PROMPT], "lora_path": [None]})
        body = {"lora_name": "alpha", "lora_path": str(adapters["alpha"])}
        return named, base, await c.post("/load_lora_adapter", json=body)

    settings = ServerConfig(model=str(tiny_model_dir), num_threads=1)
    named, base, loaded = _in_process(settings, calls)
    assert named.status_code == 400 and "enable_lora" in named.json()["error"]["message"]
    assert base.status_code == 200
    assert loaded.status_code == 400 and "enable_lora" in loaded.json()["error_message"]


def test_base_weights_change_and_release_under_adapters(
    tiny_model, tiny_model_dir, adapters, reference_logprobs, tmp_path
):
    """A server with no adapter at start: its base rows stay bit for bit what the bare model
    gave while alpha is loaded and after; a full-weight update names the bare model's tensors
    and moves the base under alpha; a release frees the base weights only, and no adapter loads
    while they are released; a folder outside weights_dir is refused."""
    weights = dict(tiny_model.state_dict())
    gen = torch.Generator().manual_seed(7)
    moved = weights[Q_PROJ] + 0.05 * torch.randn(weights[Q_PROJ].shape, generator=gen)
    bare_moved = copy.deepcopy(tiny_model)
    bare_moved.state_dict()[Q_PROJ].copy_(moved)
    refs = {"base": bare_moved, "alpha": with_adapter(bare_moved, adapters["alpha"])}
    alpha = {"lora_name": "alpha", "lora_path": str(adapters["alpha"])}

    async def calls(c: httpx.AsyncClient):
        from kernel.engine.weights import encode_named_tensors

        async def gen(lora=None) -> dict:
            body = {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": True}
            r = await c.post("/generate", json=body | ({"lora_path": lora} if lora else {}))
            assert r.status_code == 200, r.text
            return r.json()

        async def update(named: dict) -> httpx.Response:
            body = {"serialized_named_tensors": [encode_named_tensors(named)]}
            return await c.post("/update_weights_from_tensor", json=body)

        out = {"bare": await gen()}
        body = {"lora_name": "x", "lora_path": str(tmp_path)}
        out["outside"] = await c.post("/load_lora_adapter", json=body)
        assert (await c.post("/load_lora_adapter", json=alpha)).status_code == 200
        out["wrapped"], out["alpha"] = await gen(), await gen("alpha")
        out["peft_name"] = await update({Q_PROJ.replace("q_proj.", "q_proj.base_layer."): moved})
        assert (await update({Q_PROJ: moved})).status_code == 200
        out["moved"], out["alpha_moved"] = await gen(), await gen("alpha")
        await c.post("/release_memory_occupation", json={"tags": ["weights"]})
        out["released"] = await c.post("/load_lora_adapter", json=alpha | {"lora_name": "a2"})
        await c.post("/resume_memory_occupation", json={})
        assert (await update(weights)).status_code == 200  # resumed weights are zeros
        out["resumed"], out["alpha_resumed"] = await gen(), await gen("alpha")
        assert (await c.post("/unload_lora_adapter", json={"lora_name": "alpha"})).is_success
        out["unwrapped"] = await gen()
        return out

    settings = ServerConfig(
        model=str(tiny_model_dir),
        num_threads=1,
        enable_lora=True,
        weights_dir=str(adapters["alpha"].parent),
    )
    out = _in_process(settings, calls)
    assert out["outside"].status_code == 400
    assert "outside weights_dir" in out["outside"].json()["error_message"]
    for key in ("wrapped", "resumed", "unwrapped"):
        assert logprobs(out[key]) == logprobs(out["bare"]), key
    assert logprobs(out["alpha_resumed"]) == logprobs(out["alpha"])  # the adapter stayed
    assert out["peft_name"].status_code == 400
    assert "unknown parameter" in out["peft_name"].json()["message"]
    assert_serves(out["moved"], refs["base"], PROMPT, reference_logprobs)
    assert_serves(out["alpha_moved"], refs["alpha"], PROMPT, reference_logprobs)
    assert out["released"].status_code == 400
    assert "released" in out["released"].json()["error_message"]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"lora_paths": ["a=/x"]}, "lora_paths needs enable_lora"),
        ({"enable_lora": True, "max_loras_per_batch": 0}, "max_loras_per_batch"),
        ({"enable_lora": True, "lora_paths": ["=/x"]}, "lora_paths: '=/x'"),
        ({"enable_lora": True, "lora_paths": ["a=/x", "a=/y"]}, r"lora_paths: the names \['a'\]"),
    ],
)
def test_lora_settings_are_checked_naming_the_field(kwargs, words):
    with pytest.raises(ValueError, match=words):
        ServerConfig(**kwargs).validate()


def test_lora_settings_reach_the_embedded_server_command():
    from kernel.engine.__main__ import parse_config
    from kernel.engine.launch import server_command

    engine = EngineConfig(enable_lora=True, max_loras_per_batch=3, lora_paths=["a=/x.y", "/z"])
    config = engine.validate().server_config("/m", port=1234, seed=0)
    assert parse_config(server_command(config)[3:]) == config
    assert (config.enable_lora, config.max_loras_per_batch) == (True, 3)
    assert [lora_spec(entry) for entry in config.lora_paths] == [("a", "/x.y"), ("/z", "/z")]
    for bad, field in (
        ({"max_loras_per_batch": 0}, "engine.max_loras_per_batch"),
        ({"max_lora_rank": -1}, "engine.max_lora_rank"),
        ({"lora_paths": ["a=/x"]}, "engine.lora_paths needs engine.enable_lora"),
    ):
        with pytest.raises(ValueError, match=field):
            EngineConfig(**bad).validate()


def test_the_batcher_never_puts_two_adapters_in_one_prompt_row():
    """Equal calls of one adapter share a row (n); equal prompts of different adapters are
    rows of their own, and a batch names each row's adapter (None for the base)."""
    sent = []

    class Recorder:
        base_url = "http://recorder"

        async def generate(self, ids, params, lora_path=None):
            sent.append(([ids], params.get("n", 1), lora_path))
            return GenerateResult(list(ids), [0.0], {"type": "length"}, "0")

        async def generate_batch(self, prompts, params, lora_path=None):
            sent.append((prompts, params["n"], lora_path))
            n = len(prompts) * params["n"]
            return [GenerateResult([1], [0.0], {"type": "length"}, "0")] * n

    async def main():
        batcher = RequestBatcher([Recorder()])
        calls = [(PROMPT, "alpha"), (PROMPT, "beta"), (PROMPT, None), (PROMPT, "alpha")]
        await asyncio.gather(*(batcher.submit(p, GREEDY, lora) for p, lora in calls))
        await asyncio.gather(batcher.submit(OTHER, GREEDY), batcher.submit(PROMPT, GREEDY))
        await batcher.submit(OTHER, GREEDY, "beta")

    asyncio.run(main())
    assert sorted(sent, key=str) == sorted(
        [
            ([PROMPT], 2, ["alpha"]),  # alpha's two calls: one row, n = 2
            ([PROMPT, PROMPT], 1, ["beta", None]),
            ([OTHER, PROMPT], 1, None),  # no adapter in the batch: no lora_path at all
            ([OTHER], 1, "beta"),
        ],
        key=str,
    )
