"""Shared test fixtures: real tiny models built from configs around SmolLM2's real tokenizer.

Built once per test session, saved with save_pretrained, and loaded by every consumer through
the normal HF path.
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


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir, tmp_path_factory):
    """(URL, tokenizer) of a real embedded server serving the tiny Qwen2 model (one per test
    module)."""
    from kernel.engine.launch import free_port, launch_server
    from kernel.engine.settings import ServerConfig
    from kernel.models import load_tokenizer

    proc = launch_server(
        ServerConfig(model=str(tiny_model_dir), port=free_port(), num_threads=1),
        tmp_path_factory.mktemp("tiny_engine") / "engine.log",
    )
    try:
        proc.wait_healthy(deadline_s=180)
        yield proc.url, load_tokenizer(str(tiny_model_dir))
    finally:
        proc.stop()


def _loss_spans(sample) -> list[list[int]]:
    """The runs of loss-mask-1 response tokens: one per turn the agent sampled."""
    spans, current = [], []
    for t, m in zip(sample.response_ids, sample.loss_mask, strict=True):
        if m:
            current.append(t)
        elif current:
            spans.append(current)
            current = []
    return spans + ([current] if current else [])


@pytest.fixture(scope="session")
def loss_spans():
    """``loss_spans(sample)``: its runs of trained tokens (test folders are not packages)."""
    return _loss_spans


@pytest.fixture(scope="session")
def scripted_agent():
    """``scripted_agent(name, tokenizer, script, ...)``: a real AgentHandle (real tokenizer,
    dialogues and loss masks) whose engine call is replaced by the next scripted text, tokenized
    and ended with the chat template's stop token, for turns a random tiny model never writes
    (a diagnosis, code, an answer)."""
    from kernel.engine.client import GenerateResult
    from kernel.run.agents import AgentHandle

    class ScriptedAgent(AgentHandle):
        def __init__(self, name, tok, script, max_response_len=32, max_context_len=768,
                     version="1"):  # fmt: skip
            super().__init__(name, [object()], tok, {}, max_response_len, max_context_len)
            self.script, self.version = list(script), version

        async def generate(self, input_ids, sampling=None) -> GenerateResult:
            end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
            ids = [*self.tokenizer.encode(self.script.pop(0), add_special_tokens=False), end]
            stop = {"type": "stop", "matched": end}
            return GenerateResult(ids, [-0.5] * len(ids), stop, self.version)

    return ScriptedAgent
