"""Fixtures of the engine tests: two real embedded servers (subprocesses on free ports) serving
the tiny Qwen2 model, started together once per session, and that model loaded in-process as
the reference for "what a training forward pass gives"."""

from __future__ import annotations

import pytest

from kernel.engine.launch import free_port, launch_server
from kernel.engine.settings import ServerConfig


@pytest.fixture(scope="session")
def engine_servers(tiny_model_dir, tmp_path_factory):
    """Servers A and B (same tiny model); each test that changes B's weights restores them."""
    logs = tmp_path_factory.mktemp("engine_logs")
    procs = []
    try:
        for name in ("a", "b"):
            config = ServerConfig(
                model=str(tiny_model_dir), port=free_port(), max_batch_size=16, num_threads=1
            )
            procs.append(launch_server(config, logs / f"server_{name}.log"))
        for p in procs:
            p.wait_healthy(deadline_s=180)
        yield procs
    finally:
        for p in procs:
            p.stop()


@pytest.fixture(scope="session")
def server_a(engine_servers) -> str:
    return engine_servers[0].url


@pytest.fixture(scope="session")
def server_b(engine_servers) -> str:
    return engine_servers[1].url


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    """The served model, in fp32, for reference forward passes."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def training_logprobs(
    model, prompt: list[int], output: list[int], temperature: float
) -> list[float]:
    """Logprobs of ``output`` after ``prompt`` from one plain fp32 forward pass, as a trainer
    computes them (kernel.train.logprobs, same temperature scaling)."""
    import torch

    from kernel.train.logprobs import token_logprobs

    device = next(model.parameters()).device
    full = torch.tensor([prompt + output], device=device)  # (1, P + O)
    with torch.no_grad():
        logits = model(input_ids=full).logits[:, len(prompt) - 1 : -1]  # (1, O, V)
    targets = torch.tensor([output], device=device)
    return token_logprobs(logits, targets, temperature)[0].tolist()


@pytest.fixture(scope="session")
def reference_logprobs():
    return training_logprobs
