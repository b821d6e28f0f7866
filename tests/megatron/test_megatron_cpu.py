"""Tests for kernel/train/megatron_cpu.py: the CPU patches are applied only without CUDA, once,
and each patched call gives its CPU meaning; importing the kernel never imports Megatron."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytest.importorskip("megatron.core")

from kernel.train.megatron_cpu import apply_cpu_patches, cpu_patches_applied


def test_importing_the_modules_does_not_import_megatron():
    code = (
        "import sys, kernel, kernel.train.megatron_cpu, kernel.train.megatron_model, "
        "kernel.sync.convert; print([m for m in sys.modules if m.startswith('megatron')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the patches apply only without CUDA")
def test_patches_give_cpu_meaning_and_are_idempotent():
    assert apply_cpu_patches() is True
    assert apply_cpu_patches() is True and cpu_patches_applied()
    from megatron.core.fusions import fused_softmax
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.tensor_parallel import random

    assert torch.cuda.current_device() == torch.device("cpu")
    # the schedules' token counter, allocated with device="cuda" there, lands on the CPU;
    # everything else the module reads from torch is torch's own
    counter = schedules.torch.zeros([], dtype=torch.int, device="cuda")
    assert counter.device == torch.device("cpu") and counter.dtype == torch.int
    assert schedules.torch.Tensor is torch.Tensor and torch.zeros is not schedules.torch.zeros
    torch.cuda.synchronize()  # would raise "Torch not compiled with CUDA enabled" unpatched
    torch.cuda.current_stream().wait_stream(torch.cuda.current_stream())  # so would this
    # Tensor.cuda is redirected only inside Megatron's tied-embedding set-up, not here
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1).cuda()
    # causal mask for 3 positions: True above the diagonal (future tokens are masked)
    assert fused_softmax.get_default_causal_mask(3).tolist() == [
        [False, True, True],
        [False, False, True],
        [False, False, False],
    ]
    # Megatron's RNG tracker now keeps CPU generator states: stream "a" seeded 7 draws what a
    # CPU generator seeded 7 draws, and forking it leaves the default stream where it was.
    random.initialize_rng_tracker(force_reset=True)
    tracker = random.get_cuda_rng_tracker()
    tracker.add("a", 7)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    with tracker.fork("a"):
        drawn = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(drawn, torch.rand(3, generator=torch.Generator().manual_seed(7)))
    random.initialize_rng_tracker(force_reset=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the patches apply only without CUDA")
def test_megatron_clipping_runs_on_cpu_tensors():
    apply_cpu_patches()
    from megatron.core.optimizer import clip_grads

    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([2.0, 4.0])  # a CPU "torch.FloatTensor": Megatron asserts CUDA's
    clip_grads.clip_grad_by_total_norm_fp32([p], max_norm=1.0, total_norm=2.0)
    # scaled by max_norm / (total_norm + 1e-6) = 1 / 2.000001
    assert torch.allclose(p.grad, torch.tensor([2.0, 4.0]) / 2.000001)
    assert p.type() == "torch.FloatTensor"  # Tensor.type is itself again after the call


@pytest.mark.gpu
def test_no_op_with_cuda():
    assert apply_cpu_patches() is False
    assert not cpu_patches_applied()
