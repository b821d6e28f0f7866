"""The retriever over real HTTP: ranking on a hand-made corpus, every 422 case, concurrent load."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from retriever.index import embed, load_model, passage_text
from tests.retrieval.conftest import DOCS

# query -> the only document about it
RANKING = {
    "Which pet purrs and chases mice?": "cat",
    "hot lava pouring out of a mountain": "volcano",
    "a board game where you checkmate the king": "chess",
    "a hot drink with caffeine": "coffee",
    "why does the sea have tides": "moon",
    "how to bake a loaf with yeast": "bread",
    "a language for writing software": "python",
    "droplets falling from clouds": "rain",
}


def post(url: str, body) -> httpx.Response:
    return httpx.post(url + "/retrieve", json=body, timeout=30)


def test_health_and_openapi(server_url):
    health = httpx.get(server_url + "/health").json()
    assert health == {"status": "ok", "model": "minilm", "documents": 10, "index_type": "flat"}
    assert "/retrieve" in httpx.get(server_url + "/openapi.json").json()["paths"]


def test_each_query_ranks_its_document_first(server_url):
    queries = list(RANKING)
    for start in (0, 4):  # max_queries is 4 in these tests
        batch = queries[start : start + 4]
        r = post(server_url, {"queries": batch, "topk": 3})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert len(results) == 4
        for q, hits in zip(batch, results, strict=True):
            assert len(hits) == 3
            assert hits[0]["id"] == RANKING[q], (q, hits)
            scores = [h["score"] for h in hits]
            assert scores == sorted(scores, reverse=True)


def test_score_is_the_cosine_of_query_and_document(server_url):
    """The served score equals the dot product of the unit-norm embeddings, computed here."""
    query = "Which pet purrs and chases mice?"
    hit = post(server_url, {"queries": [query], "topk": 1}).json()["results"][0][0]
    cat = next(d for d in DOCS if d[0] == "cat")
    doc_text = passage_text({"title": cat[1], "text": cat[2]})  # "Cats\nThe domestic cat ..."
    model = load_model("minilm")
    q, d = embed(model, [query])[0], embed(model, [doc_text])[0]  # (384,), (384,)
    assert np.isclose(np.linalg.norm(q), 1.0, atol=1e-5)
    expected = {"id": "cat", "title": "Cats", "text": cat[2]}
    assert hit == {**expected, "score": pytest.approx(float(q @ d), abs=1e-4)}


def test_default_topk(server_url):
    hits = post(server_url, {"queries": ["piano keys"]}).json()["results"][0]
    assert len(hits) == 5  # RetrieverSettings.default_topk
    assert hits[0]["id"] == "piano"


@pytest.mark.parametrize(
    "body, message",
    [
        ({}, "queries: field required"),
        ({"topk": 2}, "queries: field required"),
        ({"queries": "cats"}, "queries: Input should be a valid list"),
        ({"queries": [3]}, "queries[0]: Input should be a valid string"),
        ({"queries": []}, "queries: the list is empty"),
        ({"queries": ["a", "b", "c", "d", "e"]}, "queries: 5 queries exceed max_queries 4"),
        ({"queries": ["cats", ""]}, "queries[1] is empty"),
        ({"queries": ["   "]}, "queries[0] is empty"),
        ({"queries": ["x" * 201]}, "queries[0] has 201 characters, more than max_query_chars 200"),
        ({"queries": ["cats"], "topk": 0}, "topk must be in 1..5, got 0"),
        ({"queries": ["cats"], "topk": 6}, "topk must be in 1..5, got 6"),
        ({"queries": ["cats"], "topk": "many"}, "topk: Input should be a valid integer"),
        ([1, 2], "Input should be a valid dictionary"),
    ],
)
def test_bad_requests_get_422_naming_the_field(server_url, body, message):
    r = post(server_url, body)
    assert r.status_code == 422
    assert message in r.json()["error"]["message"]


def test_malformed_json_gets_422_and_the_server_lives_on(server_url):
    r = httpx.post(
        server_url + "/retrieve", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422
    assert "JSON" in r.json()["error"]["message"]
    assert httpx.get(server_url + "/health").status_code == 200


def test_concurrent_requests(server_url):
    """64 requests over 8 concurrent clients, with topk 1, 2 or 3 (the server batches requests
    together): all answered 200, each with its own right answer and its own number of hits."""
    queries = list(RANKING)

    async def run() -> list[tuple[str, int, httpx.Response]]:
        sem = asyncio.Semaphore(8)
        async with httpx.AsyncClient(timeout=60) as client:

            async def one(i: int):
                q, topk = queries[i % len(queries)], 1 + i % 3
                async with sem:
                    body = {"queries": [q], "topk": topk}
                    r = await client.post(server_url + "/retrieve", json=body)
                return q, topk, r

            return await asyncio.gather(*(one(i) for i in range(64)))

    replies = asyncio.run(run())
    assert len(replies) == 64
    for q, topk, r in replies:
        assert r.status_code == 200, r.text
        hits = r.json()["results"][0]
        assert len(hits) == topk
        assert hits[0]["id"] == RANKING[q]


def test_a_lone_surrogate_fails_only_its_own_request(server_url):
    """Issue 21, defect 2: a query holding a lone UTF-16 surrogate got 500, and so did every
    request batched with it (69 of 120 innocent ones). Now it alone gets 422 naming it."""
    queries = list(RANKING)

    async def run():
        async with httpx.AsyncClient(timeout=60) as client:
            bad = client.post(
                server_url + "/retrieve",
                content='{"queries": ["cats \\ud800 dogs"]}',
                headers={"content-type": "application/json"},
            )
            good = [
                client.post(server_url + "/retrieve", json={"queries": [q], "topk": 1})
                for q in queries * 15
            ]
            return await asyncio.gather(bad, *good)

    bad, *good = asyncio.run(run())
    assert bad.status_code == 422 and "surrogate" in bad.json()["error"]["message"], bad.text
    assert [r.status_code for r in good] == [200] * len(good)


def test_api_key_guards_search_and_documents_but_not_health(index_dir):
    from kernel.engine.launch import free_port
    from retriever import RetrieverSettings
    from tests.retrieval.conftest import serve

    settings = RetrieverSettings(index=str(index_dir), port=free_port(), api_key="r-key")
    with serve(settings) as url:
        body, ids = {"queries": ["purring pet"], "topk": 1}, {"ids": ["cat"]}
        for path, payload in (("/retrieve", body), ("/documents", ids)):
            for headers in (
                None,
                {"Authorization": "Bearer wrong"},
                {"Authorization": b"Bearer \xff\xfe"},  # was a 500: the compare raised
            ):
                r = httpx.post(url + path, json=payload, headers=headers)
                assert r.status_code == 401, (path, headers)
                assert "Bearer" in r.json()["error"]["message"]
            r = httpx.post(url + path, json=payload, headers={"Authorization": "Bearer r-key"})
            assert r.status_code == 200, r.text
        assert httpx.get(url + "/health").status_code == 200


def test_the_recipes_client_sends_the_key_from_the_environment(index_dir, monkeypatch):
    from kernel.engine.launch import free_port
    from recipes.deep_research.config import RecipeConfig
    from recipes.deep_research.tools import RetrieverClient
    from retriever import RetrieverSettings
    from tests.retrieval.conftest import serve

    monkeypatch.setenv("TANDEM_API_KEY", "env-key")
    settings = RetrieverSettings(index=str(index_dir), port=free_port(), api_key="env-key")
    with serve(settings) as url:
        cfg = RecipeConfig(retriever_url=url).validate()
        assert "env-key" not in repr(cfg)

        async def main():
            async with RetrieverClient(url, api_key=cfg.retriever_api_key) as client:
                return await client.document("cat")

        assert asyncio.run(main())["id"] == "cat"


def test_the_search_tool_sends_the_key_of_its_key_file(index_dir, tmp_path):
    """kernel.env.tools' search against a keyed retriever: with ``retriever_key_file`` (mode
    600) it gets passages, without one the retriever's 401 is a tool error the episode goes on
    after; a key file others may read is refused when the environment is made, naming it."""
    from kernel.engine.launch import free_port
    from kernel.env.tools import ToolEnv
    from retriever import RetrieverSettings
    from tests.retrieval.conftest import serve

    key_file = tmp_path / "retriever.key"
    key_file.write_text("tool-key\n")
    key_file.chmod(0o600)
    item = {"prompt": "What purrs?", "label": "cat"}

    async def search(url: str, **key) -> str:
        env = ToolEnv(tools=["search"], retriever_url=url, **key)
        await env.reset(item)
        obs = await env.step("<search>purring pet</search>")
        await env.close()
        return obs.text

    settings = RetrieverSettings(index=str(index_dir), port=free_port(), api_key="tool-key")
    with serve(settings) as url:
        assert "purr" in asyncio.run(search(url, retriever_key_file=str(key_file))).lower()
        assert asyncio.run(search(url)).startswith("search error: the retriever did not answer")
    key_file.chmod(0o644)
    with pytest.raises(ValueError, match=r"tools: retriever_key_file .*group or others"):
        ToolEnv(tools=["search"], retriever_url=url, retriever_key_file=str(key_file))
