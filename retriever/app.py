"""The retriever's HTTP service: ``create_app(RetrieverSettings(...))`` -> FastAPI.

``POST /retrieve {"queries": [...], "topk": k}`` embeds the queries of one request as one
batch and answers, per query, a ranked list of ``{id, title, text, score}`` (score = cosine
similarity). ``GET /health`` answers once the index and model are loaded (the port opens only
then), and FastAPI serves the OpenAPI docs at ``/docs``. Embedding and search run on worker
threads (``max_concurrent_batches`` of them), so the event loop only validates, hands off and
awaits. A free worker takes every request waiting in the queue (up to ``max_batch_queries``
queries) and embeds them as one batch: under concurrent load the model sees large batches,
which on CPU costs far less per query than one forward pass per request.

``POST /documents {"ids": [...]}`` answers the documents with those ids, in request order, as
``{id, title, text}`` (a research agent's "read" tool); an id the index does not hold is HTTP
404 naming it, so a caller can tell a wrong id from a bad request.

With ``api_key`` set, every route but ``/health`` needs ``Authorization: Bearer <api_key>``
(HTTP 401 otherwise, checked by ``kernel.auth.BearerAuth`` as the engine and the environment
server check theirs); ``/health`` stays open for load balancers and launch scripts.

Every bad request -- a missing field, too many queries or ids, an empty or over-long query or
id, a topk out of range -- gets HTTP 422 with ``{"error": {"message": ...}}`` naming the field.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from concurrent.futures import Future
from contextlib import asynccontextmanager

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from pydantic.dataclasses import dataclass

from kernel.auth import BearerAuth
from retriever.index import DEFAULT_MODEL, SearchIndex, default_prefixes, embed, load_model

log = logging.getLogger(__name__)


@dataclass
class RetrieverSettings:
    """Settings of one retriever server."""

    index: str = ""
    """Index folder written by `python -m retriever build`."""
    model: str = DEFAULT_MODEL
    """Embedding model of the queries; must be the one the index was built with."""
    device: str = "cpu"
    """cpu, cuda or cuda:N."""
    host: str = "127.0.0.1"
    """Interface to bind."""
    port: int = 8000
    """TCP port to bind."""
    query_prefix: str | None = None
    """Prepended to every query (default: 'query: ' for e5 models, else nothing)."""
    default_topk: int = 5
    """Documents per query when a request gives no topk."""
    max_topk: int = 100
    """Largest topk a request may ask for."""
    max_queries: int = 64
    """Most queries in one request."""
    max_query_chars: int = 2048
    """Longest query, in characters."""
    max_documents: int = 64
    """Most ids in one /documents request."""
    max_concurrent_batches: int = 1
    """Batches embedded and searched at once (worker threads); more requests wait their turn."""
    max_batch_queries: int = 256
    """Most queries one worker gathers from waiting requests into one batch."""
    nprobe: int = 16
    """ivf indexes: clusters searched per query (recall against speed)."""
    ef_search: int = 64
    """hnsw indexes: candidate list size per query (recall against speed)."""
    num_threads: int | None = None
    """CPU threads of torch and faiss each (default: their choice); 1 avoids oversubscription
    when processes share a few cores."""
    log_level: str = "warning"
    """uvicorn log level."""
    api_key: str | None = None
    """If set, every route but /health needs ``Authorization: Bearer <api_key>``.
    ``python -m retriever serve`` refuses it on the command line (any local user can read
    that): it reads ``--api_key_file PATH`` (a file only its user may read) or the
    ``TANDEM_API_KEY`` environment variable (empty: none)."""

    def validate(self) -> RetrieverSettings:
        if not self.index:
            raise ValueError("index: an index folder is required")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        for name in ("default_topk", "max_topk", "max_queries", "max_query_chars", "max_documents"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.default_topk > self.max_topk:
            raise ValueError(f"default_topk ({self.default_topk}) exceeds max_topk")
        for name in ("max_concurrent_batches", "max_batch_queries", "nprobe", "ef_search"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        return self


class RetrieveRequest(BaseModel):
    queries: list[str] = Field(description="Search queries, embedded together as one batch.")
    topk: int | None = Field(None, description="Documents per query (default: default_topk).")


class Passage(BaseModel):
    id: str
    title: str
    text: str
    score: float = Field(description="Cosine similarity of query and document.")


class RetrieveResponse(BaseModel):
    results: list[list[Passage]] = Field(description="Per query, best first.")


class DocumentsRequest(BaseModel):
    ids: list[str] = Field(description="Document ids, as in the corpus.")


class Document(BaseModel):
    id: str
    title: str
    text: str


class DocumentsResponse(BaseModel):
    documents: list[Document] = Field(description="The documents, in the order of the ids.")


class NotFound(LookupError):
    """A document id the index does not hold: HTTP 404 with this message."""


class BadRequest(ValueError):
    """A well-formed request outside the server's limits: HTTP 422 with this message."""


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def _format_validation(exc: RequestValidationError) -> str:
    """pydantic's errors as 'field: problem; ...' (e.g. 'queries[2]: Input should be ...')."""
    parts = []
    for err in exc.errors():
        loc = "".join(
            f"[{x}]" if isinstance(x, int) else f".{x}" for x in err.get("loc", ()) if x != "body"
        ).lstrip(".")
        msg = err.get("msg", "invalid")
        if err.get("type") == "missing":
            msg = "field required"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(dict.fromkeys(parts[:4]))


class Retriever:
    """What a running server holds: settings, the loaded index and the embedding model."""

    def __init__(self, settings: RetrieverSettings) -> None:
        self.settings = settings
        # Refuses a mismatched index before the (slow) model load, naming both models.
        self.index = SearchIndex.load(settings.index, model=settings.model)
        self.index.set_search_params(settings.nprobe, settings.ef_search)
        if settings.num_threads is not None:
            import faiss
            import torch

            torch.set_num_threads(settings.num_threads)
            faiss.omp_set_num_threads(settings.num_threads)
        self.model = load_model(settings.model, settings.device)
        prefix = settings.query_prefix
        self.query_prefix = default_prefixes(settings.model)[0] if prefix is None else prefix
        self.by_id = {d["id"]: d for d in self.index.docs}

    def documents(self, req: DocumentsRequest) -> list[dict]:
        """The documents of ``req.ids``; BadRequest / NotFound naming the id otherwise."""
        if not req.ids:
            raise BadRequest("ids: the list is empty")
        if len(req.ids) > self.settings.max_documents:
            n, most = len(req.ids), self.settings.max_documents
            raise BadRequest(f"ids: {n} ids exceed max_documents {most}")
        for i, doc_id in enumerate(req.ids):
            if not doc_id.strip():
                raise BadRequest(f"ids[{i}] is empty")
            if len(doc_id) > self.settings.max_query_chars:
                raise BadRequest(f"ids[{i}] is longer than max_query_chars")
            if doc_id not in self.by_id:
                raise NotFound(f"ids[{i}]: no document with id {doc_id!r}")
        return [self.by_id[doc_id] for doc_id in req.ids]

    def check(self, req: RetrieveRequest) -> int:
        """Raise BadRequest naming the field for a request outside the limits; the topk."""
        s = self.settings
        if not req.queries:
            raise BadRequest("queries: the list is empty")
        if len(req.queries) > s.max_queries:
            n = len(req.queries)
            raise BadRequest(f"queries: {n} queries exceed max_queries {s.max_queries}")
        for i, q in enumerate(req.queries):
            if not q.strip():
                raise BadRequest(f"queries[{i}] is empty")
            try:  # checked here, per request: a batch must never meet an unencodable query
                q.encode("utf-8")
            except UnicodeEncodeError as e:
                raise BadRequest(
                    f"queries[{i}]: invalid Unicode: a lone surrogate ({q[e.start]!a}) at "
                    f"position {e.start}"
                ) from None
            if len(q) > s.max_query_chars:
                raise BadRequest(
                    f"queries[{i}] has {len(q)} characters, more than max_query_chars "
                    f"{s.max_query_chars}"
                )
        topk = s.default_topk if req.topk is None else req.topk
        if not 1 <= topk <= s.max_topk:
            raise BadRequest(f"topk must be in 1..{s.max_topk}, got {topk}")
        return topk


class Batcher:
    """Worker threads that serve waiting requests together: one embedding batch for all the
    queries a worker finds queued, then one search per distinct topk."""

    def __init__(self, retriever: Retriever, workers: int, max_batch_queries: int) -> None:
        self.retriever, self.max_batch_queries = retriever, max_batch_queries
        self.queue: queue.Queue = queue.Queue()
        self.threads = [
            threading.Thread(target=self._work, name=f"retrieve-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self.threads:
            t.start()

    def submit(self, queries: list[str], topk: int) -> Future:
        future: Future = Future()
        self.queue.put((queries, topk, future))
        return future

    def close(self) -> None:
        for _ in self.threads:
            self.queue.put(None)

    def _take(self) -> list | None:
        """Block for one request, then add those already waiting while the batch has room.
        Requests whose caller has gone (future cancelled) are dropped here."""
        batch: list = []
        size = 0
        while not batch or size < self.max_batch_queries:
            try:
                item = self.queue.get() if not batch else self.queue.get_nowait()
            except queue.Empty:
                break
            if item is None:  # shutting down: serve what we hold, let the next take stop us
                if batch:
                    self.queue.put(None)
                    break
                return None
            if item[2].set_running_or_notify_cancel():
                batch.append(item)
                size += len(item[0])
        return batch

    def _work(self) -> None:
        while (batch := self._take()) is not None:
            try:
                self._serve(batch)
            except Exception as e:
                if len(batch) > 1:  # one bad request must not fail those batched with it
                    log.warning("a batch of %d requests failed (%s); each alone", len(batch), e)
                    for item in batch:
                        self._serve_alone(item)
                else:
                    self._serve_alone(batch[0], e)

    def _serve_alone(self, item, error: Exception | None = None) -> None:
        """Serve one request by itself; a failure fails it alone (HTTP 500), not the worker."""
        try:
            if error is not None:
                raise error
            self._serve([item])
        except Exception as e:
            if not item[2].done():
                item[2].set_exception(e)

    def _serve(self, batch: list) -> None:
        r = self.retriever
        texts = [q for queries, _, _ in batch for q in queries]
        vectors = embed(r.model, texts, r.query_prefix, batch_size=len(texts))  # (Q, D)
        spans, start = [], 0
        for queries, topk, future in batch:
            spans.append((start, start + len(queries), topk, future))
            start += len(queries)
        for k in {topk for _, _, topk, _ in spans}:
            mine = [span for span in spans if span[2] == k]
            rows = np.concatenate([vectors[a:b] for a, b, _, _ in mine])  # (Q_k, D)
            hits = r.index.search(rows, k)
            at = 0
            for a, b, _, future in mine:
                future.set_result(hits[at : at + b - a])
                at += b - a


def create_app(settings: RetrieverSettings) -> FastAPI:
    """The FastAPI app of one retriever (index and model load at start-up, not here)."""
    settings.validate()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        retriever = await asyncio.to_thread(Retriever, settings)
        app.state.retriever = retriever
        app.state.batcher = Batcher(
            retriever, settings.max_concurrent_batches, settings.max_batch_queries
        )
        yield
        app.state.batcher.close()

    app = FastAPI(title="Tandem retriever", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        return _error(422, _format_validation(exc))

    @app.exception_handler(BadRequest)
    async def _bad(_: Request, exc: BadRequest):
        return _error(422, str(exc))

    @app.exception_handler(NotFound)
    async def _missing(_: Request, exc: NotFound):
        return _error(404, str(exc.args[0]))

    @app.post("/retrieve", response_model=RetrieveResponse)
    async def retrieve(body: RetrieveRequest) -> RetrieveResponse:
        r: Retriever = app.state.retriever
        topk = r.check(body)
        results = await asyncio.wrap_future(app.state.batcher.submit(body.queries, topk))
        return RetrieveResponse(results=results)

    @app.post("/documents", response_model=DocumentsResponse)
    async def documents(body: DocumentsRequest) -> DocumentsResponse:
        # a dict lookup: cheap enough to answer on the event loop
        return DocumentsResponse(documents=app.state.retriever.documents(body))

    @app.get("/health")
    async def health():
        r: Retriever = app.state.retriever
        return {
            "status": "ok",
            "model": settings.model,
            "documents": len(r.index.docs),
            "index_type": r.index.meta.get("index_type"),
        }

    app.add_middleware(BearerAuth, api_key=settings.api_key)
    return app
