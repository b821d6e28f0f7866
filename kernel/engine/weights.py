"""Loading the served model and writing new weights into it, for every update path.

- from disk: an HF checkpoint folder (or ``smollm2``) loaded by transformers, then copied in;
- from tensor: named tensors as base64 of safetensors bytes. SGLang's
  ``serialized_named_tensors`` are its ``MultiprocessingSerializer`` output -- a pickle of CUDA
  IPC handles, meant for a trainer on the same GPU. This server never unpickles network input,
  so its entries are safetensors files (plain bytes + a JSON header) instead; the field name,
  the list-of-base64-strings shape and the other fields are SGLang's;
- from distributed: tensors broadcast by rank 0 of a custom process group (kernel/sync).

All three end in ``apply_named_tensors``, which checks every name and shape before it copies
anything, so a bad payload leaves the model as it was.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

NamedTensors = Mapping[str, Tensor] | Iterable[tuple[str, Tensor]]


def load_model(path: str, dtype: str = "float32", device: str = "cpu"):
    """An HF causal LM in eval mode (``smollm2`` is read from its GGUF file)."""
    from kernel.models import load_causal_lm

    return load_causal_lm(path, dtype=dtype, device=device).eval()


def parse_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` or ``"torch.bfloat16"`` -> torch.bfloat16."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _items(named: NamedTensors) -> list[tuple[str, Tensor]]:
    return list(named.items()) if isinstance(named, Mapping) else list(named)


def apply_named_tensors(model, named: NamedTensors) -> int:
    """Copy tensors into the model's parameters and buffers by name; returns how many.

    Names are the model's ``state_dict()`` keys (tied weights answer to both names). Values are
    cast to the parameter's dtype and device.
    """
    items = _items(named)
    targets = model.state_dict(keep_vars=True)
    errors = []
    for name, tensor in items:
        if name not in targets:
            errors.append(f"unknown parameter {name!r}")
        elif tuple(tensor.shape) != tuple(targets[name].shape):
            errors.append(
                f"{name}: shape {list(tensor.shape)} != the model's {list(targets[name].shape)}"
            )
    if errors:
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        raise ValueError("; ".join(errors[:3]) + more)
    with torch.no_grad():
        for name, tensor in items:
            targets[name].copy_(tensor)
    return len(items)


def encode_named_tensors(named: NamedTensors) -> str:
    """Named tensors -> base64 of safetensors bytes (one entry of ``serialized_named_tensors``)."""
    from safetensors.torch import save

    # clone(): safetensors refuses tensors that share storage (tied embeddings, views).
    tensors = {n: t.detach().to("cpu").clone().contiguous() for n, t in _items(named)}
    return base64.b64encode(save(tensors)).decode("ascii")


def decode_named_tensors(payload: str) -> dict[str, Tensor]:
    """The inverse of ``encode_named_tensors``; raises ValueError on anything malformed."""
    from safetensors.torch import load

    try:
        return load(base64.b64decode(payload, validate=True))
    except Exception as exc:  # binascii.Error, SafetensorError: both mean a bad payload
        raise ValueError(f"not base64 safetensors bytes: {exc}") from exc


def receive_broadcast(
    names: list[str], dtypes: list[str], shapes: list[list[int]], group, device
) -> list[tuple[str, Tensor]]:
    """Receive one broadcast from rank 0 of ``group`` per (name, dtype, shape), in order."""
    import torch.distributed as dist

    specs = [(n, parse_dtype(d), s) for n, d, s in zip(names, dtypes, shapes, strict=True)]
    received = []
    for name, dtype, shape in specs:
        tensor = torch.empty(shape, dtype=dtype, device=device)
        dist.broadcast(tensor, src=0, group=group)
        received.append((name, tensor))
    return received
