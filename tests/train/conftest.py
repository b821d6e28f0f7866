"""Fixtures of the trainer tests: a tiny char-tokenizer model and random samples for it.

The 100-token character vocabulary keeps the output layer small, so a forward and backward of a
whole batch take milliseconds on CPU.
"""

from __future__ import annotations

import random

import pytest

from kernel.sample import Sample, Status

VOCAB = 100


@pytest.fixture(scope="session")
def char_model_dir(tmp_path_factory):
    """A 2-layer Qwen2-family model (hidden 64) with the 100-token character tokenizer."""
    from kernel.models import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny_char"), "qwen2", tokenizer="char"))


@pytest.fixture(scope="session")
def make_samples():
    """The sample factory below, as a fixture (test folders here are not packages)."""
    return _make_samples


def _make_samples(n: int, seed: int = 0, rollout: bool = True) -> list[Sample]:
    """n trainable samples of varied prompt/response lengths, some loss-masked tokens, random
    advantages, and rollout logprobs near the uniform distribution's log(1/100)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, r = rng.randint(2, 12), rng.randint(1, 14)
        mask = [1] * r
        if r > 2:
            mask[rng.randrange(r)] = 0  # a partner/tool token inside the response
        out.append(
            Sample(
                prompt_ids=[rng.randrange(VOCAB) for _ in range(p)],
                response_ids=[rng.randrange(VOCAB) for _ in range(r)],
                loss_mask=mask,
                rollout_logprobs=[-4.6 + rng.uniform(-0.3, 0.3) for _ in range(r)]
                if rollout
                else None,
                advantage=rng.gauss(0.0, 1.0),
                status=Status.COMPLETED,
                group_id=i // 4,
                index=i % 4,
            )
        )
    return out
