"""Weight buckets: group (name, tensor) pairs for pushing to engines.

Pushing a model tensor by tensor costs one round trip each; pushing it whole needs a second
copy of the model in memory. Buckets of a configurable byte size sit between: tensors are
grouped in order until the next one would overflow the bucket (a tensor bigger than the bucket
travels alone). The payload of one bucket is kernel.engine.weights.encode_named_tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

NamedTensor = tuple[str, torch.Tensor]


def iter_buckets(named: Iterable[NamedTensor], bucket_bytes: int) -> Iterator[list[NamedTensor]]:
    """Group (name, tensor) pairs in order into lists of at most ``bucket_bytes`` bytes."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    bucket: list[NamedTensor] = []
    size = 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield bucket
