"""Loading the served model and writing new weights into it, for every update path.

- from disk: an HF checkpoint folder (or ``smollm2``) loaded by transformers, then copied in;
- from tensor, two payloads (``load_format``):
  * default (``safetensors``): named tensors as base64 of safetensors bytes -- plain bytes and
    a JSON header, for an engine on any machine;
  * ``flattened_bucket``: SGLang 0.5.x's own (``sglang.srt.weight_sync.tensor_bucket``): the
    base64 of a ``ForkingPickler`` pickle of ``{"flattened_tensor": uint8 tensor, "metadata":
    [name, shape, dtype, start_idx, end_idx, numel (bytes)]}``. The pickle carries a HANDLE to
    the buffer's storage, not its bytes: a shared-memory file (torch's ``file_system`` sharing
    strategy) for a CPU buffer, a CUDA IPC handle for a GPU one. The trainer copies the weights
    into the buffer once and the engine copies them out once; the engine must be on the same
    machine. ``FlatBucketWriter`` writes it; ``decode_flattened_bucket`` reads it with an
    unpickler that admits only the classes and functions such a pickle needs (torch's storage
    and tensor rebuilders, dtypes, ``torch.Size``, ``SimpleNamespace`` and SGLang's metadata
    class), so a request body cannot name any other callable;
- from distributed: tensors broadcast by rank 0 of a custom process group (kernel/sync).

All three end in ``apply_named_tensors``, which checks every name, shape and value (no NaN or
infinity) before it copies anything, so a bad payload leaves the model as it was. The names are
the HF model's own also while it serves LoRA adapters (``base_names``).

LoRA adapters (PEFT format: ``adapter_config.json`` and ``adapter_model.safetensors``, from a
folder with ``read_adapter`` or as tensors) are served by peft: ``add_adapter`` wraps the model
in a ``peft.PeftModel`` on the first (the HF model stays the same object, with peft's layers
inside) and ``remove_adapter`` unwraps it after the last. Their tensors go through the same
checks, so a bad adapter is refused whole.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import pickle
import threading
import types
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel.models import load_causal_lm

Tensor = Any
"""A ``torch.Tensor``. torch is imported in the functions that use it: the engine client imports
this module, and the CLI imports the client's settings for its flags without waiting for torch
(kernel/loss.py's ``Tensor``)."""

NamedTensors = Mapping[str, Tensor] | Iterable[tuple[str, Tensor]]


def load_model(path: str, dtype: str = "float32", device: str = "cpu"):
    """An HF causal LM in eval mode (``smollm2`` from its converted copy, see ``kernel.models``)."""

    return load_causal_lm(path, dtype=dtype, device=device).eval()


def parse_dtype(name: str) -> Any:
    """``"bfloat16"`` or ``"torch.bfloat16"`` -> torch.bfloat16."""
    import torch

    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _items(named: NamedTensors) -> list[tuple[str, Tensor]]:
    return list(named.items()) if isinstance(named, Mapping) else list(named)


def base_names(named: Iterable[tuple[str, Tensor]]) -> dict[str, Tensor]:
    """An HF model's tensors by the names they have without LoRA adapters: where peft wraps a
    layer, its ``...q_proj.base_layer.weight`` answers to ``...q_proj.weight``, and the
    adapters' own tensors (``lora_A``, ``lora_B``, ...) are left out. A bare model's names stay."""
    return {n.replace(".base_layer.", "."): t for n, t in named if ".lora_" not in n}


def apply_named_tensors(model, named: NamedTensors) -> int:
    """Copy tensors into the HF model's parameters and buffers by name; returns how many.

    Names are the model's ``state_dict()`` keys (tied weights answer to both names), those of
    the bare model also while it serves LoRA adapters (``base_names``: the base weights change,
    the adapters stay). Values are cast to the parameter's dtype and device. Unknown names,
    wrong shapes and NaN or infinite values are refused (ValueError naming the tensors) before
    anything is copied.
    """
    import torch

    items = _items(named)
    targets = base_names(model.state_dict(keep_vars=True).items())
    _check(items, targets, "parameter")
    with torch.no_grad():
        for name, tensor in items:
            targets[name].copy_(tensor)
    return len(items)


def _check(
    items: list[tuple[str, Tensor]], targets: Mapping[str, Tensor], what: str, complete=False
) -> None:
    """Refuse (ValueError naming the tensors) names ``targets`` lacks, shapes other than its,
    NaN or infinite values and, if ``complete``, a target left out."""
    given = {name for name, _ in items}
    errors = [f"missing {what} {n!r}" for n in targets if complete and n not in given]
    for name, tensor in items:
        if name not in targets:
            like = next(iter(targets), None)
            errors.append(f"unknown {what} {name!r} (the model's are named like {like!r})")
        elif tuple(tensor.shape) != tuple(targets[name].shape):
            errors.append(
                f"{name}: shape {list(tensor.shape)} != the model's {list(targets[name].shape)}"
            )
        elif not _finite(tensor):
            errors.append(f"{name}: holds NaN or infinite values")
    if errors:
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        raise ValueError("; ".join(errors[:3]) + more)


def _finite(tensor: Tensor) -> bool:
    """Whether a tensor holds no NaN or infinity: one fp64 sum (NaN and inf survive it, and no
    float32 values overflow it), cheaper than a full ``isfinite`` mask."""
    import torch

    if not tensor.is_floating_point():
        return True
    return bool(torch.isfinite(tensor.sum(dtype=torch.float64)))


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


# ---- SGLang's flattened_bucket payload ------------------------------------------------------


@dataclass
class FlatMeta:
    """One tensor of a flattened bucket; SGLang's ``FlattenedTensorMetadata`` fields (a pickle
    made by SGLang's or slime's own code names that class; it is read as this one)."""

    name: str
    shape: list[int]
    dtype: Any  # a torch.dtype
    start_idx: int
    end_idx: int
    numel: int  # bytes of the tensor in the flat uint8 buffer


_strategy_lock = threading.Lock()


@contextlib.contextmanager
def _file_system_sharing() -> Iterator[None]:
    """Share CPU storages as named shared-memory files for the duration: the other strategy
    (file descriptors) hands fds over a connection authenticated with this process's
    multiprocessing key, which a separately started server does not have."""
    import torch.multiprocessing as mp

    with _strategy_lock:
        before = mp.get_sharing_strategy()
        mp.set_sharing_strategy("file_system")
        try:
            yield
        finally:
            mp.set_sharing_strategy(before)


class FlatBucketWriter:
    """Writes buckets of named tensors into one shared byte buffer, reused from bucket to bucket
    and grown when a bucket is larger, and returns the ``flattened_bucket`` payload that points
    at it. The buffer must stay unchanged until the engine has answered (the caller awaits the
    update before writing the next bucket). ``device``: cpu (shared memory) or a CUDA device
    (CUDA IPC; the engine must share that GPU)."""

    def __init__(self, device: Any = "cpu") -> None:  # a name or a torch.device
        import torch

        self.device = torch.device(device)
        self._buffer: Tensor | None = None  # (N,) uint8, shared

    def payload(self, bucket: NamedTensors) -> str:
        """Copy ``bucket`` into the buffer; the base64 payload (one per engine TP rank)."""
        from multiprocessing.reduction import ForkingPickler

        import torch

        items = _items(bucket)
        total = sum(_aligned(t.numel() * t.element_size()) for _, t in items)
        if self._buffer is None or self._buffer.numel() < total:
            self._buffer = None  # drop the old one first: at most one buffer is held
            with _file_system_sharing():
                self._buffer = torch.empty(total, dtype=torch.uint8, device=self.device)
                if self.device.type == "cpu":
                    self._buffer.share_memory_()
        metadata, offset = [], 0
        for name, t in items:
            n = t.numel() * t.element_size()
            flat = t.detach().contiguous().reshape(-1).view(torch.uint8)  # (n,) bytes
            self._buffer[offset : offset + n].copy_(flat)
            shape = list(t.shape)
            metadata.append(
                types.SimpleNamespace(
                    name=name,
                    shape=shape,
                    dtype=t.dtype,
                    start_idx=offset,
                    end_idx=offset + n,
                    numel=n,
                )
            )
            offset += _aligned(n)  # every tensor starts aligned, so the reader can view it
        with _file_system_sharing():
            data = ForkingPickler.dumps(
                {"flattened_tensor": self._buffer[:offset], "metadata": metadata}
            )
        return base64.b64encode(bytes(data)).decode("ascii")

    def close(self) -> None:
        self._buffer = None


_REDUCTIONS = "torch.multiprocessing.reductions"
_ALLOWED = {
    (_REDUCTIONS, "rebuild_tensor"),
    (_REDUCTIONS, "rebuild_typed_storage"),
    (_REDUCTIONS, "rebuild_storage_filename"),
    (_REDUCTIONS, "rebuild_cuda_tensor"),
    ("torch.storage", "UntypedStorage"),
    ("torch.storage", "TypedStorage"),
    ("torch", "Tensor"),
    ("torch", "Size"),
    ("types", "SimpleNamespace"),
}
_SGLANG_META = ("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata")


class _PayloadUnpickler(pickle.Unpickler):
    """Admits only what a flattened_bucket pickle holds (see the module docstring)."""

    def find_class(self, module: str, name: str):
        import torch

        if (module, name) == _SGLANG_META:
            return FlatMeta
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a flattened_bucket")


def decode_flattened_bucket(payload: str) -> list[tuple[str, Tensor]]:
    """The named tensors of one ``flattened_bucket`` payload, as views into the shared buffer
    (copy them before the sender reuses it). Raises ValueError on anything malformed."""
    import torch

    try:
        data = base64.b64decode(payload, validate=True)
        obj = _PayloadUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # binascii.Error, UnpicklingError, a missing shared file, ...
        raise ValueError(f"not a flattened_bucket payload: {exc}") from exc
    if not isinstance(obj, dict) or set(obj) != {"flattened_tensor", "metadata"}:
        raise ValueError("a flattened_bucket is a dict of flattened_tensor and metadata")
    flat, metadata = obj["flattened_tensor"], obj["metadata"]
    if not isinstance(flat, torch.Tensor) or flat.dtype != torch.uint8 or flat.dim() != 1:
        raise ValueError("flattened_tensor must be a 1-D uint8 tensor")
    if not isinstance(metadata, list):
        raise ValueError("metadata must be a list")
    out = []
    for i, m in enumerate(metadata):
        try:
            name, dtype, shape = m.name, m.dtype, [int(x) for x in m.shape]
            start, end = int(m.start_idx), int(m.end_idx)
        except (AttributeError, TypeError, ValueError) as exc:
            raise ValueError(f"metadata[{i}]: {exc}") from exc
        if not isinstance(name, str) or not isinstance(dtype, torch.dtype):
            raise ValueError(f"metadata[{i}]: name must be a str and dtype a torch dtype")
        nbytes = dtype.itemsize * torch.Size(shape).numel()
        if not 0 <= start <= end <= flat.numel() or end - start != nbytes:
            raise ValueError(
                f"metadata[{i}] ({name}): bytes [{start}, {end}) do not hold a {shape} "
                f"{dtype} tensor inside a buffer of {flat.numel()} bytes"
            )
        data = flat[start:end]
        if start % dtype.itemsize:  # a writer that did not align: view a copy
            data = data.clone()
        out.append((name, data.view(dtype).reshape(shape)))
    return out


def _aligned(nbytes: int, to: int = 16) -> int:
    return -(-nbytes // to) * to


def receive_broadcast(
    names: list[str], dtypes: list[str], shapes: list[list[int]], group, device
) -> list[tuple[str, Tensor]]:
    """Receive one broadcast from rank 0 of ``group`` per (name, dtype, shape), in order."""
    import torch
    import torch.distributed as dist

    specs = [(n, parse_dtype(d), s) for n, d, s in zip(names, dtypes, shapes, strict=True)]
    received = []
    for name, dtype, shape in specs:
        tensor = torch.empty(shape, dtype=dtype, device=device)
        dist.broadcast(tensor, src=0, group=group)
        received.append((name, tensor))
    return received


# ---- LoRA adapters (peft) ----------------------------------------------------------------------

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def read_adapter(path: str) -> tuple[dict, dict[str, Tensor]]:
    """A PEFT adapter folder's config (``adapter_config.json``) and tensors
    (``adapter_model.safetensors``); ValueError naming the folder if either is missing or bad."""
    from safetensors.torch import load_file

    folder = Path(path)
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
        tensors = load_file(folder / ADAPTER_WEIGHTS)
    except Exception as exc:  # OSError, JSONDecodeError, SafetensorError: all a bad folder
        raise ValueError(
            f"{path}: not a PEFT adapter folder ({ADAPTER_CONFIG}, {ADAPTER_WEIGHTS}): {exc}"
        ) from exc
    if not isinstance(config, dict):
        raise ValueError(f"{path}: {ADAPTER_CONFIG} holds no JSON object")
    return config, tensors


def _lora_config(config: dict):
    """peft's LoraConfig of an ``adapter_config.json``, set up to serve; ValueError for anything
    but plain LoRA matrices: a bias, ``modules_to_save`` or trainable tokens would write weights
    that the base model and every other adapter share (SGLang serves none of them either)."""
    from peft import PeftConfig, PeftType

    try:
        lora = PeftConfig.from_peft_type(**config)
    except Exception as exc:  # unknown peft_type, bad values: the config's fault
        raise ValueError(f"not a peft adapter config: {exc}") from exc
    if lora.peft_type != PeftType.LORA:
        raise ValueError(f"peft_type {config.get('peft_type')!r}: only LORA adapters are served")
    shared = {
        "bias": lora.bias != "none",
        "modules_to_save": bool(lora.modules_to_save),
        "trainable_token_indices": bool(getattr(lora, "trainable_token_indices", None)),
        "layer_replication": bool(lora.layer_replication),
    }
    if any(shared.values()):
        raise ValueError(
            f"{[k for k, v in shared.items() if v]}: only LoRA matrices are served (these change "
            "weights the base model and the other adapters share)"
        )
    lora.inference_mode = True
    # The loaded tensors replace the initial ones; other inits (PiSSA, OLoRA, ...) would rewrite
    # the base weights.
    lora.init_lora_weights = True
    return lora


def add_adapter(model, name: str, config: dict, named: NamedTensors):
    """Load LoRA adapter ``name`` (peft's name for it: a module name, no dots) into ``model``
    (the served HF model, or the ``peft.PeftModel`` around it); returns the PeftModel to serve
    with.

    ``config`` is the adapter's ``adapter_config.json``, ``named`` its tensors under the names
    of an adapter file (what ``peft.get_peft_model_state_dict`` gives, e.g.
    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``), cast to the model's
    dtype and device. They must be exactly those the config makes, in name and shape, and
    finite, and the adapter must run in a mixed batch: anything wrong raises ValueError and
    leaves the model as it was."""
    from peft import PeftModel, get_peft_model_state_dict, set_peft_model_state_dict

    lora, items = _lora_config(config), _items(named)
    wrapped = isinstance(model, PeftModel)
    base = model.get_base_model() if wrapped else model
    # The adapter's dtype is the model's (peft would cast 16-bit adapters to float32 by default).
    try:
        if wrapped:
            model.add_adapter(name, lora, autocast_adapter_dtype=False)
        else:
            model = PeftModel(model, lora, adapter_name=name, autocast_adapter_dtype=False)
    except Exception as exc:
        _strip(base, name, unwrap=not wrapped)
        raise ValueError(f"config_dict does not fit the model: {exc}") from exc
    model.eval()  # peft makes its new layers in training mode (dropout)
    try:
        expected = get_peft_model_state_dict(model, adapter_name=name, save_embedding_layers=False)
        _check(items, expected, "adapter tensor", complete=True)
        set_peft_model_state_dict(model, dict(items), adapter_name=name)
        _probe(model, name)
    except Exception:
        model = remove_adapter(model, name)
        raise
    return model


def refill_adapter(model, name: str, named: NamedTensors) -> None:
    """New tensors for LoRA adapter ``name``, already in ``model`` (a ``peft.PeftModel``) with
    the config they belong to: the checks of ``add_adapter``, then a copy; no layer is made.
    ValueError leaves the adapter as it was."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    items = _items(named)
    expected = get_peft_model_state_dict(model, adapter_name=name, save_embedding_layers=False)
    _check(items, expected, "adapter tensor", complete=True)
    set_peft_model_state_dict(model, dict(items), adapter_name=name)


def _probe(model, name: str) -> None:
    """One token through adapter ``name`` in a mixed batch, as the scheduler runs it: peft
    loads some adapters it cannot batch (DoRA), which must fail here, not in a batch."""
    import torch

    ids = torch.zeros((1, 1), dtype=torch.long, device=next(model.parameters()).device)
    try:
        mixed_forward(model, input_ids=ids, adapter_names=[name], use_cache=False)
    except Exception as exc:
        raise ValueError(f"the adapter cannot run in a mixed-adapter batch: {exc}") from exc


def mixed_forward(model, **inputs):
    """``model(**inputs)`` (a peft mixed-adapter batch: ``adapter_names``, one per row) under
    no_grad. peft passes the names to its layers by forward pre-hooks, which it does not remove
    when the forward raises (peft 0.21: its context manager has no finally); left in place they
    would hand those names to every later forward that passes none: they are removed here."""
    import torch

    try:
        with torch.no_grad():
            return model(**inputs)
    except BaseException:
        for module in model.modules():
            for key, hook in list(module._forward_pre_hooks.items()):
                if getattr(getattr(hook, "func", None), "__name__", "").endswith(
                    "_pre_forward_hook"
                ):
                    del module._forward_pre_hooks[key]
                    module._forward_pre_hooks_with_kwargs.pop(key, None)
        raise


def remove_adapter(model, name: str):
    """``model`` (a ``peft.PeftModel``) without LoRA adapter ``name``; after the last one, the
    bare HF model again (peft's ``unload`` puts back every layer it wrapped)."""
    if list(model.peft_config) == [name]:
        return model.unload()
    model.delete_adapter(name)
    return model


def _strip(base, name: str, unwrap: bool) -> None:
    """Undo what a failed injection of adapter ``name`` left in the HF model ``base``: peft
    wraps layer after layer, and one may fail after others were wrapped. Its weights go, and
    with ``unwrap`` (no other adapter was loaded) the wrapping layers too."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for key, module in list(base.named_modules()):
        if not isinstance(module, BaseTunerLayer):
            continue
        if unwrap:
            parent, _, child = key.rpartition(".")
            setattr(base.get_submodule(parent), child, module.get_base_layer())
        else:
            module.delete_adapter(name)
    if unwrap and hasattr(base, "peft_config"):  # peft marks the model once it wrapped it all
        del base.peft_config
