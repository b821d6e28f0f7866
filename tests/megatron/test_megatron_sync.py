"""Weight sync from a Megatron trainer into a running embedded server: after one training step
the engine is measurably behind; after ``WeightSync.push`` (tensor and distributed/gloo
transports) its logprobs for the sampled ids equal the Megatron model's own (forward_logits ->
log_softmax) within 1e-4, and the push's own post-sync check agrees."""

from __future__ import annotations

import asyncio

import pytest
import torch

pytest.importorskip("megatron.core")

from kernel.engine.pool import EngineConfig, EnginePool
from kernel.loss import LossConfig
from kernel.models import build_tiny_model
from kernel.sample import Sample, Status
from kernel.sync.push import WeightSync
from kernel.sync.settings import SyncConfig
from kernel.train.megatron_backend import MegatronTrainer
from kernel.train.megatron_model import forward_logits
from kernel.train.optim import OptimConfig
from kernel.train.settings import MegatronTrainerConfig

PROMPT = [1, 5, 7, 9, 11, 13]


def megatron_logprobs(trainer: MegatronTrainer, ids: list[int]) -> list[float]:
    """Logprob of each of ``ids`` after PROMPT, from the Megatron model directly."""
    seq = torch.tensor([PROMPT + ids])  # (1, T)
    with torch.no_grad():
        logits = forward_logits(trainer.module, seq, trainer.arch)  # (1, T, V)
    logp = torch.log_softmax(logits.float(), dim=-1)[0]  # (T, V)
    p = len(PROMPT)
    return [logp[p - 1 + i, t].item() for i, t in enumerate(ids)]


@pytest.mark.parametrize("transport", ["tensor", "shared", "distributed"])
def test_push_makes_engine_logprobs_equal_megatrons(tmp_path, transport):
    model = str(build_tiny_model(tmp_path / "m", "qwen2", tokenizer="char"))
    trainer = MegatronTrainer(
        model, OptimConfig(lr=0.05), LossConfig(), MegatronTrainerConfig(), total_steps=1
    )

    async def run(client):
        sync = WeightSync(SyncConfig(transport=transport, bucket_mb=0.05), [client], tmp_path)
        try:
            res = await client.generate(PROMPT, {"max_new_tokens": 4})
            sample = Sample(
                prompt_ids=PROMPT,
                response_ids=res.output_ids,
                loss_mask=[1] * len(res.output_ids),
                advantage=1.0,
                status=Status.COMPLETED,
            )
            trainer.train_step([sample])  # the trainer moves; the engine does not, yet
            stale = await client.generate(PROMPT, {"max_new_tokens": 4})
            stale_ref = megatron_logprobs(trainer, stale.output_ids)
            metrics = await sync.push(trainer, version=1, probe=PROMPT)
            metrics |= await sync.checked()
            fresh = await client.generate(PROMPT, {"max_new_tokens": 4})
            ref = megatron_logprobs(trainer, fresh.output_ids)
            return stale, stale_ref, fresh, ref, metrics
        finally:
            await sync.aclose()
            await client.aclose()

    try:
        with EnginePool(EngineConfig(num_threads=1), model, tmp_path / "logs") as pool:
            stale, stale_ref, fresh, ref, metrics = asyncio.run(run(pool.clients()[1][0]))
    finally:
        trainer.close()
    assert max(abs(a - b) for a, b in zip(stale.logprobs, stale_ref, strict=True)) > 1e-3
    assert fresh.weight_version == "1"
    assert max(abs(a - b) for a, b in zip(fresh.logprobs, ref, strict=True)) < 1e-4
    assert metrics["sync/check_logprob_diff"] < 1e-4  # the post-sync check (trainer's logprobs)
