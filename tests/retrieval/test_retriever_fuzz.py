"""Property-based fuzz of the retriever (issue 21): generated /retrieve and /documents bodies
never get a 5xx and /health answers after. ``TANDEM_FUZZ_EXAMPLES`` sets how many per endpoint
(CI: 150; ``scripts/fuzz.sh`` runs the long mode)."""

from __future__ import annotations

import json
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow  # the slow tier: scripts/test.sh --slow

EXAMPLES = int(os.environ.get("TANDEM_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | st.sampled_from(["\ud800", "cats \udfff", "", " ", "\x00"])
)
anything = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12,
)
queries = st.lists(st.text(max_size=60), max_size=6) | anything
retrieve = st.fixed_dictionaries(
    {}, optional={"queries": queries, "topk": st.integers(min_value=-2, max_value=8) | anything}
)
documents = st.fixed_dictionaries({}, optional={"ids": st.lists(st.text(max_size=8)) | anything})


def send(url: str, body) -> None:
    data = json.dumps(body, allow_nan=True)
    r = httpx.post(url, content=data, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code < 500, (url, data[:300], r.status_code, r.text[:300])


@FUZZ
@given(body=retrieve)
def test_fuzz_retrieve(server_url, body):
    send(server_url + "/retrieve", body)


@FUZZ
@given(body=documents)
def test_fuzz_documents(server_url, body):
    send(server_url + "/documents", body)


def test_healthy_after_the_fuzz(server_url):
    assert httpx.get(server_url + "/health", timeout=5).status_code == 200
    r = httpx.post(server_url + "/retrieve", json={"queries": ["cats"], "topk": 1}, timeout=30)
    assert r.status_code == 200
