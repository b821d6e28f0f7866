"""Fixtures of the retriever tests: a hand-made 10-document corpus, its index (built once per
session with the real MiniLM model) and a real server on 127.0.0.1 (uvicorn in a thread of this
process, so the model loaded for the build is reused instead of loaded a second time)."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import httpx
import pytest

from kernel.engine.launch import free_port
from retriever import BuildConfig, RetrieverSettings, build_index, create_app

# One topic per document, worded so that each test query has exactly one right answer.
DOCS = [
    ("cat", "Cats", "The domestic cat is a small furry feline that purrs and chases mice."),
    ("volcano", "Volcanoes", "A volcano erupts lava, ash and gas from the magma below."),
    ("piano", "Piano", "The piano is a keyboard instrument whose hammers strike strings."),
    ("bread", "Baking bread", "Knead flour, water, salt and yeast, let the dough rise, bake."),
    ("moon", "The Moon", "The Moon orbits the Earth and causes the ocean tides."),
    ("football", "Football", "Two teams of eleven players kick a ball to score goals."),
    ("python", "Python", "Python is a programming language with readable syntax."),
    ("rain", "Rain", "Rain falls from clouds when water droplets become heavy."),
    ("chess", "Chess", "Chess is a board game of kings, queens, rooks and checkmate."),
    ("coffee", "Coffee", "Coffee is brewed from roasted beans and contains caffeine."),
]

LIMITS = {"max_queries": 4, "max_query_chars": 200, "max_topk": 5}


def write_corpus(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="session")
def index_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("retriever")
    rows = [{"id": i, "title": t, "text": x} for i, t, x in DOCS]
    corpus = write_corpus(root / "corpus.jsonl", rows)
    return build_index(BuildConfig(corpus=corpus, out=str(root / "index")), progress=False)


@contextlib.contextmanager
def serve(settings: RetrieverSettings):
    """A real retriever server with ``settings`` on 127.0.0.1 (uvicorn in a thread); its URL."""
    import uvicorn

    app = create_app(settings)
    config = uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="error")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{settings.port}"
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"retriever at {url} did not start")
        time.sleep(0.05)
    assert httpx.get(url + "/health").status_code == 200
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="session")
def server_url(index_dir):
    with serve(RetrieverSettings(index=str(index_dir), port=free_port(), **LIMITS)) as url:
        yield url
