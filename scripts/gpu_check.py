"""The GPU path in one command: each check runs for real on ``--device`` and a table sums up.

Checks (tiny models built from configs: no model hub, no internet):

1. ``torch``: ``kernel train --preset toy`` for a few steps with the torch trainer and the
   embedded engine on the device (bf16 autocast on CUDA), weight sync over SGLang's
   ``flattened_bucket`` payload (CUDA IPC on a GPU, shared memory on CPU);
2. ``megatron``: the same run with the Megatron-core trainer;
3. ``logprob``: the engine's logprobs against the training forward on the device, the largest
   post-sync check gap of run 1 (``sync/check_logprob_diff``);
4. ``payload``: a ``flattened_bucket`` payload written on the device (``FlatBucketWriter``)
   and read back in another process (``decode_flattened_bucket``), every tensor compared;
5. ``distributed``: run 1 with ``sync.transport distributed``: a process-group broadcast from
   the trainer to the engine (gloo on CPU; NCCL on CUDA with the engine on a second GPU, since
   NCCL refuses two ranks on one GPU: with a single GPU, gloo from the trainer's GPU);
6. ``release``: the engine's ``release_memory_occupation`` and ``resume_memory_occupation``
   (colocated training) on a 2-layer Qwen2.5-0.5B-shaped model in bf16 on the device: the
   weights' bytes go back to the device (``torch.cuda.mem_get_info``) and are taken again,
   generation is refused meanwhile;
7. ``sync_bench``: ``scripts/bench_weight_sync.py --device`` on a 2-layer Qwen2.5-0.5B-shaped
   model: conversion and push time over a copy of the same bytes on the device, per transport;
8. ``prefix_cache``: the engine's scheduler on the device (a tiny model in fp32) plays three
   3-turn conversations with its prefix cache on and off: greedy replies must be the same,
   logprobs within 1e-4, and the later turns served from the cache;
9. ``lora``: multi-LoRA: ``--preset toy_duo`` with both agents on one model, an adapter each
   (``--lora.rank 4``), trained on the device and served by one engine under the agents' names;
   run twice, the adapters pushed as tensors (``shared``) and as PEFT folders loaded with
   ``/load_lora_adapter`` (``disk``, real SGLang's way): PASS when every step's engine-trainer
   logprob gap of each adapter and every post-sync check stay under 0.1;
10. ``limit``: ``scripts/bench_limit.py`` on a SmolLM2-135M-shaped model (bf16 on CUDA): the
   trainer's FLOP/s as a share of the device's measured matmul peak, and decode's bytes/s at
   batch 1 as a share of its copy bandwidth (measured, not judged: PASS when it ran).

Each check prints PASS, FAIL or SKIP (megatron-core not installed) and its figure; the exit
status is 1 when any failed; a failed check also prints the end of its output. ``--out DIR``
writes the table (``gpu_check.md``) and the results with the machine and versions
(``gpu_check.json``) there. ``--device cpu`` runs the same checks on CPU (what CI runs, so
this script cannot rot); ``scripts/gpu_check.sh`` is the one command on a GPU machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # scripts.* (the weight-sync bench's model) as from the root
from scripts import provenance  # noqa: E402

STEPS = 3


def _run(cmd: list[str], timeout: float) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s", time.perf_counter() - t0
    return p.returncode, (p.stdout + p.stderr)[-3000:], time.perf_counter() - t0


def _rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _train(
    device: str, out: Path, *flags: str, timeout: float, preset: str = "toy"
) -> tuple[bool, str, list[dict]]:
    cmd = [sys.executable, "-m", "kernel", "train", "--preset", preset, "--output_dir", str(out)]
    cmd += ["--num_steps", str(STEPS), "--trainer.device", device, "--engine.device", device]
    cmd += ["--sync.transport", "shared", "--eval.every", "0"]
    if device.startswith("cuda"):
        cmd += ["--optim.dtype", "bfloat16"]
    rc, tail, seconds = _run([*cmd, *flags], timeout)
    rows = _rows(out)
    if rc != 0 or len(rows) != STEPS:
        print(tail, flush=True)
        return False, f"exit {rc}, {len(rows)} of {STEPS} steps: {tail[-400:]}", rows
    return True, f"{STEPS} steps in {seconds:.0f} s, reward {rows[-1]['reward']:.3f}", rows


def _digest(t) -> str:
    """sha256 of a tensor's bytes (any dtype, any device)."""
    import hashlib

    import torch

    raw = t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy()
    return hashlib.sha256(raw.tobytes()).hexdigest()


def check_payload(device: str) -> tuple[bool, str]:
    """Write a flattened_bucket payload on ``device``, read it in a child process."""
    import torch

    from kernel.engine.weights import FlatBucketWriter

    torch.manual_seed(0)
    bucket = {
        "a.weight": torch.randn(64, 32, device=device),
        "b.bias": torch.randn(7, device=device).to(torch.bfloat16),
        "c.count": torch.arange(5, device=device),
    }
    writer = FlatBucketWriter(device)
    payload = writer.payload(bucket)
    sent = {k: [_digest(v), str(v.dtype), list(v.shape)] for k, v in bucket.items()}
    child = (
        "import json, sys\n"
        "from kernel.engine.weights import decode_flattened_bucket\n"
        "from scripts.gpu_check import _digest\n"
        "got = dict(decode_flattened_bucket(sys.stdin.read()))\n"
        "print(json.dumps({k: [_digest(v), str(v.dtype), list(v.shape), str(v.device)]"
        " for k, v in got.items()}))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", child], input=payload, capture_output=True, text=True, cwd=ROOT
    )
    writer.close()
    if p.returncode != 0:
        return False, p.stderr[-400:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    where = "?"
    for name in bucket:
        *back, where = got.get(name, [None] * 4)
        if back != sent[name]:
            return False, f"{name}: sent {sent[name]}, read back {back}"
    return True, f"{len(bucket)} tensors read back bit for bit in another process (on {where})"


def check_release(device: str) -> tuple[bool, str]:
    """Release the engine's weights, measure the device's free memory, resume them."""
    import torch
    from transformers import AutoModelForCausalLM

    from kernel.engine.protocol import GenerateRequest
    from kernel.engine.settings import ServerConfig
    from kernel.engine.state import MemoryReleased, ServerState
    from kernel.models import char_tokenizer
    from scripts.bench_weight_sync import qwen25_05b_config

    config = qwen25_05b_config(2)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(device).eval()
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    shapes = {n: p.shape for n, p in model.named_parameters()}
    cuda = device.startswith("cuda")

    def free() -> int:
        return torch.cuda.mem_get_info(device)[0] if cuda else 0

    state = ServerState(ServerConfig(device=device, dtype="bfloat16"), model, char_tokenizer())
    try:
        before = free()
        state.release_memory(None)
        released = free()
        try:
            state.build_requests(GenerateRequest(text="a"))
            return False, "generation was accepted while the weights were released"
        except MemoryReleased:
            pass
        state.resume_memory(None)
        resumed = free()
    finally:
        state.close()
    back = {n: p.shape for n, p in model.named_parameters()}
    if back != shapes:
        return False, "resumed parameters differ in shape from the released ones"
    if not cuda:
        return True, f"{nbytes / 2**20:.0f} MiB released and resumed (no device memory on CPU)"
    given, taken = (released - before) / nbytes, (released - resumed) / nbytes
    figure = (
        f"{nbytes / 2**20:.0f} MiB of weights: {given:.0%} given back to the device on release, "
        f"{taken:.0%} taken again on resume"
    )
    return given > 0.9 and taken > 0.9, figure


def check_sync_bench(device: str, timeout: float) -> tuple[bool, str]:
    cmd = [sys.executable, "scripts/bench_weight_sync.py", "--layers", "2", "--dtype", "bfloat16"]
    cmd += ["--device", device]
    rc, tail, _ = _run(cmd, timeout)
    if rc != 0:
        print(tail, flush=True)
        return False, f"exit {rc}: {tail[-400:]}"
    lines = tail.splitlines()
    print("\n".join(line for line in lines if "GB/s" in line or line.startswith("layers=")))
    pushes = [line.split()[1] for line in lines if line.startswith("push (")]
    ratios = [line.split("=")[-1].split("copy")[0].strip() for line in lines if "x copy" in line]
    figure = ", ".join(f"{t} {r} copy" for t, r in zip(pushes, ratios, strict=False))
    return True, f"convert + push over a copy of the same bytes on {device}: {figure}"


def check_prefix_cache(device: str) -> tuple[bool, str]:
    """Greedy conversations on the engine's scheduler with the prefix cache on and off."""
    import torch

    from kernel.engine.protocol import SamplingParams
    from kernel.engine.scheduler import Request, Scheduler
    from kernel.models import build_tiny_model, load_causal_lm, load_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_tiny_model(tmp, "qwen2", "char", hidden_size=128, num_layers=4))
        model = load_causal_lm(path, "float32", device).eval()
        tokenizer = load_tokenizer(path)
    params = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
    gen = torch.Generator().manual_seed(0)
    replies = {}
    for cache_mb in (64, 0):
        s = Scheduler(model, tokenizer, max_batch_size=8, context_length=512,
                      prefix_cache_bytes=cache_mb * 2**20)  # fmt: skip
        s.start()
        gen.manual_seed(0)
        prompts = [torch.randint(3, 100, (n,), generator=gen).tolist() for n in (7, 19, 30)]
        got = []
        try:
            for _ in range(3):
                reqs = [Request(rid=str(i), input_ids=p, params=params, return_logprob=True)
                        for i, p in enumerate(prompts)]  # fmt: skip
                s.submit(reqs)
                turn = [r.future.result(timeout=120) for r in reqs]
                got.append(turn)
                user = torch.randint(3, 100, (5,), generator=gen).tolist()
                prompts = [p + t["output_ids"] + user for p, t in zip(prompts, turn, strict=True)]
        finally:
            s.shutdown()
        replies[cache_mb] = (got, dict(s.stats))
    (on, stats_on), (off, _) = replies[64], replies[0]
    gap = 0.0
    for turn_on, turn_off in zip(on, off, strict=True):
        for a, b in zip(turn_on, turn_off, strict=True):
            if a["output_ids"] != b["output_ids"]:
                return False, "a greedy reply differs with the prefix cache on"
            la = [x[0] for x in a["meta_info"]["output_token_logprobs"]]
            lb = [x[0] for x in b["meta_info"]["output_token_logprobs"]]
            gap = max(gap, *(abs(x - y) for x, y in zip(la, lb, strict=True)))
    cached, prefilled = stats_on["num_cached_tokens"], stats_on["num_prefill_tokens"]
    figure = (
        f"{cached} of {cached + prefilled} prompt tokens from the cache; largest logprob gap "
        f"on vs off {gap:.1e}"
    )
    return gap < 1e-4 and cached > 0, figure


def check_lora(device: str, out: Path, timeout: float) -> tuple[bool, str]:
    agents = ("doctor", "patient")
    lora = ["--agents", '["doctor", "patient"]', "--lora.rank", "4", "--optim.lr", "0.01"]
    lora += ["--sync.check_every", "1"]
    figures = []
    for transport in ("shared", "disk"):
        ok, figure, rows = _train(
            device, out / f"lora_{transport}", *lora, "--sync.transport", transport,
            timeout=timeout, preset="toy_duo",
        )  # fmt: skip
        if not ok:
            return False, f"{transport}: {figure}"
        gaps = [r[f"train/{a}/logprob_diff"] for r in rows for a in agents]
        checks = [r["sync/check_logprob_diff"] for r in rows if "sync/check_logprob_diff" in r]
        if len(gaps) != len(agents) * STEPS or len(checks) != STEPS - 1:
            return False, f"{transport}: {len(gaps)} adapter gaps, {len(checks)} post-sync checks"
        if max(gaps + checks) >= 0.1:
            return False, f"{transport}: gap {max(gaps):.2e}, post-sync {max(checks):.2e}"
        figures.append(f"{transport} {figure.split(',')[0]}, gaps <= {max(gaps + checks):.1e}")
    return True, "2 adapters, one engine: " + "; ".join(figures)


def check_limit(device: str, timeout: float, out: Path | None) -> tuple[bool, str]:
    """scripts/bench_limit.py on a SmolLM2-shaped model (small sizes on CPU, for CI)."""
    cmd = [sys.executable, "scripts/bench_limit.py", "--model", "smollm2-shape", "--device", device]
    if device.startswith("cuda"):
        cmd += ["--dtype", "bfloat16", "--samples", "16", "--seq-len", "1024", "--steps", "5"]
        cmd += ["--budget", "8192", "--profile"]
    else:
        cmd += ["--samples", "2", "--seq-len", "64", "--prompt-len", "16", "--steps", "1"]
        cmd += ["--gemm", "512", "--copy-mib", "32", "--decode-prompt", "16"]
        cmd += ["--decode-tokens", "4"]
    with tempfile.TemporaryDirectory() as tmp:
        path = (out or Path(tmp)) / "limit.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        rc, tail, _ = _run([*cmd, "--json", str(path)], timeout)
        print(tail, flush=True)
        if rc != 0:
            return False, f"exit {rc}: {tail[-400:]}"
        r = json.loads(path.read_text())
    peak, train, decode = max(r["matmul_flop_s"].values()), r["train"], r["decode"]
    figure = (
        f"trainer {train['flop_s'] / 1e9:.0f} GFLOP/s = {r['train_fraction_of_peak']:.0%} of "
        f"the measured matmul peak {peak / 1e9:.0f} GFLOP/s; decode at batch 1 "
        f"{decode['bytes_s'] / 1e9:.1f} GB/s = {r['decode_fraction_of_bandwidth']:.0%} of the "
        f"copy bandwidth {r['copy_bytes_s'] / 1e9:.0f} GB/s "
        f"({1e3 * decode['step_s']:.1f} ms a token)"
    )
    return True, figure


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    p.add_argument("--timeout", type=float, default=600, help="seconds per check")
    p.add_argument("--skip", default="", help="comma-separated checks to leave out")
    p.add_argument("--out", type=Path, help="folder for gpu_check.md and gpu_check.json")
    args = p.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False)")
        return 2
    machine = provenance.machine(args.device)
    print(f"gpu_check on {machine}, torch {torch.__version__}, Python {platform.python_version()}")
    results: list[tuple[str, str, str]] = []

    def record(name: str, ok: bool | None, figure: str) -> None:
        results.append((name, {True: "PASS", False: "FAIL", None: "SKIP"}[ok], figure))
        print(f"[{results[-1][1]}] {name}: {figure}", flush=True)

    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        out = Path(tmp)
        rows: list[dict] = []
        if "torch" not in skip:
            ok, figure, rows = _train(args.device, out / "torch", timeout=args.timeout)
            record("torch", ok, figure)
        if "megatron" not in skip:
            if importlib.util.find_spec("megatron.core") is None:
                record("megatron", None, "megatron-core is not installed")
            else:
                agents = '[{"name": "default", "backend": "megatron"}]'
                ok, figure, _ = _train(
                    args.device, out / "megatron", "--agents", agents, timeout=args.timeout
                )
                record("megatron", ok, figure)
        if "logprob" not in skip:
            gaps = [r["sync/check_logprob_diff"] for r in rows if "sync/check_logprob_diff" in r]
            if gaps:
                record("logprob", max(gaps) < 0.1, f"largest engine-trainer gap {max(gaps):.2e}")
            else:
                record("logprob", False, "run 1 logged no post-sync check")
        if "payload" not in skip:
            record("payload", *check_payload(args.device))
        if "distributed" not in skip:
            flags, over = ["--sync.transport", "distributed"], ""
            if args.device.startswith("cuda"):
                # NCCL refuses two ranks on one GPU ("Duplicate GPU detected") and the engine
                # is a process of its own: a second GPU takes the engine, else gloo carries it.
                if torch.cuda.device_count() > 1:
                    flags, over = [*flags, "--engine.device", "cuda:1"], ", NCCL to cuda:1"
                else:
                    flags, over = [*flags, "--sync.backend", "gloo"], ", gloo (one GPU)"
            ok, figure, _ = _train(args.device, out / "distributed", *flags, timeout=args.timeout)
            record("distributed", ok, figure + over)
        if "release" not in skip:
            record("release", *check_release(args.device))
        if "sync_bench" not in skip:
            record("sync_bench", *check_sync_bench(args.device, args.timeout))
        if "prefix_cache" not in skip:
            record("prefix_cache", *check_prefix_cache(args.device))
        if "lora" not in skip:
            record("lora", *check_lora(args.device, out, args.timeout))
        if "limit" not in skip:
            record("limit", *check_limit(args.device, args.timeout, args.out))

    table = "| check | result | figure |\n|---|---|---|\n" + "".join(
        f"| {n} | {v} | {f.replace('|', '/')} |\n" for n, v, f in results
    )
    print("\n" + table, end="")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.md").write_text(table)
        summary = {
            "device": args.device,
            "machine": machine,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "commit": provenance.commit(),
            "results": [{"check": n, "result": v, "figure": f} for n, v, f in results],
        }
        (args.out / "gpu_check.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 1 if any(v == "FAIL" for _, v, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
