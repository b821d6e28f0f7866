"""The embedded engine's prefix cache (SGLang's radix-cache semantics): a request that starts with
an earlier prompt or reply prefills only the rest and says so in ``cached_tokens``, with the
logprobs it would have had without the cache; the byte cap holds. (A weight update flushing it
is tested with the other weight updates, in test_engine_weights.py.)"""

from __future__ import annotations

import random

import pytest
import torch

from kernel.engine.prefix_cache import PrefixCache
from kernel.engine.protocol import SamplingParams
from kernel.engine.scheduler import Request, Scheduler
from kernel.models import load_tokenizer


def _kv(tokens: int, fill: float = 0.0) -> torch.Tensor:
    return torch.full((2, 2, 1, tokens, 4), fill)  # (L, 2, H, T, D)


def _bytes(tokens: int) -> int:
    return _kv(tokens).numel() * 4


def test_match_takes_the_longest_prefix_and_leaves_one_token_to_prefill():
    cache = PrefixCache(max_bytes=10**6)
    cache.insert([1, 2, 3], _kv(3, 1.0))
    cache.insert([1, 2, 9, 9], _kv(4, 2.0))
    n, kv = cache.match([1, 2, 3, 4, 5])
    assert n == 3 and kv.shape == (2, 2, 1, 3, 4) and float(kv.max()) == 1.0
    n, kv = cache.match([1, 2, 9, 9])  # stored whole: its last token is prefilled again
    assert n == 3 and kv.shape[3] == 3 and float(kv.max()) == 2.0
    n, _ = cache.match([1, 2, 7])  # a shared beginning counts too
    assert n == 2
    assert cache.match([7, 1, 2]) == (0, None)
    assert cache.stats["cache_lookups"] == 4 and cache.stats["cache_hits"] == 3


def test_an_extension_replaces_its_prefix_and_a_prefix_adds_nothing():
    cache = PrefixCache(max_bytes=10**6)
    cache.insert([1, 2], _kv(2))
    cache.insert([1, 2, 3, 4], _kv(4))  # the next turn of the same conversation
    assert len(cache) == 1 and cache.bytes == _bytes(4)
    cache.insert([1, 2, 3], _kv(3))
    assert len(cache) == 1 and cache.bytes == _bytes(4)
    cache.insert([1, 2, 5], _kv(3))  # a different reply to the same prompt: both kept
    assert len(cache) == 2 and cache.bytes == _bytes(4) + _bytes(3)
    with pytest.raises(ValueError, match="KV of 2 tokens for a sequence of 3"):
        cache.insert([4, 5, 6], _kv(2))
    assert cache.clear() == 2 and len(cache) == 0 and cache.bytes == 0


def test_the_byte_cap_evicts_the_least_recently_used():
    cache = PrefixCache(max_bytes=2 * _bytes(4))
    cache.insert([1] * 4, _kv(4))
    cache.insert([2] * 4, _kv(4))
    assert cache.match([1] * 5)[0] == 4  # used: [2]*4 is now the oldest
    cache.insert([3] * 4, _kv(4))
    assert cache.bytes == 2 * _bytes(4) and cache.stats["cache_evictions"] == 1
    assert cache.match([2] * 5) == (0, None) and cache.match([1] * 5)[0] == 4
    cache.insert([9] * 20, _kv(20))  # larger than the whole cap: not stored
    assert cache.match([9] * 21) == (0, None) and cache.bytes <= cache.max_bytes
    off = PrefixCache(max_bytes=0)
    off.insert([1, 2], _kv(2))
    assert len(off) == 0 and off.match([1, 2, 3]) == (0, None)


def _conversations(scheduler: Scheduler, turns: int, params: SamplingParams) -> list[list[dict]]:
    """Three conversations, sent together each turn: each turn's prompt is the last prompt, the
    reply and a new user message (lengths differ, so cached prefixes differ within a batch)."""
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 49000) for _ in range(n)] for n in (5, 12, 20)]
    replies: list[list[dict]] = []
    for _ in range(turns):
        reqs = [
            Request(rid=f"c{i}", input_ids=p, params=params, return_logprob=True)
            for i, p in enumerate(prompts)
        ]
        scheduler.submit(reqs)
        got = [r.future.result(timeout=120) for r in reqs]
        replies.append(got)
        prompts = [
            p + g["output_ids"] + [rng.randrange(3, 49000) for _ in range(3 + i)]
            for i, (p, g) in enumerate(zip(prompts, got, strict=True))
        ]
    return replies


@pytest.fixture
def scheduler(tiny_model, tiny_model_dir):
    started = []

    def make(cache_bytes: int) -> Scheduler:
        s = Scheduler(
            tiny_model,
            load_tokenizer(str(tiny_model_dir)),
            max_batch_size=8,
            context_length=512,
            prefix_cache_bytes=cache_bytes,
        )
        s.start()
        started.append(s)
        return s

    yield make
    for s in started:
        s.shutdown()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_conversation_reuses_its_last_turn_with_the_same_logprobs(scheduler, temperature):
    params = SamplingParams(temperature=temperature, max_new_tokens=6, ignore_eos=True)
    on, off = scheduler(64 * 2**20), scheduler(0)
    cached, plain = _conversations(on, 3, params), _conversations(off, 3, params)
    for turn, (got, ref) in enumerate(zip(cached, plain, strict=True)):
        for i, (a, b) in enumerate(zip(got, ref, strict=True)):
            meta = a["meta_info"]
            assert b["meta_info"]["cached_tokens"] == 0
            if turn == 0:
                assert meta["cached_tokens"] == 0
            else:  # the last turn's prompt and reply, but the reply's last token (never fed)
                last = cached[turn - 1][i]["meta_info"]
                fed = last["prompt_tokens"] + last["completion_tokens"]
                assert meta["cached_tokens"] == fed - 1
            if temperature == 0:  # the same tokens, logprobs equal within 1e-5
                assert a["output_ids"] == b["output_ids"]
                lp_a = [x[0] for x in meta["output_token_logprobs"]]
                lp_b = [x[0] for x in b["meta_info"]["output_token_logprobs"]]
                assert max(abs(x - y) for x, y in zip(lp_a, lp_b, strict=True)) < 1e-5
    # Every cached token is one the forward did not run again.
    assert on.stats["num_cached_tokens"] > 0 and off.stats["num_cached_tokens"] == 0
    saved = off.stats["num_prefill_tokens"] - on.stats["num_prefill_tokens"]
    assert saved == on.stats["num_cached_tokens"]


def test_cached_rows_match_a_training_forward(scheduler, tiny_model, reference_logprobs):
    params = SamplingParams(temperature=0.8, max_new_tokens=5, ignore_eos=True)
    s = scheduler(64 * 2**20)
    prompt = [17, 400, 5000, 33, 33, 9]
    first = Request(rid="a", input_ids=prompt, params=params, return_logprob=True)
    s.submit([first])
    out = first.future.result(timeout=60)
    follow = prompt + out["output_ids"] + [71, 72]
    # One row with a cached prefix, one without, in one prefill: padding in the middle of a row.
    reqs = [
        Request(rid="b", input_ids=follow, params=params, return_logprob=True),
        Request(rid="c", input_ids=[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], params=params),
    ]
    reqs[1].return_logprob = True
    s.submit(reqs)
    for r in reqs:
        got = r.future.result(timeout=60)
        ref = reference_logprobs(tiny_model, r.input_ids, got["output_ids"], 0.8)
        lp = [x[0] for x in got["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(ref, lp, strict=True)) < 1e-4
    assert reqs[0].cached_tokens == len(prompt) + 4 and reqs[1].cached_tokens == 0


def test_the_cap_is_respected_under_load(scheduler, tiny_model):
    c = tiny_model.config
    per_token = (
        c.num_hidden_layers
        * 2
        * c.num_key_value_heads
        * (c.hidden_size // c.num_attention_heads)
        * 4
    )
    cap = 48 * per_token  # room for about two finished requests of 18 tokens
    s = scheduler(cap)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, ignore_eos=True)
    rng = random.Random(1)
    for _ in range(6):
        reqs = [
            Request(
                rid=str(i), input_ids=[rng.randrange(3, 49000) for _ in range(10)], params=params
            )
            for i in range(4)
        ]
        s.submit(reqs)
        for r in reqs:
            r.future.result(timeout=60)
        assert 0 < s.prefix_cache.bytes <= cap
    assert s.prefix_cache.stats["cache_evictions"] > 0
