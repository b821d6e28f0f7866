"""Weight updates on a running embedded server (server B): from tensors (safetensors bytes, and
SGLang's flattened_bucket payload over shared memory), from disk and by broadcast over a custom
gloo group, each checked by the logprobs the server then reports against a training forward of
the new weights; plus versions and failure modes (a hostile pickle among them)."""

from __future__ import annotations

import asyncio
import base64
import copy
import threading

import httpx
import pytest
import torch
import torch.distributed as dist

from kernel.engine.client import EngineClient, EngineError
from kernel.engine.launch import free_port
from kernel.engine.process_group import (
    GroupConfig,
    destroy_custom_process_group,
    init_custom_process_group,
)

PROMPT = [3, 14, 15, 92, 65]
GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
SAMPLED = {"temperature": 0.8, "max_new_tokens": 8, "ignore_eos": True}


def _run(coro):
    return asyncio.run(coro)


@pytest.fixture
def restore_b(server_b, tiny_model_dir):
    """Give server B its original weights back (and version "0") after the test."""
    yield
    with httpx.Client(timeout=60) as h:
        body = {"model_path": str(tiny_model_dir), "weight_version": "0"}
        assert h.post(f"{server_b}/update_weights_from_disk", json=body).status_code == 200


@pytest.fixture(scope="module")
def perturbed(tiny_model):
    """A copy of the tiny model with every weight moved (seeded), the 'trained' weights."""
    model = copy.deepcopy(tiny_model)
    gen = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model


def _check_serves(url: str, model, reference_logprobs) -> list[float]:
    """Generate on the server and compare with a training forward of ``model``."""

    async def main():
        async with EngineClient(url) as c:
            return await asyncio.gather(c.generate(PROMPT, GREEDY), c.generate(PROMPT, SAMPLED))

    greedy, sampled = _run(main())
    for res, params in ((greedy, GREEDY), (sampled, SAMPLED)):
        ref = reference_logprobs(model, PROMPT, res.output_ids, params["temperature"])
        assert max(abs(a - b) for a, b in zip(ref, res.logprobs, strict=True)) < 1e-4
    return greedy.logprobs


def test_update_from_tensor_sets_version_and_new_logprobs(
    server_b, tiny_model, perturbed, reference_logprobs, restore_b
):
    before = _check_serves(server_b, tiny_model, reference_logprobs)
    named = dict(perturbed.state_dict())

    async def main():
        async with EngineClient(server_b) as c:
            await c.update_weights_from_tensor(named, weight_version="7")
            return await c.get_weight_version()

    assert _run(main()) == "7"
    after = _check_serves(server_b, perturbed, reference_logprobs)
    assert max(abs(a - b) for a, b in zip(before, after, strict=True)) > 1e-3


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ({"model.nope.weight": torch.zeros(2)}, ["model.nope.weight", "unknown"]),
        ({"model.norm.weight": torch.zeros(3)}, ["model.norm.weight", "[3]", "[64]"]),
        (
            {"model.norm.weight": torch.ones(64).index_fill(0, torch.tensor([5]), float("nan"))},
            ["model.norm.weight", "NaN or infinite"],
        ),
        ({"lm_head.weight": torch.full((49152, 64), float("-inf"))}, ["lm_head.weight", "NaN"]),
    ],
)
def test_bad_tensor_updates_change_nothing(
    server_b, tiny_model, reference_logprobs, payload, words
):
    # A valid tensor rides along: it must not be applied when another one is bad.
    named = payload | {"model.embed_tokens.weight": torch.zeros(49152, 64)}

    async def main():
        async with EngineClient(server_b) as c:
            with pytest.raises(EngineError) as err:
                await c.update_weights_from_tensor(named)
            return str(err.value), err.value.status, await c.get_weight_version()

    message, status, version = _run(main())
    assert status == 400 and version == "0"
    for w in words:
        assert w in message
    _check_serves(server_b, tiny_model, reference_logprobs)


def test_a_weight_update_flushes_the_prefix_cache(
    server_b, tiny_model, perturbed, reference_logprobs, restore_b
):
    prompt = list(range(21, 41))  # 20 tokens: a full block of the cache's hashing, and more

    async def main():
        async with EngineClient(server_b) as c:

            async def cached() -> int:
                return (await c.generate(prompt, GREEDY)).meta_info["cached_tokens"]

            seen = [await cached(), await cached()]
            await c.update_weights_from_tensor(dict(perturbed.state_dict()))
            seen += [await cached(), await cached()]
            await c.flush_cache()
            return [*seen, await cached()]

    # Cached up to the last prompt token (one is always prefilled); none after an update or
    # /flush_cache; and what is served after the update is the new weights' forward.
    assert _run(main()) == [0, 19, 0, 19, 0]
    _check_serves(server_b, perturbed, reference_logprobs)


def test_update_from_flattened_bucket_over_shared_memory(
    server_b, tiny_model, perturbed, reference_logprobs, restore_b
):
    from kernel.engine.weights import FlatBucketWriter

    before = _check_serves(server_b, tiny_model, reference_logprobs)
    named = list(perturbed.state_dict().items())
    writer = FlatBucketWriter()

    async def main():
        async with EngineClient(server_b) as c:
            half = len(named) // 2  # two buckets through one reused buffer, version on the last
            flat = "flattened_bucket"
            await c.update_weights_from_serialized([writer.payload(named[:half])], load_format=flat)
            await c.update_weights_from_serialized(
                [writer.payload(named[half:])], load_format=flat, weight_version="9"
            )
            return await c.get_weight_version()

    assert _run(main()) == "9"
    writer.close()
    after = _check_serves(server_b, perturbed, reference_logprobs)
    assert max(abs(a - b) for a, b in zip(before, after, strict=True)) > 1e-3


def test_flattened_bucket_round_trip_keeps_every_dtype_and_shape():
    from kernel.engine.weights import FlatBucketWriter, decode_flattened_bucket

    named = [
        ("a", torch.randn(3, 5)),
        ("b", torch.arange(7, dtype=torch.int64)),
        ("c", torch.randn(4, 2).to(torch.bfloat16)),
        ("d", torch.tensor(2.5)),
        ("e", torch.randn(6, 4).t()),  # not contiguous
    ]
    writer = FlatBucketWriter()
    got = decode_flattened_bucket(writer.payload(named))
    assert [n for n, _ in got] == [n for n, _ in named]
    for (_, want), (_, have) in zip(named, got, strict=True):
        assert have.dtype == want.dtype and have.shape == want.shape
        assert torch.equal(have, want)
    writer.close()


class _Evil:
    def __reduce__(self):
        import os

        return (os.getpid, ())


def test_flattened_bucket_refuses_foreign_pickles_and_bad_metadata(server_b):
    import pickle
    import types

    from kernel.engine.weights import FlatBucketWriter, decode_flattened_bucket

    evil = base64.b64encode(pickle.dumps({"flattened_tensor": _Evil(), "metadata": []})).decode()
    with pytest.raises(ValueError, match=r"posix\.getpid is not allowed"):
        decode_flattened_bucket(evil)
    from multiprocessing.reduction import ForkingPickler

    from kernel.engine.weights import _file_system_sharing

    meta = [types.SimpleNamespace(name="x", shape=[100], dtype=torch.float32, start_idx=0,
                                  end_idx=400, numel=400)]  # fmt: skip
    with _file_system_sharing():  # a real shared buffer, as a trainer sends it, but too small
        buf = torch.zeros(8, dtype=torch.uint8).share_memory_()
        oversized = ForkingPickler.dumps({"flattened_tensor": buf, "metadata": meta})
    with pytest.raises(ValueError, match=r"metadata\[0\] \(x\)"):
        decode_flattened_bucket(base64.b64encode(oversized).decode())
    # over HTTP: a 400 naming the field, and the engine still serves
    for entry in (evil, FlatBucketWriter().payload([("model.nope.weight", torch.zeros(2))])):
        body = {"serialized_named_tensors": [entry], "load_format": "flattened_bucket"}
        r = httpx.post(f"{server_b}/update_weights_from_tensor", json=body)
        assert r.status_code == 400, r.text
        assert ("not allowed" if entry == evil else "model.nope.weight") in r.json()["message"]
    r = httpx.post(f"{server_b}/generate", json={"input_ids": [1, 2], "sampling_params": {}})
    assert r.status_code == 200


def test_tensor_payload_must_be_base64_safetensors(server_b):
    pickled = base64.b64encode(b"\x80\x04\x95 not a safetensors file").decode()
    for entry in ("%%% not base64", pickled):
        body = {"serialized_named_tensors": [entry]}
        r = httpx.post(f"{server_b}/update_weights_from_tensor", json=body)
        assert r.status_code == 400
        assert "serialized_named_tensors" in r.json()["message"]


def test_update_from_disk_bumps_the_version(
    server_b, perturbed, reference_logprobs, tmp_path, restore_b
):
    perturbed.save_pretrained(tmp_path / "step1")

    async def main():
        async with EngineClient(server_b) as c:
            await c.update_weights_from_disk(str(tmp_path / "step1"))  # no version given
            version = await c.get_weight_version()
            with pytest.raises(EngineError) as err:
                await c.update_weights_from_disk(str(tmp_path / "missing"))
            return version, str(err.value)

    version, message = _run(main())
    assert version == "1"  # "0" counted up
    assert "missing" in message
    _check_serves(server_b, perturbed, reference_logprobs)


def test_update_from_distributed_over_gloo(server_b, perturbed, reference_logprobs, restore_b):
    """This process is rank 0 of a custom group and broadcasts; the server is rank 1."""
    config = GroupConfig(master_port=free_port(), world_size=2, backend="gloo")
    named = list(perturbed.state_dict().items())
    groups = {}

    def join():
        groups["trainer"] = init_custom_process_group(config, rank=0)

    async def main():
        async with EngineClient(server_b) as c:
            joiner = threading.Thread(target=join)
            joiner.start()
            await c.init_weights_update_group(
                "127.0.0.1", config.master_port, rank_offset=1, world_size=2, backend="gloo"
            )
            await asyncio.to_thread(joiner.join)
            group = groups["trainer"]

            def send():
                for _, tensor in named:
                    dist.broadcast(tensor.detach().contiguous(), src=0, group=group)

            update = c.update_weights_from_distributed(
                [n for n, _ in named],
                [str(t.dtype).removeprefix("torch.") for _, t in named],
                [list(t.shape) for _, t in named],
                weight_version="step-3",
            )
            await asyncio.gather(update, asyncio.to_thread(send))
            version = await c.get_weight_version()
            await c.destroy_weights_update_group()
            destroy_custom_process_group(group)
            return version

    assert _run(main()) == "step-3"
    assert not dist.is_initialized()  # the default group was never touched
    _check_serves(server_b, perturbed, reference_logprobs)


def test_nccl_group_on_a_cpu_server_is_refused(server_b):
    body = {"master_address": "127.0.0.1", "master_port": free_port(), "rank_offset": 1}
    r = httpx.post(f"{server_b}/init_weights_update_group", json=body | {"world_size": 2})
    assert r.status_code == 400 and "nccl" in r.json()["message"]  # SGLang's default backend


def test_distributed_update_needs_a_group(server_b):
    body = {"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[64]]}
    r = httpx.post(f"{server_b}/update_weights_from_distributed", json=body)
    assert r.status_code == 400 and "weight_update_group" in r.json()["message"]
    body = {"names": ["a", "b"], "dtypes": ["float32"], "shapes": [[1]]}
    r = httpx.post(f"{server_b}/update_weights_from_distributed", json=body)
    assert r.status_code == 400 and "names, dtypes and shapes" in r.json()["error"]["message"]


def test_weight_version_endpoint_and_flush_cache_spare_running_requests(server_b, restore_b):
    async def main():
        async with EngineClient(server_b) as c:
            params = {"max_new_tokens": 400, "ignore_eos": True}
            running = asyncio.create_task(c.generate([1, 2], params))
            await asyncio.sleep(0.1)
            await c.flush_cache()
            await c.update_weight_version("v-next")
            return await running, await c.get_weight_version()

    res, version = _run(main())
    assert res.finish_reason == {"type": "length", "length": 400}
    assert version == "v-next" == res.weight_version  # reported at completion


def test_onednn_linears_match_mkl_follow_updates_and_keep_autograd(tiny_model):
    """The server's oneDNN Linear layers give the default forward's logits (float rounding
    apart), read the weights at each call (an in-place update is seen at once), and fall back
    to F.linear where autograd needs a graph."""
    from kernel.engine import scheduler
    from kernel.engine.scheduler import use_onednn_linears

    ref = copy.deepcopy(tiny_model)
    fast = copy.deepcopy(tiny_model)
    linears = sum(type(m) is torch.nn.Linear for m in fast.modules())
    assert use_onednn_linears(fast) == linears > 0
    assert fast.lm_head.forward.__func__ is scheduler._onednn_forward
    ids = torch.tensor([PROMPT, PROMPT[::-1]])
    with torch.inference_mode():
        assert torch.allclose(fast(ids).logits, ref(ids).logits, atol=1e-4)
        with torch.no_grad():
            for model in (ref, fast):
                model.model.layers[0].mlp.down_proj.weight.mul_(3.0)
        assert torch.allclose(fast(ids).logits, ref(ids).logits, atol=1e-4)
    loss = fast(ids).logits.logsumexp(-1).mean()  # grad enabled: the F.linear path
    loss.backward()
    assert fast.model.layers[0].mlp.down_proj.weight.grad is not None
