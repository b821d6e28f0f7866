"""Benchmark weight sync from a Megatron model into an embedded server, next to a plain copy.

A Megatron GPTModel with Qwen2.5-0.5B shapes (hidden 896, 24 layers, 14 heads, 2 KV heads,
ffn 4864, vocab 151936, tied embeddings) and random weights is built on CPU and moved to
``--device`` (the engine serves there too). In one run we time:

1. copy: a plain copy of the bytes that get pushed (every parameter cast to the push dtype and
   concatenated with ``torch.cat``): the floor any sync has to pay once;
2. convert: Megatron -> HF names and layouts (``export_hf_weights``: TP gather +
   ``megatron_to_hf``) cast to the push dtype and grouped into buckets;
3. push: ``WeightSync`` of those buckets into a running embedded server, with the tensor
   transport (HTTP payload), the shared one (SGLang's ``flattened_bucket``: shared memory on
   CPU, CUDA IPC on a GPU) and the distributed one (a gloo broadcast: NCCL refuses two ranks on
   one GPU).

and print GB/s of each and the ratio (convert + push) / copy per transport (target: <= 2).
The full model needs ~2 GB (fp32) per copy and the server ~1 GB more; ``--layers`` shrinks it
(the 136 M-entry embedding stays, so a 2-layer run still moves most of the bytes).

Run: ``.venv/bin/python scripts/bench_weight_sync.py [--layers 24] [--bucket_mb 64]
[--device cuda]``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import torch

ANCHORS = (
    "Published anchors (context, other hardware): SGLang's bucketed distributed update moved "
    "Qwen3-30B in 2.5 s; slime's tensor path took ~16 s for a 30B MoE against a ~1 s bound."
)
# tensor: base64 safetensors in an HTTP body; shared: a flattened_bucket buffer shared on this
# machine; distributed: a gloo broadcast per bucket.
TRANSPORTS = ("tensor", "shared", "distributed")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class _Pushed:
    """What WeightSync asks of a trainer: the converted tensors, in order, on ``device``."""

    def __init__(self, named: list[tuple[str, torch.Tensor]], device: str):
        self.named, self.device = named, torch.device(device)

    def named_parameters_for_sync(self):
        return iter(self.named)

    def weight_broadcaster(self):
        from kernel.sync.push import LocalBroadcaster

        return LocalBroadcaster(self)


def qwen25_05b_config(layers: int):
    from transformers import AutoConfig

    return AutoConfig.for_model(
        "qwen2",
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    )


def _gbps(nbytes: int, seconds: float) -> str:
    return f"{seconds:7.3f} s  {nbytes / seconds / 1e9:6.2f} GB/s"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24, help="decoder layers (24 = 0.5B)")
    parser.add_argument("--bucket_mb", type=float, default=64.0, help="sync bucket size, MiB")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES), help="push dtype")
    parser.add_argument("--num_threads", type=int, default=None, help="server torch threads")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (model and engine)")
    args = parser.parse_args(argv)
    if args.layers < 1:
        raise ValueError(f"--layers must be >= 1, got {args.layers}")
    dtype = DTYPES[args.dtype]

    def sync_device() -> None:  # CUDA work is asynchronous: wait for it before reading a clock
        if args.device.startswith("cuda"):
            torch.cuda.synchronize(args.device)

    from kernel.engine.client import EngineClient
    from kernel.engine.launch import free_port, launch_server
    from kernel.engine.settings import ServerConfig
    from kernel.models import char_tokenizer
    from kernel.sync.buckets import iter_buckets
    from kernel.sync.push import WeightSync
    from kernel.sync.settings import SyncConfig
    from kernel.train.megatron_model import (
        MegatronModelConfig,
        build_gpt_model,
        export_hf_weights,
        megatron_parallel,
    )

    print(ANCHORS)
    hf_config = qwen25_05b_config(args.layers)
    with megatron_parallel(), tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model, arch = build_gpt_model(hf_config, MegatronModelConfig())
        model.to(args.device)
        params = [p.detach() for p in model.parameters()]
        n = sum(p.numel() for p in params)
        print(f"built Megatron model: {n / 1e6:.1f} M params in {time.perf_counter() - t0:.1f} s")

        # The server needs a checkpoint of these shapes to start from (not timed).
        ckpt = Path(tmp) / "ckpt"
        ckpt.mkdir()
        from safetensors.torch import save_file

        state = {k: v.to(dtype).contiguous() for k, v in export_hf_weights(model, arch).items()}
        save_file(state, ckpt / "model.safetensors", metadata={"format": "pt"})
        del state
        hf_config.save_pretrained(ckpt)
        char_tokenizer().save_pretrained(ckpt)
        server = ServerConfig(
            model=str(ckpt),
            port=free_port(),
            dtype=args.dtype,
            device=args.device,
            num_threads=args.num_threads,
        )
        proc = launch_server(server, Path(tmp) / "engine.log")
        try:
            proc.wait_healthy(600)

            t0 = time.perf_counter()
            flat = torch.cat([p.flatten().to(dtype) for p in params]).clone()  # (n,)
            sync_device()
            t_copy = time.perf_counter() - t0
            nbytes = flat.numel() * flat.element_size()
            del flat

            t0 = time.perf_counter()
            named = [(k, v.to(dtype)) for k, v in export_hf_weights(model, arch).items()]
            buckets = list(iter_buckets(named, int(args.bucket_mb * 2**20)))
            sync_device()
            t_convert = time.perf_counter() - t0

            async def push(transport: str) -> float:
                client = EngineClient(proc.url)
                cfg = SyncConfig(transport=transport, bucket_mb=args.bucket_mb, backend="gloo")
                sync = WeightSync(cfg, [client], Path(tmp))
                try:
                    t = time.perf_counter()
                    await sync.push(_Pushed(named, args.device), version=1)
                    return time.perf_counter() - t
                finally:
                    await sync.aclose()
                    await client.aclose()

            t_push = {t: asyncio.run(push(t)) for t in TRANSPORTS}
        finally:
            proc.stop()

    pushed = sum(t.numel() * t.element_size() for _, t in named)  # tied: no lm_head copy
    print(
        f"layers={args.layers} dtype={args.dtype} device={args.device} buckets={len(buckets)} "
        f"({args.bucket_mb} MiB) bytes={pushed / 1e9:.3f} GB (copy {nbytes / 1e9:.3f} GB)"
    )
    print(f"copy               {_gbps(nbytes, t_copy)}")
    print(f"convert            {_gbps(pushed, t_convert)}")
    for transport, seconds in t_push.items():
        total = t_convert + seconds
        print(f"push ({transport})".ljust(19) + _gbps(pushed, seconds))
        print(
            f"convert + push     {_gbps(pushed, total)}  = {total / t_copy:.1f}x copy (target 2x)"
        )


if __name__ == "__main__":
    main()
