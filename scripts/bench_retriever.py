"""Queries/s and p50/p99 latency of the retriever server next to calling the index in-process.

A synthetic corpus of ``--docs`` documents (default 100k) is indexed once; then, for each
concurrency C, ``--requests`` single-query POST /retrieve requests are sent with C in flight at
once to a server started as a child process (``python -m retriever serve``). The same queries
are also run in this process with no HTTP at all: embed (real model) + faiss search, one query
at a time, and as batches of C queries. The ratio server / in-process is printed.

Corpus side: by default random unit vectors stand in for the document embeddings (embedding
100k documents with MiniLM on 2 CPU cores takes many minutes, and search cost does not depend
on where the vectors came from); ``--corpus_vectors model`` embeds the synthetic texts with the
real model instead and caches them under /tmp. The query side always goes through the real
model. The output says which was used.

    .venv/bin/python scripts/bench_retriever.py                  # 100k docs, C = 1, 16, 64
    .venv/bin/python scripts/bench_retriever.py --docs 10000 --requests 128
    .venv/bin/python scripts/bench_retriever.py --concurrency [64] --requests 1280 --rounds 6

``--rounds N`` sends each concurrency's requests N times and prints the server's resident memory
(VmRSS) after each round: under sustained load it must level off, not grow with the requests.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDS = (  # noqa: SIM905 -- a word list reads better as one string
    "cat dog river mountain piano violin bread cheese moon star rain snow chess football "
    "python compiler volcano ocean forest desert coffee tea engine rocket garden library "
    "museum castle bridge island winter summer doctor patient medicine history music"
).split()


@dataclass
class BenchConfig:
    """What to measure."""

    docs: int = 100_000
    """Documents in the synthetic corpus."""
    concurrency: list[int] = field(default_factory=lambda: [1, 16, 64])
    """Requests in flight at once."""
    requests: int = 256
    """Requests per concurrency level (one query each)."""
    topk: int = 10
    """Documents per query."""
    index_type: str = "flat"
    """flat, ivf or hnsw."""
    corpus_vectors: str = "random"
    """random (unit vectors) or model (embed the synthetic texts; cached under /tmp)."""
    max_concurrent_batches: int = 1
    """Server worker threads (RetrieverSettings.max_concurrent_batches)."""
    max_batch_queries: int = 256
    """Most queries the server embeds together (RetrieverSettings.max_batch_queries)."""
    num_threads: int | None = None
    """torch and faiss CPU threads, in the server and in-process alike (default: their choice)."""
    client: str = "aiohttp"
    """Load generator: aiohttp, or httpx (whose client, not the server, saturates past C ~ 16)."""
    seed: int = 0
    """Seed of the corpus and queries."""
    rounds: int = 1
    """Load rounds per concurrency; the server's resident memory is printed after each."""

    def validate(self) -> BenchConfig:
        if self.docs < 1:
            raise ValueError(f"docs must be >= 1, got {self.docs}")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError(f"concurrency must be ints >= 1, got {self.concurrency}")
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        if self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if self.client not in ("aiohttp", "httpx"):
            raise ValueError(f"client must be aiohttp or httpx, got {self.client!r}")
        if self.corpus_vectors not in ("random", "model"):
            raise ValueError(f"corpus_vectors must be random or model, got {self.corpus_vectors}")
        return self


def synthetic_texts(n: int, rng: np.random.Generator) -> list[str]:
    words = rng.integers(0, len(WORDS), size=(n, 8))
    return [f"document {i}: " + " ".join(WORDS[w] for w in row) for i, row in enumerate(words)]


def corpus_vectors(cfg: BenchConfig, texts: list[str], model, dim: int) -> np.ndarray:
    """(N, D) unit vectors: random, or the model's embeddings cached under /tmp."""
    from retriever.index import embed

    if cfg.corpus_vectors == "random":
        v = np.random.default_rng(cfg.seed).standard_normal((len(texts), dim)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)
    cache = Path(tempfile.gettempdir()) / f"tandem_bench_retriever_{cfg.docs}_{cfg.seed}.npy"
    if cache.exists():
        return np.load(cache)
    from tqdm import tqdm

    parts = [
        embed(model, texts[i : i + 256], batch_size=256)
        for i in tqdm(range(0, len(texts), 256), desc="embedding corpus")
    ]
    vectors = np.concatenate(parts)
    np.save(cache, vectors)
    return vectors


def summary(latencies: list[float], wall: float, n_queries: int) -> dict:
    ms = np.array(latencies) * 1000
    return {
        "qps": n_queries / wall,
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
    }


async def load_server(url: str, queries: list[str], concurrency: int, topk: int, client: str):
    """Send every query as its own request, ``concurrency`` in flight; after one warm-up round."""
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def timed(post, q: str) -> None:
        async with sem:
            t = time.perf_counter()
            await post({"queries": [q], "topk": topk})
            latencies.append(time.perf_counter() - t)

    async def run(post) -> float:
        await asyncio.gather(*(timed(post, q) for q in queries[:concurrency]))
        latencies.clear()
        start = time.perf_counter()
        await asyncio.gather(*(timed(post, q) for q in queries))
        return time.perf_counter() - start

    if client == "aiohttp":
        import aiohttp

        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def post(body: dict) -> None:
                async with session.post(url + "/retrieve", json=body) as r:
                    r.raise_for_status()
                    await r.json()

            wall = await run(post)
    else:
        import httpx

        limits = httpx.Limits(max_connections=concurrency)
        async with httpx.AsyncClient(timeout=120, limits=limits) as session:

            async def post(body: dict) -> None:
                (await session.post(url + "/retrieve", json=body)).raise_for_status()

            wall = await run(post)
    return summary(latencies, wall, len(queries))


def rss_mb(pid: int) -> float:
    """A process's resident memory in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def in_process(model, index, queries: list[str], batch: int, topk: int) -> dict:
    """Embed + search with no HTTP, ``batch`` queries at a time; latency is per batch."""
    from retriever.index import embed

    index.search(embed(model, queries[:batch]), topk)  # warm-up
    latencies = []
    start = time.perf_counter()
    for i in range(0, len(queries), batch):
        t = time.perf_counter()
        index.search(embed(model, queries[i : i + batch], batch_size=batch), topk)
        latencies.append(time.perf_counter() - t)
    return summary(latencies, time.perf_counter() - start, len(queries))


def main(argv: list[str] | None = None) -> None:
    from jsonargparse import ArgumentParser, set_parsing_settings

    from kernel.engine.launch import LaunchedProcess, free_port
    from retriever.__main__ import serve_command
    from retriever.app import RetrieverSettings
    from retriever.index import SearchIndex, embed, load_model, make_index, save_index

    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_class_arguments(BenchConfig, None)
    ns = parser.parse_args(argv)
    cfg = BenchConfig(**{k: ns[k] for k in BenchConfig.__dataclass_fields__}).validate()

    if cfg.num_threads is not None:
        import faiss
        import torch

        torch.set_num_threads(cfg.num_threads)
        faiss.omp_set_num_threads(cfg.num_threads)
    rng = np.random.default_rng(cfg.seed)
    model = load_model("minilm")
    dim = embed(model, ["x"]).shape[1]
    texts = synthetic_texts(cfg.docs, rng)
    t = time.perf_counter()
    vectors = corpus_vectors(cfg, texts, model, dim)  # (N, D)
    docs = [{"id": str(i), "title": "", "text": x} for i, x in enumerate(texts)]
    queries = [
        " ".join(WORDS[w] for w in rng.integers(0, len(WORDS), 4)) for _ in range(cfg.requests)
    ]

    random_vectors = cfg.corpus_vectors == "random"
    with tempfile.TemporaryDirectory(prefix="bench_retriever_") as tmp:
        index_dir = Path(tmp) / "index"
        save_index(index_dir, make_index(vectors, cfg.index_type), docs,
                   {"model": "minilm", "dimension": dim, "index_type": cfg.index_type,
                    "passage_prefix": ""})  # fmt: skip
        print(
            f"corpus: {cfg.docs} synthetic documents, corpus vectors = {cfg.corpus_vectors}"
            f"{' (random unit vectors, not model embeddings)' if random_vectors else ''}"
            f", index {cfg.index_type}, built in {time.perf_counter() - t:.1f} s; queries embedded "
            f"by MiniLM (all-MiniLM-L6-v2, CPU); {cfg.requests} requests of 1 query, topk "
            f"{cfg.topk}; threads {cfg.num_threads or 'default'}"
        )
        index = SearchIndex.load(index_dir, model="minilm")
        base = in_process(model, index, queries, 1, cfg.topk)

        settings = RetrieverSettings(
            index=str(index_dir),
            port=free_port(),
            max_topk=max(cfg.topk, 1),
            max_concurrent_batches=cfg.max_concurrent_batches,
            max_batch_queries=cfg.max_batch_queries,
            num_threads=cfg.num_threads,
        )
        url = f"http://127.0.0.1:{settings.port}"
        command, env = serve_command(settings)
        proc = LaunchedProcess.start("retriever", url, command, Path(tmp) / "s.log", env)
        rows, memory = [], []
        try:
            proc.wait_healthy(deadline_s=300)
            memory.append(("start", rss_mb(proc.pid)))
            for c in cfg.concurrency:
                for r in range(cfg.rounds):
                    server = asyncio.run(load_server(url, queries, c, cfg.topk, cfg.client))
                    memory.append((f"C={c} round {r + 1}", rss_mb(proc.pid)))
                batched = in_process(model, index, queries, c, cfg.topk)
                rows.append((c, server, batched))
        finally:
            proc.stop()

    print(f"in-process, 1 query at a time: {base['qps']:8.1f} q/s  p50 {base['p50']:7.1f} ms  "
          f"p99 {base['p99']:7.1f} ms")  # fmt: skip
    head = (
        f"{'C':>4} | {'server q/s':>10} {'p50 ms':>8} {'p99 ms':>8} | {'in-proc batch C q/s':>19}"
        f" | {'server / in-proc(1)':>19} | {'server / in-proc(C)':>19}"
    )
    print(head)
    print("-" * len(head))
    for c, s, b in rows:
        print(
            f"{c:>4} | {s['qps']:>10.1f} {s['p50']:>8.1f} {s['p99']:>8.1f} | {b['qps']:>19.1f} | "
            f"{s['qps'] / base['qps']:>19.2f} | {s['qps'] / b['qps']:>19.2f}"
        )
    print("server resident memory (MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in memory))
    print(
        f"load generator: {cfg.client}, sharing this machine's cores with the server; server "
        "latency includes HTTP and JSON; in-process latency is per batch."
    )


if __name__ == "__main__":
    main(sys.argv[1:])
