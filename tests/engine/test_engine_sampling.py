"""The sampler of the embedded server, with hand-computed values: which tokens each filter
keeps, and that the reported logprob is log_softmax(logits / T) before any filter; plus the
scheduler's refusal of caches it cannot batch."""

from __future__ import annotations

import math

import pytest
import torch

from kernel.engine.scheduler import left_pad, next_version, sample_tokens


def _params(b, temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0):
    full = lambda v, dtype=torch.float32: torch.full((b,), v, dtype=dtype)  # noqa: E731
    return full(temperature), full(top_p), full(top_k, torch.long), full(min_p)


def test_greedy_takes_the_argmax_and_reports_raw_logits():
    logits = torch.tensor([[1.0, 2.0, 0.0]])
    tokens, lp = sample_tokens(logits, *_params(1, temperature=0.0))
    # log softmax of the raw logits at token 1: 2 - log(e^1 + e^2 + e^0)
    expected = 2.0 - math.log(math.e + math.e**2 + 1.0)  # = -0.40761
    assert tokens.tolist() == [1]
    assert abs(lp.item() - expected) < 1e-6
    assert abs(expected - (-0.40761)) < 1e-5


def test_reported_logprob_uses_temperature_but_not_the_filters():
    # logits [0, ln 3]; at T = 0.5 they become [0, 2 ln 3] -> probs [1/10, 9/10].
    logits = torch.tensor([[0.0, math.log(3.0)]]).repeat(50, 1)
    tokens, lp = sample_tokens(logits, *_params(50, temperature=0.5, top_k=1))
    assert tokens.tolist() == [1] * 50  # top_k = 1 keeps only token 1 ...
    assert torch.allclose(lp, torch.full((50,), math.log(0.9)))  # ... yet reports log 0.9, not 0


def _draws(probs, n=4000, seed=0, **params):
    logits = torch.tensor([probs]).log().repeat(n, 1)
    gen = torch.Generator().manual_seed(seed)
    tokens, _ = sample_tokens(logits, *_params(n, **params), generator=gen)
    return torch.bincount(tokens, minlength=len(probs)).tolist()


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = [0.5, 0.3, 0.15, 0.05]  # mass of the better tokens: 0, 0.5, 0.8, 0.95
    counts = _draws(probs, top_p=0.7)  # 0.8 > 0.7: tokens 0 and 1 stay
    assert counts[2] == counts[3] == 0
    assert abs(counts[0] / 4000 - 0.5 / 0.8) < 0.03  # renormalised: 0.625 and 0.375
    counts = _draws(probs, top_p=0.85)  # 0.95 > 0.85: tokens 0, 1 and 2 stay
    assert counts[3] == 0 and min(counts[:3]) > 0


def test_top_k_and_min_p():
    probs = [0.5, 0.3, 0.15, 0.05]
    counts = _draws(probs, top_k=2)
    assert counts[2] == counts[3] == 0 and min(counts[:2]) > 0
    counts = _draws(probs, min_p=0.4)  # floor 0.4 * 0.5 = 0.2: tokens 0 and 1 stay
    assert counts[2] == counts[3] == 0 and min(counts[:2]) > 0


def test_plain_sampling_follows_the_distribution_and_skips_zero_probability():
    counts = _draws([0.2, 0.0, 0.8], n=20000)
    assert counts[1] == 0
    assert abs(counts[2] / 20000 - 0.8) < 0.015  # 3.5 standard deviations of 0.0028


def test_rows_of_one_batch_keep_their_own_params():
    logits = torch.tensor([[0.0, 1.0, 5.0], [0.0, 1.0, 5.0]])
    temperature = torch.tensor([0.0, 1.0])
    top_p, top_k, min_p = torch.ones(2), torch.tensor([-1, 1]), torch.zeros(2)
    tokens, lp = sample_tokens(logits, temperature, top_p, top_k, min_p)
    assert tokens.tolist() == [2, 2]
    z = math.log(1 + math.e + math.e**5)
    assert torch.allclose(lp, torch.tensor([5 - z, 5 - z]))


def test_left_pad_and_versions():
    ids, mask = left_pad([[7, 8, 9], [5]], pad_id=0, device="cpu")
    assert ids.tolist() == [[7, 8, 9], [0, 0, 5]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert [next_version("0"), next_version("41"), next_version("run-a")] == ["1", "42", "run-a+1"]


def test_models_with_sliding_window_caches_are_refused(smollm2_tokenizer):
    from transformers import AutoConfig, AutoModelForCausalLM

    from kernel.engine.scheduler import Scheduler

    config = AutoConfig.for_model(
        "mistral",
        vocab_size=128,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=8,
    )
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError, match="DynamicSlidingWindowLayer"):
        Scheduler(model, smollm2_tokenizer, max_batch_size=2, context_length=64)
