"""Index building and loading: corpus row errors, model-mismatch refusal, index types, config
checks, and the command line (``--help``, a bad corpus, a mismatched server)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from kernel.engine.launch import LaunchedProcess, free_port
from retriever import (
    BuildConfig,
    CorpusError,
    ModelMismatchError,
    RetrieverSettings,
    SearchIndex,
    read_corpus,
)
from retriever.__main__ import serve_command
from retriever.index import default_prefixes, make_index
from tests.retrieval.conftest import write_corpus


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "retriever", *args], capture_output=True, text=True, timeout=60
    )


def test_read_corpus_with_custom_keys(tmp_path):
    rows = [{"doc_id": 7, "head": "Seven", "body": "number seven"}, {"doc_id": "x", "body": "b"}]
    docs = read_corpus(write_corpus(tmp_path / "c.jsonl", rows), "doc_id", "head", "body")
    assert docs == [
        {"id": "7", "title": "Seven", "text": "number seven"},
        {"id": "x", "title": "", "text": "b"},  # a missing title is allowed
    ]


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"id": "b"}', "line 2: missing key 'text'"),
        ('{"text": "b"}', "line 2: missing key 'id'"),
        ('{"id": "b", "text": 5}', "line 2: key 'text' must be a string, got int"),
        ('{"id": "b", "text": "t", "title": ["x"]}', "line 2: key 'title' must be a string"),
        ('{"id": true, "text": "t"}', "line 2: key 'id' must be a string or an integer"),
        ('{"id": "b", "text": ', "line 2: not valid JSON"),
        ('["b", "t"]', "line 2: expected a JSON object, got list"),
    ],
)
def test_malformed_row_names_file_line_and_key(tmp_path, bad_line, message):
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"id": "a", "text": "fine"}\n' + bad_line + "\n")
    with pytest.raises(CorpusError) as e:
        read_corpus(path)
    assert str(e.value).startswith(f"{path}, {message}")


def test_empty_corpus_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(CorpusError, match="no documents"):
        read_corpus(path)


def test_index_built_with_another_model_is_refused(index_dir):
    with pytest.raises(ModelMismatchError) as e:
        SearchIndex.load(index_dir, model="intfloat/e5-small-v2")
    assert "'minilm'" in str(e.value) and "'intfloat/e5-small-v2'" in str(e.value)
    assert SearchIndex.load(index_dir, model="minilm").meta["dimension"] == 384


@pytest.mark.parametrize("index_type", ["flat", "ivf", "hnsw"])
def test_index_types_find_the_nearest_vector(index_type):
    """Each of 400 random unit vectors, used as a query, finds itself first (score = 1)."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((400, 16)).astype(np.float32)  # (N, D)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    docs = [{"id": str(i), "title": "", "text": f"doc {i}"} for i in range(400)]
    index = SearchIndex(make_index(vectors, index_type), docs, {"index_type": index_type})
    index.set_search_params(nprobe=1000, ef_search=200)  # exhaustive enough to be exact here
    hits = index.search(vectors[:20], topk=3)
    assert [h[0]["id"] for h in hits] == [str(i) for i in range(20)]
    assert all(h[0]["score"] == pytest.approx(1.0, abs=1e-5) for h in hits)


def test_e5_models_get_their_prefixes():
    assert default_prefixes("intfloat/e5-base-v2") == ("query: ", "passage: ")
    assert default_prefixes("/models/multilingual-e5-large") == ("query: ", "passage: ")
    assert default_prefixes("minilm") == ("", "")


def test_config_validation_names_the_field(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", [{"id": 1, "text": "t"}])
    with pytest.raises(ValueError, match="index_type"):
        BuildConfig(corpus=corpus, out="x", index_type="lsh").validate()
    with pytest.raises(ValueError, match="batch_size"):
        BuildConfig(corpus=corpus, out="x", batch_size=0).validate()
    with pytest.raises(ValueError, match="corpus"):
        BuildConfig(corpus=str(tmp_path / "none.jsonl"), out="x").validate()
    with pytest.raises(ValueError, match="max_topk"):
        RetrieverSettings(index="i", max_topk=0).validate()
    with pytest.raises(ValueError, match="index"):
        RetrieverSettings().validate()


def test_cli_help_lists_the_flags():
    top = run_cli("--help")
    assert top.returncode == 0 and "build" in top.stdout and "serve" in top.stdout
    build = run_cli("build", "--help")
    assert build.returncode == 0
    for flag in ("--corpus", "--out", "--id_key", "--index_type", "--batch_size", "--model"):
        assert flag in build.stdout
    serve = run_cli("serve", "--help")
    assert serve.returncode == 0
    for flag in ("--index", "--host", "--port", "--max_queries", "--max_topk"):
        assert flag in serve.stdout


def test_cli_build_reports_the_bad_row(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"doc": "a", "body": "x"}) + "\n" + json.dumps({"doc": "b"}) + "\n")
    out = str(tmp_path / "i")
    keys = ["--id-key", "doc", "--text-key", "body"]
    r = run_cli("build", "--corpus", str(path), "--out", out, *keys)
    assert r.returncode != 0
    assert f"{path}, line 2: missing key 'body'" in r.stderr


def test_cli_serve_refuses_a_mismatched_index(index_dir, tmp_path):
    other = "intfloat/e5-small-v2"
    settings = RetrieverSettings(index=str(index_dir), model=other, port=free_port())
    command, env = serve_command(settings)
    url = "http://127.0.0.1"
    proc = LaunchedProcess.start("retriever", url, command, tmp_path / "serve.log", env)
    try:
        with pytest.raises(RuntimeError, match="exited with code") as e:
            proc.wait_healthy(deadline_s=60)
    finally:
        proc.stop()
    assert "built with embedding model 'minilm'" in str(e.value)
    assert "configured with model 'intfloat/e5-small-v2'" in str(e.value)
