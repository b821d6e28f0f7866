"""Fixtures of the cluster tests: a tiny char-tokenizer model (fast to train and serve on 2 CPU
cores) and a local Ray instance on 127.0.0.1 with auth off -- plain, or declaring 4 fake GPUs for
placement -- shut down after the module."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def char_model_dir(tmp_path_factory):
    """A 2-layer Qwen2-family model (hidden 64, 4 heads, 2 KV heads), 100-token char tokenizer."""
    from kernel.models import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny_char"), "qwen2", tokenizer="char"))


def start_local_ray(num_gpus: int = 0):
    """A local Ray cluster of this machine only (no dashboard, 127.0.0.1, auth disabled) that
    declares ``num_gpus`` GPUs (Ray schedules by them; none need exist); stopped on exit."""
    import ray

    old = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(
        address="local",
        include_dashboard=False,
        num_cpus=2,
        num_gpus=num_gpus,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    try:
        yield ray
    finally:
        ray.shutdown()
        if old is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = old


@pytest.fixture(scope="module")
def local_ray():
    yield from start_local_ray()


@pytest.fixture(scope="module")
def fake_gpu_ray():
    """A local Ray cluster that declares 4 GPUs it does not have (placement tests)."""
    yield from start_local_ray(num_gpus=4)
