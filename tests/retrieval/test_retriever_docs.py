"""POST /documents over real HTTP: documents by id in request order, 404 for an unknown id,
422 for every bad request (the real server and corpus of conftest.py)."""

from __future__ import annotations

import httpx
import pytest

from tests.retrieval.conftest import DOCS


def post(url: str, body) -> httpx.Response:
    return httpx.post(url + "/documents", json=body, timeout=30)


def test_documents_come_back_by_id_in_request_order(server_url):
    r = post(server_url, {"ids": ["moon", "cat", "moon"]})
    assert r.status_code == 200, r.text
    by_id = {i: {"id": i, "title": t, "text": x} for i, t, x in DOCS}
    assert r.json() == {"documents": [by_id["moon"], by_id["cat"], by_id["moon"]]}


def test_unknown_id_is_404_naming_it(server_url):
    r = post(server_url, {"ids": ["cat", "unicorn"]})
    assert r.status_code == 404
    assert r.json() == {"error": {"message": "ids[1]: no document with id 'unicorn'"}}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "ids: field required"),
        ({"ids": []}, "ids: the list is empty"),
        ({"ids": ["cat", "  "]}, "ids[1] is empty"),
        ({"ids": ["cat", 3]}, "ids[1]: Input should be a valid string"),
        ({"ids": "cat"}, "ids: Input should be a valid list"),
        ({"ids": ["x" * 201]}, "ids[0] is longer than max_query_chars"),  # limit 200 here
    ],
)
def test_bad_requests_are_422_naming_the_field(server_url, body, message):
    r = post(server_url, body)
    assert r.status_code == 422
    assert r.json()["error"]["message"] == message


def test_too_many_ids_is_422(server_url):
    # the fixture leaves max_documents at its default, 64
    r = post(server_url, {"ids": ["cat"] * 65})
    assert r.status_code == 422
    assert r.json()["error"]["message"] == "ids: 65 ids exceed max_documents 64"
