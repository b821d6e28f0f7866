"""The embedded engine's prefix cache (SGLang's radix-cache semantics): a request that starts with
an earlier prompt or reply prefills only the rest and says so in ``cached_tokens``, with the
logprobs it would have had without the cache; the byte cap holds. (A weight update flushing it
is tested with the other weight updates, in test_engine_weights.py.)"""

from __future__ import annotations

import random

import pytest
import torch

from kernel.engine.prefix_cache import BLOCK, PrefixCache
from kernel.engine.protocol import SamplingParams
from kernel.engine.scheduler import Request, Scheduler
from kernel.models import load_tokenizer


def _kv(tokens: int, fill: float = 0.0) -> torch.Tensor:
    return torch.full((2, 2, 1, tokens, 4), fill)  # (L, 2, H, T, D)


def _bytes(tokens: int) -> int:
    return _kv(tokens).numel() * 4


A = list(range(100, 100 + 2 * BLOCK))  # two full blocks
B = A[:BLOCK] + list(range(500, 500 + BLOCK + 3))  # shares A's first block only


def test_match_takes_the_longest_prefix_and_leaves_one_token_to_prefill():
    cache = PrefixCache(max_bytes=10**6)
    cache.insert(A, _kv(len(A), 1.0))
    cache.insert(B, _kv(len(B), 2.0))
    n, kv = cache.match([*A, 1, 2])
    assert n == len(A) and kv.shape == (2, 2, 1, len(A), 4) and float(kv.max()) == 1.0
    n, kv = cache.match(A)  # stored whole: its last token is prefilled again
    assert n == len(A) - 1 and kv.shape[3] == len(A) - 1
    n, kv = cache.match([*B[: BLOCK + 5], 7, 7])  # found by its first block, matched on from there
    assert n == BLOCK + 5 and float(kv.max()) == 2.0
    assert cache.match([7, *A]) == (0, None)
    assert cache.match(A[: BLOCK - 1]) == (0, None)  # no full block in common: not found
    assert cache.stats["cache_lookups"] == 5 and cache.stats["cache_hits"] == 3


def test_an_extension_replaces_its_prefix_and_a_prefix_adds_nothing():
    cache = PrefixCache(max_bytes=10**6)
    cache.insert(A, _kv(len(A)))
    cache.insert([*A, 1, 2, 3], _kv(len(A) + 3))  # the next turn of the same conversation
    assert len(cache) == 1 and cache.bytes == _bytes(len(A) + 3)
    cache.insert(A[:20], _kv(20))  # a prefix of the entry: nothing new
    assert len(cache) == 1 and cache.bytes == _bytes(len(A) + 3)
    cache.insert(B, _kv(len(B)))  # another reply to the same beginning: both kept
    assert len(cache) == 2 and cache.bytes == _bytes(len(A) + 3) + _bytes(len(B))
    cache.insert([1] * (BLOCK - 1), _kv(BLOCK - 1))  # shorter than a block: never found, not kept
    assert len(cache) == 2
    with pytest.raises(ValueError, match="KV of 2 tokens for a sequence of 3"):
        cache.insert([4, 5, 6], _kv(2))
    assert cache.clear() == 2 and len(cache) == 0 and cache.bytes == 0
    assert cache.match([*A, 1]) == (0, None)


def test_the_byte_cap_evicts_the_least_recently_used():
    n = 2 * BLOCK
    cache = PrefixCache(max_bytes=2 * _bytes(n))
    cache.insert([1] * n, _kv(n))
    cache.insert([2] * n, _kv(n))
    assert cache.match([1] * (n + 1))[0] == n  # used: [2] * n is now the oldest
    cache.insert([3] * n, _kv(n))
    assert cache.bytes == 2 * _bytes(n) and cache.stats["cache_evictions"] == 1
    assert cache.match([2] * (n + 1)) == (0, None) and cache.match([1] * (n + 1))[0] == n
    cache.insert([9] * 5 * n, _kv(5 * n))  # larger than the whole cap: not stored
    assert cache.match([9] * (5 * n + 1)) == (0, None) and cache.bytes <= cache.max_bytes
    off = PrefixCache(max_bytes=0)
    off.insert(A, _kv(len(A)))
    assert len(off) == 0 and off.match([*A, 1]) == (0, None)


def _conversations(scheduler: Scheduler, turns: int, params: SamplingParams) -> list[list[dict]]:
    """Three conversations, sent together each turn: each turn's prompt is the last prompt, the
    reply and a new user message (lengths differ, so cached prefixes differ within a batch)."""
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 49000) for _ in range(n)] for n in (17, 24, 40)]
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
    prompt = [17, 400, 5000, 33, 33, 9] * 3
    first = Request(rid="a", input_ids=prompt, params=params, return_logprob=True)
    s.submit([first])
    out = first.future.result(timeout=60)
    follow = prompt + out["output_ids"] + [71, 72]
    # One row with a cached prefix, one without, in one prefill: padding in the middle of a row.
    reqs = [
        Request(rid="b", input_ids=follow, params=params, return_logprob=True),
        Request(rid="c", input_ids=list(range(5, 16)), params=params),
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
        stored = s.call(lambda: s.prefix_cache.bytes).result(timeout=60)  # after the step ends
        assert 0 < stored <= cap
    assert s.prefix_cache.stats["cache_evictions"] > 0
