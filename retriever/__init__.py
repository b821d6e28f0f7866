"""Tandem's retriever service: a FastAPI + faiss search over an embedded corpus.

``build_index(BuildConfig(...))`` (or ``python -m retriever build``) embeds a JSONL corpus into
a faiss index folder; ``create_app(RetrieverSettings(index=DIR))`` (or ``python -m retriever
serve``) serves it at ``POST /retrieve``. Research-agent recipes call it as their search tool.
"""

from retriever.app import RetrieveRequest, RetrieveResponse, RetrieverSettings, create_app
from retriever.index import (
    BuildConfig,
    CorpusError,
    ModelMismatchError,
    SearchIndex,
    build_index,
    read_corpus,
)

__all__ = [
    "BuildConfig",
    "CorpusError",
    "ModelMismatchError",
    "RetrieveRequest",
    "RetrieveResponse",
    "RetrieverSettings",
    "SearchIndex",
    "build_index",
    "create_app",
    "read_corpus",
]
