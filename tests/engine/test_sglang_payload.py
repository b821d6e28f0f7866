"""The ``flattened_bucket`` payload Tandem sends (``FlatBucketWriter``) decoded by SGLang's own
code: the unpickler allowlist of ``sglang.srt.utils.common.SafeUnpickler`` and the
``FlattenedTensorBucket`` class of ``sglang.srt.weight_sync.tensor_bucket``, read from the
SGLang 0.5.23 wheel (scripts/setup.sh downloads it to .venv/wheels without installing it: the
package needs a GPU runtime to import). Every tensor must come back bit for bit, in SGLang's
two code paths (the TP worker's bucket, and the weight updater that rebuilds the metadata)."""

from __future__ import annotations

import ast
import base64
import io
import pickle
import sys
import types
import zipfile
from pathlib import Path

import pytest
import torch

from kernel.engine.weights import FlatBucketWriter, _file_system_sharing

ROOT = Path(__file__).resolve().parents[2]
WHEELS = sorted((ROOT / ".venv" / "wheels").glob("sglang-0.5.23-*.whl"))
BUCKET = "sglang.srt.weight_sync.tensor_bucket"


@pytest.fixture(scope="module")
def sglang():
    """(SafeUnpickler's allowlist, the tensor_bucket module) from the SGLang wheel."""
    if not WHEELS:
        pytest.skip("no SGLang 0.5.23 wheel in .venv/wheels (scripts/setup.sh dev fetches it)")
    with zipfile.ZipFile(WHEELS[0]) as whl:
        bucket_src = whl.read("sglang/srt/weight_sync/tensor_bucket.py").decode()
        common_src = whl.read("sglang/srt/utils/common.py").decode()
    allowed = None
    for node in ast.walk(ast.parse(common_src)):
        if isinstance(node, ast.ClassDef) and node.name == "SafeUnpickler":
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and stmt.targets[0].id == "ALLOWED_GLOBALS":
                    allowed = ast.literal_eval(stmt.value)
    assert allowed, "SafeUnpickler.ALLOWED_GLOBALS not found in the wheel"
    module = types.ModuleType(BUCKET)
    sys.modules[BUCKET] = module  # pickles name the class by this module path
    exec(compile(bucket_src, f"{WHEELS[0].name}/{BUCKET}", "exec"), module.__dict__)
    yield allowed, module
    del sys.modules[BUCKET]


def _sglang_deserialize(data: str, allowed: set):
    """SGLang's MultiprocessingSerializer.deserialize: base64, then its SafeUnpickler (the
    allowlist check of its find_class, then pickle's own)."""

    class SafeUnpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) in allowed:
                return super().find_class(module, name)
            raise RuntimeError(f"Blocked unsafe global ({module}.{name})")

    return SafeUnpickler(io.BytesIO(base64.b64decode(data, validate=True))).load()


def test_sglang_decodes_tandems_flattened_bucket_bit_for_bit(sglang):
    allowed, tensor_bucket = sglang
    torch.manual_seed(0)
    named = [
        ("model.embed_tokens.weight", torch.randn(11, 8)),
        ("model.layers.0.mlp.up_proj.weight", torch.randn(6, 8).to(torch.bfloat16)),
        ("model.norm.weight", torch.randn(8).half()),
        ("lm_head.bias", torch.arange(3, dtype=torch.int64)),
    ]
    writer = FlatBucketWriter("cpu")
    payload = writer.payload(named)
    with _file_system_sharing():  # the engine's side reads the shared-memory handle
        data = _sglang_deserialize(payload, allowed)
    # the TP worker's path: the dict's tensor and metadata straight into the bucket
    bucket = tensor_bucket.FlattenedTensorBucket(
        flattened_tensor=data["flattened_tensor"], metadata=data["metadata"]
    )
    # the weight updater's path: each metadata entry rebuilt as SGLang's own dataclass
    rebuilt = tensor_bucket.FlattenedTensorBucket(
        flattened_tensor=data["flattened_tensor"],
        metadata=[
            tensor_bucket.FlattenedTensorMetadata(
                m.name, m.shape, m.dtype, m.start_idx, m.end_idx, m.numel
            )
            for m in data["metadata"]
        ],
    )
    for got in (bucket.reconstruct_tensors(), rebuilt.reconstruct_tensors()):
        assert [name for name, _ in got] == [name for name, _ in named]
        for (_, t), (_, back) in zip(named, got, strict=True):
            assert back.dtype == t.dtype and back.shape == t.shape
            assert torch.equal(back.view(torch.uint8), t.view(torch.uint8))
    writer.close()


def test_sglangs_allowlist_refuses_what_tandems_own_reader_refuses(sglang):
    """A payload naming another callable is refused by SGLang's allowlist too."""
    allowed, _ = sglang
    evil = base64.b64encode(pickle.dumps(print)).decode()
    with pytest.raises(RuntimeError, match="Blocked unsafe global"):
        _sglang_deserialize(evil, allowed)
