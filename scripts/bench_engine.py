"""Output tokens/s of the embedded server next to raw ``model.generate`` on the same batch.

For each concurrency C, the same C prompts (random ids, one length) are generated twice, in
the same run and on the same machine: once by ``model.generate`` in this process (one padded
batch, the HF baseline), once by C concurrent /generate requests to an embedded server started
as a child process (HTTP, JSON, continuous batching and all). Every request makes exactly
``max_new_tokens`` tokens (``ignore_eos`` / ``min_new_tokens``), so tokens/s compare directly.

    .venv/bin/python scripts/bench_engine.py                      # tiny model, C = 1, 8, 32
    .venv/bin/python scripts/bench_engine.py --model smollm2 --max_new_tokens 32
    .venv/bin/python scripts/bench_engine.py --concurrency [32] --group 8   # GRPO groups

Each temperature is measured separately: at 1.0 both sides sample (HF with torch.multinomial,
the server by inverting the CDF, much cheaper on CPU); at 0.0 both take the argmax, which
isolates the cost of serving from the cost of sampling.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclass
class BenchConfig:
    """What to measure."""

    model: str = "tiny"
    """'tiny' (the 2-layer test model, built in a temp dir), 'smollm2' or an HF folder."""
    concurrency: list[int] = field(default_factory=lambda: [1, 8, 32])
    """Requests in flight at once (= the batch size of the raw baseline)."""
    prompt_len: int = 32
    """Prompt tokens per request."""
    max_new_tokens: int = 64
    """Output tokens per request (always all of them)."""
    temperatures: list[float] = field(default_factory=lambda: [1.0, 0.0])
    """Sampling temperatures to measure (0 = greedy)."""
    repeats: int = 2
    """Timed runs per cell; the best is reported (after one warm-up)."""
    num_threads: int | None = None
    """torch threads of both the baseline and the server (default: torch's choice)."""
    group: int = 1
    """Samples per prompt: C / group distinct prompts, each sampled ``group`` times (raw:
    ``num_return_sequences``; server: one request per prompt with ``sampling_params.n``, the
    way Tandem sends a GRPO group). 1: C distinct prompts, one request each."""
    seed: int = 0
    """Seed of the prompts."""
    onednn_linear: bool = True
    """The server's Linear layers run through oneDNN (its default); false: MKL, as the raw
    baseline does."""

    def validate(self) -> BenchConfig:
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError(
                f"concurrency must be a non-empty list of ints >= 1, got {self.concurrency}"
            )
        if self.prompt_len < 1 or self.max_new_tokens < 1:
            raise ValueError("prompt_len and max_new_tokens must be >= 1")
        if min(self.temperatures, default=-1) < 0:
            raise ValueError(f"temperatures must be >= 0, got {self.temperatures}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.group < 1 or any(c % self.group for c in self.concurrency):
            raise ValueError(
                f"group must be >= 1 and divide every concurrency, got group={self.group} "
                f"and concurrency={self.concurrency}"
            )
        return self


def raw_generate(model, prompts, new_tokens: int, temperature: float, group: int = 1) -> float:
    """Seconds for one model.generate over all prompts (same length: no padding), ``group``
    sequences each."""
    import torch

    ids = torch.tensor(prompts)  # (C / group, L)
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    kwargs = sampling if temperature > 0 else {"do_sample": False}
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=model.config.eos_token_id,
            num_return_sequences=group,
            **kwargs,
        )
    elapsed = time.perf_counter() - start
    assert out.shape == (ids.shape[0] * group, ids.shape[1] + new_tokens)
    return elapsed


async def served(url: str, prompts, new_tokens: int, temperature: float, group: int = 1) -> float:
    """Seconds for all prompts as concurrent /generate requests (``n = group`` each)."""
    from kernel.engine.client import EngineClient

    params = {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": temperature}
    async with EngineClient(url) as client:
        start = time.perf_counter()
        if group == 1:
            results = await asyncio.gather(*(client.generate(p, params) for p in prompts))
        else:
            params["n"] = group
            batches = await asyncio.gather(*(client.generate_batch([p], params) for p in prompts))
            results = [r for batch in batches for r in batch]
        elapsed = time.perf_counter() - start
    assert len(results) == len(prompts) * group
    assert all(len(r.output_ids) == new_tokens for r in results)
    return elapsed


def main(argv: list[str] | None = None) -> None:
    import torch
    from jsonargparse import ArgumentParser, set_parsing_settings

    from kernel.engine.launch import free_port, launch_server
    from kernel.engine.settings import ServerConfig
    from kernel.engine.weights import load_model

    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = ArgumentParser(prog="bench_engine.py", description=__doc__)
    parser.add_class_arguments(BenchConfig, None)
    ns = parser.parse_args(argv)
    cfg = BenchConfig(**{f.name: ns[f.name] for f in dataclasses.fields(BenchConfig)}).validate()
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)

    tmp = tempfile.TemporaryDirectory()
    model_path = cfg.model
    if cfg.model == "tiny":
        from kernel.models import build_tiny_model

        model_path = str(build_tiny_model(Path(tmp.name) / "tiny"))
    model = load_model(model_path)
    vocab = model.get_input_embeddings().num_embeddings
    gen = torch.Generator().manual_seed(cfg.seed)

    biggest = max(cfg.concurrency)
    server_cfg = ServerConfig(
        model=model_path,
        port=free_port(),
        max_batch_size=biggest,
        onednn_linear=cfg.onednn_linear,
    )
    server_cfg.num_threads = cfg.num_threads or torch.get_num_threads()
    server = launch_server(server_cfg, Path(tmp.name) / "server.log").wait_healthy(300)
    print(
        f"model {cfg.model}, prompt {cfg.prompt_len} tokens, {cfg.max_new_tokens} new tokens, "
        f"{cfg.group} sample(s) per prompt"
    )
    print(f"torch threads {server_cfg.num_threads}, best of {cfg.repeats} runs after a warm-up")
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"{'temp':>5} {'conc':>5} {'raw tok/s':>10} {'server tok/s':>13} {'ratio':>6}")
    try:
        for temperature in cfg.temperatures:
            for c in cfg.concurrency:
                shape = (c // cfg.group, cfg.prompt_len)
                prompts = torch.randint(3, vocab, shape, generator=gen).tolist()
                args = (prompts, cfg.max_new_tokens, temperature, cfg.group)
                raw_generate(model, *args)  # warm-up
                asyncio.run(served(server.url, *args))
                raws, srvs = [], []
                for _ in range(cfg.repeats):  # interleaved, so both see the same machine load
                    raws.append(raw_generate(model, *args))
                    srvs.append(asyncio.run(served(server.url, *args)))
                raw, srv = min(raws), min(srvs)
                raw_tps, srv_tps = c * cfg.max_new_tokens / raw, c * cfg.max_new_tokens / srv
                print(
                    f"{temperature:>5.1f} {c:>5} {raw_tps:>10.0f} {srv_tps:>13.0f} "
                    f"{srv_tps / raw_tps:>5.2f}x",
                    flush=True,
                )
    finally:
        server.stop()
        tmp.cleanup()


if __name__ == "__main__":
    main(sys.argv[1:])
