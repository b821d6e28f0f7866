"""Shared test fixtures: real tiny models built from configs around SmolLM2's real tokenizer.

Built once per test session (loading the GGUF tokenizer takes seconds), saved with
save_pretrained, and loaded by every consumer through the normal HF path.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no model hub here: fail fast, never hang
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from kernel.models import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm2_tokenizer):
    """A 2-layer Qwen2-family model (hidden 64) with SmolLM2's tokenizer and chat template."""
    from kernel.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"), "qwen2", smollm2_tokenizer)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, smollm2_tokenizer):
    """A second, different tiny model (Llama family) for multi-model tests."""
    from kernel.models import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("tiny_llama"), "llama", smollm2_tokenizer, hidden_size=48, seed=1
    )
