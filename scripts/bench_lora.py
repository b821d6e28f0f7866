"""LoRA against full fine-tuning on SmolLM2-135M-Instruct, side by side in one run.

Through Tandem's own trainer, weight sync and embedded engine, the way a run uses them:

1. train step: one update of a ``TorchTrainer`` on the same batch (``--samples`` samples of
   ``--prompt_len`` + ``--response_len`` tokens drawn from the vocabulary with a fixed seed),
   full fine-tuning against one rank-``--rank`` adapter; the median of ``--steps`` steps after
   a warm-up step;
2. weight sync: after each of those steps its ``WeightSync`` pushes to a running embedded
   engine: the full weights over the transport a run on one machine picks (shared), against the
   adapter that stepped (its tensors in the request, after an unload); bytes and median time;
3. resident memory of N agents (``--agents``, default 1,2,4,8): trainer side, a process holding
   one base with N adapters against one holding N full trainers, each after one update per
   agent (the optimizer state allocated); engine side, one engine serving N adapters against N
   engines of one full model each (started and measured, not multiplied). A full-model count
   that would not fit in the free memory is skipped, and said so.

Prints our figure, the baseline and the ratio for each; ``--publish lora_smollm2`` keeps them
(commit and machine included) as ``docs/results/bench/lora_smollm2/DATE-COMMIT.json``, its
``headline`` the full ÷ LoRA ratios. Run alone on the machine:
``.venv/bin/python scripts/bench_lora.py --publish lora_smollm2``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

MODEL = "smollm2"
EST_FULL_TRAINER_GB = 2.6  # SmolLM2 fp32: weights, gradients, AdamW moments, activations
EST_ENGINE_GB = 1.0


def _samples(n: int, prompt_len: int, response_len: int, vocab: int, agent: str, seed: int):
    """bench_train's random batch (fixed lengths), as ``agent``'s samples."""
    import dataclasses

    from bench_train import make_batch

    batch = make_batch(n, vocab, (prompt_len, prompt_len), (response_len, response_len), seed)
    return [dataclasses.replace(s, agent=agent) for s in batch]


def _trainer(path: str, adapters: list[str], rank: int, steps: int):
    from kernel.loss import LossConfig
    from kernel.train.optim import OptimConfig
    from kernel.train.settings import LoraConfig, TorchTrainerConfig
    from kernel.train.torch_backend import TorchTrainer

    lora = dict.fromkeys(adapters, LoraConfig(rank=rank)) if adapters else None
    optim = OptimConfig(lr=1e-4 if adapters else 1e-5)
    return TorchTrainer(path, optim, LossConfig(), TorchTrainerConfig(), steps + 1, adapters=lora)


def step_and_sync(args, path: str, tmp: Path) -> dict:
    """Parts 1 and 2: train step and weight sync, full against one adapter."""
    import torch

    from kernel.engine.client import EngineClient
    from kernel.engine.launch import free_port, launch_server
    from kernel.engine.settings import ServerConfig
    from kernel.sync.push import WeightSync
    from kernel.sync.settings import SyncConfig

    torch.set_num_threads(args.threads)
    server = ServerConfig(model=path, port=free_port(), num_threads=args.threads, enable_lora=True)
    proc = launch_server(server, tmp / "engine.log")
    out = {}
    try:
        proc.wait_healthy(300)
        for arm, adapters in (("full", []), ("lora", ["agent"])):
            trainer = _trainer(path, adapters, args.rank, args.steps)
            vocab = trainer.model.get_input_embeddings().num_embeddings
            batch = _samples(args.samples, args.prompt_len, args.response_len, vocab, "agent", 0)

            async def run(trainer=trainer, batch=batch, adapters=adapters) -> dict:
                client = EngineClient(proc.url)
                sync = WeightSync(SyncConfig(check_tokens=0), [client], tmp, adapters=adapters)
                steps, pushes, mb = [], [], 0.0
                try:
                    if adapters:  # the run's start: the engine gets the adapter (not timed)
                        await sync.push(trainer, 0, idle=True)
                    for i in range(args.steps + 1):
                        t0 = time.perf_counter()
                        trainer.train_step(batch)
                        t1 = time.perf_counter()
                        metrics = await sync.push(trainer, i + 1, idle=True)
                        if i:  # the first step warms up
                            steps.append(t1 - t0)
                            pushes.append(metrics["sync/time_s"])
                            mb = metrics["sync/mb"]
                finally:
                    await sync.aclose()
                    await client.aclose()
                return {
                    "step_s": statistics.median(steps),
                    "sync_s": statistics.median(pushes),
                    "sync_mb": mb,
                }

            out[arm] = asyncio.run(run())
            print(f"{arm}: {out[arm]}", flush=True)
            del trainer
    finally:
        proc.stop()
    return out


def _rss_gb(pid: int | None = None) -> float:
    return psutil.Process(pid).memory_info().rss / 2**30


def child_memory(arm: str, n: int, path: str, rank: int, threads: int) -> None:
    """One process holding N agents' trainers (``--_child``): prints its resident GiB."""
    import torch

    torch.set_num_threads(threads)
    names = [f"agent{i}" for i in range(n)]
    trainers = [_trainer(path, names, rank, 1)] if arm == "lora" else []
    trainers += [_trainer(path, [], rank, 1) for _ in range(n if arm == "full" else 0)]
    vocab = trainers[0].model.get_input_embeddings().num_embeddings
    for i, name in enumerate(names):  # one update of every agent: its optimizer state exists
        trainer = trainers[0] if arm == "lora" else trainers[i]
        trainer.train_step(_samples(4, 32, 32, vocab, name, i))
    print(json.dumps({"rss_gb": _rss_gb()}))


def trainer_memory(args, path: str) -> dict:
    out: dict[str, dict] = {"lora": {}, "full": {}}
    for n in args.agents:
        for arm in ("lora", "full"):
            need = EST_FULL_TRAINER_GB * (n if arm == "full" else 1)
            free = psutil.virtual_memory().available / 2**30
            if need > 0.8 * free:
                out[arm][n] = None
                print(f"trainers {arm} N={n}: not run (needs ~{need:.0f} GiB, {free:.0f} free)")
                continue
            cmd = [sys.executable, __file__, "--_child", f"{arm}:{n}", "--rank", str(args.rank)]
            cmd += ["--threads", str(args.threads), "--model", path]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            out[arm][n] = json.loads(done.stdout.strip().splitlines()[-1])["rss_gb"]
            print(f"trainers {arm} N={n}: {out[arm][n]:.2f} GiB", flush=True)
    return out


def engine_memory(args, path: str, tmp: Path) -> dict:
    """One engine with N adapters loaded, against N engines of one full model each."""
    from kernel.engine.client import EngineClient
    from kernel.engine.launch import free_port, launch_server
    from kernel.engine.settings import ServerConfig
    from kernel.engine.weights import encode_named_tensors

    donor = _trainer(path, ["donor"], args.rank, 1)  # the adapter each name loads
    config, tensors = donor.adapter("donor")
    payload = encode_named_tensors(tensors)
    del donor
    out: dict[str, dict] = {"lora": {}, "full": {}}
    for n in args.agents:
        server = ServerConfig(model=path, port=free_port(), num_threads=1, enable_lora=True)
        proc = launch_server(server, tmp / f"lora{n}.log")
        try:
            proc.wait_healthy(300)

            async def load(url=proc.url, n=n) -> None:
                async with EngineClient(url) as c:
                    for i in range(n):
                        await c.load_lora_adapter_from_tensors(f"agent{i}", config, payload)

            asyncio.run(load())
            out["lora"][n] = _rss_gb(proc.popen.pid)
        finally:
            proc.stop()
        free = psutil.virtual_memory().available / 2**30
        if EST_ENGINE_GB * n > 0.8 * free:
            out["full"][n] = None
            print(f"engines full N={n}: not run (needs ~{EST_ENGINE_GB * n:.0f} GiB)")
            continue
        procs = []
        try:
            for i in range(n):
                cfg = ServerConfig(model=path, port=free_port(), num_threads=1)
                procs.append(launch_server(cfg, tmp / f"full{n}_{i}.log"))
            for p in procs:
                p.wait_healthy(300)
            out["full"][n] = sum(_rss_gb(p.popen.pid) for p in procs)
        finally:
            for p in procs:
                p.stop()
        print(f"engines N={n}: lora {out['lora'][n]:.2f} GiB, full {out['full'][n]:.2f} GiB")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=MODEL, help="model name or folder")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank")
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up)")
    parser.add_argument("--samples", type=int, default=16, help="samples per step")
    parser.add_argument("--prompt_len", type=int, default=128)
    parser.add_argument("--response_len", type=int, default=128)
    parser.add_argument("--agents", type=str, default="1,2,4,8", help="N for the memory table")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the trainer")
    parser.add_argument("--_child", type=str, default=None, help=argparse.SUPPRESS)
    from provenance import add_output_flags, stamp, write_outputs  # scripts/ is on the path

    add_output_flags(parser)
    args = parser.parse_args(argv)
    if args._child:
        arm, n = args._child.split(":")
        return child_memory(arm, int(n), args.model, args.rank, args.threads)
    args.agents = [int(x) for x in args.agents.split(",")]
    from kernel.models import check_model, materialize_model

    with tempfile.TemporaryDirectory() as tmp:
        path = materialize_model(check_model(args.model), tmp)
        result = {**stamp(), "model": args.model, "rank": args.rank, "args": vars(args)}
        result["step_sync"] = step_and_sync(args, path, Path(tmp))
        result["trainer_memory_gb"] = trainer_memory(args, path)
        result["engine_memory_gb"] = engine_memory(args, path, Path(tmp))

    full, lora = result["step_sync"]["full"], result["step_sync"]["lora"]
    print(f"\n{args.model}, LoRA rank {args.rank} (ours) against full fine-tuning (baseline):")
    print(
        f"train step   lora {lora['step_s']:.2f} s   full {full['step_s']:.2f} s   "
        f"full / lora {full['step_s'] / lora['step_s']:.2f}"
    )
    print(
        f"sync bytes   lora {lora['sync_mb']:.2f} MiB   full {full['sync_mb']:.1f} MiB   "
        f"full / lora {full['sync_mb'] / lora['sync_mb']:.0f}"
    )
    print(
        f"sync time    lora {lora['sync_s']:.3f} s   full {full['sync_s']:.3f} s   "
        f"full / lora {full['sync_s'] / lora['sync_s']:.1f}"
    )
    for side in ("trainer_memory_gb", "engine_memory_gb"):
        for n in args.agents:
            mine, base = result[side]["lora"][n], result[side]["full"][n]
            ratio = f"{base / mine:.1f}" if base else "not run"
            base_s = f"{base:.2f}" if base else "not run"
            print(f"{side} N={n}   lora {mine:.2f} GiB   full {base_s} GiB   full / lora {ratio}")
    result["headline"] = {
        "sync bytes, full ÷ LoRA": full["sync_mb"] / lora["sync_mb"],
        "sync time, full ÷ LoRA": full["sync_s"] / lora["sync_s"],
        "train step time, full ÷ LoRA": full["step_s"] / lora["step_s"],
    }
    for side, label in (("trainer_memory_gb", "trainer"), ("engine_memory_gb", "engine")):
        for n in args.agents:
            mine, base = result[side]["lora"][n], result[side]["full"][n]
            if base:
                result["headline"][f"{label} memory of {n} agents, full ÷ LoRA"] = base / mine
    write_outputs(args, result)


if __name__ == "__main__":
    main()
