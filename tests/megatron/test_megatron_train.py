"""Tests for kernel/train/megatron_backend.py: one MegatronTrainer step (a real Megatron-core
GPTModel on CPU, wrapped in Megatron's DDP) and one TorchTrainer step from the same tiny Qwen2
checkpoint, same OptimConfig / LossConfig, same batch, give the same loss, logprobs and updated
weights (compared in HF names after the Megatron -> HF conversion), at TP=1 in this process and
at TP=2 (this file launched twice as a script: ranks 0 and 1 of a gloo group on 127.0.0.1)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

from kernel.loss import LossConfig
from kernel.models import build_tiny_model
from kernel.sample import Sample, Status
from kernel.train.megatron_backend import MegatronTrainer
from kernel.train.optim import OptimConfig
from kernel.train.settings import MegatronTrainerConfig, TorchTrainerConfig
from kernel.train.torch_backend import TorchTrainer
from tests.megatron.conftest import run_ranks

OPTIM, LOSS, TEMPERATURE = OptimConfig(lr=1e-3, grad_clip=1.0), LossConfig(), 0.7


def batch() -> list[Sample]:
    def sample(prompt, response, mask, advantage):
        return Sample(
            prompt_ids=prompt,
            response_ids=response,
            loss_mask=mask,
            advantage=advantage,
            status=Status.COMPLETED,
        )

    # different lengths, so the shorter row is right-padded in the micro-batch
    return [sample([1, 5, 7], [9, 10, 11], [1, 1, 0], 1.0), sample([2, 5], [9, 12], [1, 1], -0.5)]


def one_step(trainer) -> dict:
    """Logprobs before, metrics of one train_step, HF weights after."""
    lp = trainer.compute_logprobs(batch())
    metrics = trainer.train_step(batch())
    return {"lp": lp, "metrics": metrics, "after": dict(trainer.named_parameters_for_sync())}


def megatron_step(model: str, tensor_parallel: int) -> dict:
    cfg = MegatronTrainerConfig(tensor_parallel=tensor_parallel)
    trainer = MegatronTrainer(model, OPTIM, LOSS, cfg, total_steps=1, temperature=TEMPERATURE)
    try:
        return one_step(trainer)
    finally:
        trainer.close()


def run_tp_rank(rank: int, port: int, model: str, out: Path) -> None:
    import torch.distributed as dist

    from kernel.train.megatron_model import megatron_parallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    with megatron_parallel(tensor_parallel=2):
        result = megatron_step(model, tensor_parallel=2)
    if rank == 0:
        torch.save(result, out / "tp2.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The tiny checkpoint, its weights before, and one TorchTrainer step on it."""
    model = str(build_tiny_model(tmp_path_factory.mktemp("m"), "qwen2", tokenizer="char"))
    trainer = TorchTrainer(
        model, OPTIM, LOSS, TorchTrainerConfig(device="cpu"), 1, temperature=TEMPERATURE
    )
    before = {k: v.clone() for k, v in trainer.named_parameters_for_sync()}
    return model, before, one_step(trainer)


def check_same_step(ref: dict, before: dict, got: dict) -> None:
    for a, b in zip(ref["lp"], got["lp"], strict=True):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)
    # token_mean over the 4 masked tokens, ratio 1: loss = -(1 + 1 - 0.5 - 0.5) / 4 = -0.25
    assert got["metrics"]["loss"] == pytest.approx(-0.25, abs=1e-6)
    assert ref["metrics"]["loss"] == pytest.approx(-0.25, abs=1e-6)
    # the norm is above grad_clip = 1, so clipping is part of what is compared
    assert got["metrics"]["grad_norm"] == pytest.approx(ref["metrics"]["grad_norm"], rel=1e-5)
    assert ref["metrics"]["grad_norm"] > 1.0
    assert got["metrics"]["step"] == 1.0
    assert set(got["after"]) == set(ref["after"]) == set(before)
    moved = max((ref["after"][k] - before[k]).abs().max().item() for k in before)
    assert moved > 5e-4  # Adam moves each weight by about lr = 1e-3: the update is visible
    diff = max((ref["after"][k] - got["after"][k]).abs().max().item() for k in before)
    assert diff < 1e-5, diff


def test_one_step_matches_the_torch_backend(reference):
    model, before, ref = reference
    check_same_step(ref, before, megatron_step(model, tensor_parallel=1))


@pytest.mark.slow
def test_tensor_parallel_two_ranks_match_the_torch_backend(reference, tmp_path):
    model, before, ref = reference
    run_ranks(__file__, lambda r, port: [str(r), str(port), model, str(tmp_path)])
    check_same_step(ref, before, torch.load(tmp_path / "tp2.pt", weights_only=False))


def test_save_hf_writes_a_checkpoint_hf_loads(reference, tmp_path):
    from kernel.models import load_causal_lm

    model, before, _ = reference
    trainer = MegatronTrainer(model, OPTIM, LOSS, MegatronTrainerConfig(), total_steps=1)
    try:
        out = trainer.save_hf(tmp_path / "hf")
    finally:
        trainer.close()
    loaded = dict(load_causal_lm(str(out), dtype="float32", device="cpu").named_parameters())
    assert set(loaded) == set(before)
    for k, v in before.items():  # no step taken: the checkpoint's own weights come back
        assert torch.equal(loaded[k], v), k
    assert (out / "tokenizer_config.json").exists()


def test_config_validate_names_the_field():
    with pytest.raises(ValueError, match="tensor_parallel"):
        MegatronTrainerConfig(tensor_parallel=0).validate()
    with pytest.raises(ValueError, match="pipeline_parallel"):
        MegatronTrainerConfig(pipeline_parallel=0).validate()
    with pytest.raises(ValueError, match="optimizer"):
        MegatronTrainerConfig(optimizer="sgd").validate()
    assert MegatronTrainerConfig().pack_sequences is False


if __name__ == "__main__":
    run_tp_rank(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
