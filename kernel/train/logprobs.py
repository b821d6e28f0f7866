"""Per-token logprobs and entropy from logits, the one definition shared by every backend.

Logits are divided by the sampling temperature before the softmax, because that is the
distribution the engine sampled from and reported logprobs for (SGLang's default); with the
same temperature, training logprobs and rollout logprobs agree up to numerics.
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """logits (B, T, V) predicting targets (B, T) -> logprob of each target (B, T), fp32."""
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)  # (B, T)
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return picked - logz


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """logits (B, T, V) -> entropy of each position's distribution (B, T), fp32."""
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)  # (B, T, V)
    return -(logp.exp() * logp).sum(-1)
