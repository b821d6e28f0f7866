"""The weight sync's settings (``SyncConfig``), apart from the code that pushes: importing them
does not import torch, so a command that only reads or checks a config (``kernel train
--help``, ``kernel config``) does not wait for torch to load (kernel/train/settings.py).
"""

from __future__ import annotations

from dataclasses import dataclass

TRANSPORTS = ("auto", "disk", "tensor", "shared", "distributed")


@dataclass
class SyncConfig:
    """Weight sync from trainer to engines."""

    transport: str = "auto"
    """disk (HF checkpoint), tensor (bytes in the HTTP body), shared (a buffer shared on this
    machine, SGLang's flattened_bucket), distributed (process-group broadcast), or auto: shared
    when every engine is on a loopback address, else tensor."""
    bucket_mb: float = 64.0
    """Bucket size in MiB for the tensor and distributed transports."""
    pause_mode: str = "in_place"
    """How in-flight requests wait during an update: in_place (keep going afterwards with the
    new weights), retract (recompute afterwards) or abort (finish now, group requeued)."""
    backend: str = "auto"
    """Process-group backend of the distributed transport: gloo (CPU tensors), nccl (CUDA
    tensors), or auto: nccl when the trainer's rank 0 holds its weights on a GPU, else gloo."""
    check_tokens: int = 8
    """Post-sync check: after each push every engine samples this many tokens from a probe
    prompt (the first one the model just trained on) and the trainer scores them; 0 turns the
    check off."""
    check_tolerance: float = 0.1
    """Largest mean |engine - trainer| logprob per probe token (nats) a push may leave. fp32 on
    CPU agrees within 1e-4 and bf16 kernels within a few hundredths; a wrong weight conversion
    is off by nats."""
    check_every: int = 1
    """Check every k-th push (the first push is always checked)."""

    def validate(self) -> SyncConfig:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"sync.transport must be one of {TRANSPORTS}, got {self.transport!r}")
        if self.bucket_mb <= 0:
            raise ValueError(f"sync.bucket_mb must be > 0, got {self.bucket_mb}")
        if self.pause_mode not in ("in_place", "retract", "abort"):
            raise ValueError("sync.pause_mode must be in_place, retract or abort")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"sync.backend must be auto, gloo or nccl, got {self.backend!r}")
        if self.check_tokens < 0:
            raise ValueError(f"sync.check_tokens must be >= 0, got {self.check_tokens}")
        if not self.check_tolerance > 0:
            raise ValueError(f"sync.check_tolerance must be > 0, got {self.check_tolerance}")
        if self.check_every < 1:
            raise ValueError(f"sync.check_every must be >= 1, got {self.check_every}")
        return self
