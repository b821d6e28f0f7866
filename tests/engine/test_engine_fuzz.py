"""Property-based fuzz of the embedded server (issue 21): generated /generate and
/v1/chat/completions bodies -- valid, nearly valid and hostile -- never get a 5xx, never hang
past the timeout, and /health answers throughout. ``TANDEM_FUZZ_EXAMPLES`` sets how many bodies
per endpoint (CI: 150; ``scripts/fuzz.sh`` runs the long mode)."""

from __future__ import annotations

import json
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.engine.launch import free_port, launch_server
from kernel.engine.settings import ServerConfig

pytestmark = pytest.mark.slow  # the slow tier: scripts/test.sh --slow

EXAMPLES = int(os.environ.get("TANDEM_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,  # CI sees the same bodies every run; the long mode varies the seed
)

# Anything JSON can carry, including what Python's json module lets through (NaN, huge ints,
# lone surrogates).
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    | st.sampled_from(["\ud800", "a\udfffb", "", " ", "\x00", "🙂"])
)
anything = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12,
)
small_ints = st.integers(min_value=-3, max_value=600)
token_ids = st.lists(small_ints | st.integers(), min_size=0, max_size=12)

sampling = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.floats(allow_nan=True) | st.just(1e-40) | anything,
        "top_p": st.floats(allow_nan=True) | anything,
        "top_k": st.integers() | st.just(2**63) | anything,
        "min_p": st.floats() | anything,
        "max_new_tokens": st.integers(min_value=-2, max_value=40) | st.integers() | anything,
        "n": st.integers(min_value=-1, max_value=10) | st.integers() | anything,
        "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=3) | anything,
        "stop_token_ids": token_ids | anything,
        "ignore_eos": st.booleans() | anything,
        "frequency_penalty": st.floats() | anything,
    },
)
generate_bodies = st.fixed_dictionaries(
    {},
    optional={
        "text": st.text(max_size=60) | st.lists(st.text(max_size=20), max_size=3) | anything,
        "input_ids": token_ids | st.lists(token_ids, max_size=3) | anything,
        "sampling_params": sampling | st.lists(sampling, max_size=3) | anything,
        "return_logprob": st.booleans() | st.lists(st.booleans(), max_size=3) | anything,
        "rid": st.text(max_size=10) | anything,
        "stream": st.booleans() | anything,
    },
)
# Near the valid region, so that many bodies are served and the scheduler itself is fuzzed
# (mixed lengths, greedy and sampled rows, filters, n, stops, logprobs in one batch).
served = st.fixed_dictionaries(
    {
        "input_ids": st.lists(st.integers(min_value=0, max_value=400), min_size=1, max_size=20),
        "sampling_params": st.fixed_dictionaries(
            {"max_new_tokens": st.integers(min_value=0, max_value=12)},
            optional={
                "temperature": st.floats(min_value=0, max_value=3) | st.just(1e-30),
                "top_p": st.floats(min_value=0.01, max_value=1),
                "top_k": st.integers(min_value=1, max_value=2**31 - 1) | st.just(-1),
                "min_p": st.floats(min_value=0, max_value=1),
                "n": st.integers(min_value=1, max_value=4),
                "stop_token_ids": st.lists(st.integers(min_value=0, max_value=400), max_size=3),
                "ignore_eos": st.booleans(),
            },
        ),
    },
    optional={"return_logprob": st.booleans()},
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"]) | anything},
    optional={"content": st.text(max_size=60) | anything},
)
chat_bodies = st.fixed_dictionaries(
    {},
    optional={
        "messages": st.lists(message, max_size=3) | anything,
        "temperature": st.floats(allow_nan=True) | anything,
        "max_tokens": st.integers(min_value=-1, max_value=30) | st.integers() | anything,
        "n": st.integers(min_value=0, max_value=4) | anything,
        "stop": st.text(max_size=4) | anything,
    },
)


@pytest.fixture(scope="module")
def url(tiny_model_dir, tmp_path_factory):
    config = ServerConfig(
        model=str(tiny_model_dir),
        port=free_port(),
        max_batch_size=16,
        num_threads=1,
        context_length=64,  # bounds every generation: the fuzz stays fast
        max_n=8,
        max_request_mb=1,
    )
    proc = launch_server(config, tmp_path_factory.mktemp("fuzz") / "server.log")
    try:
        proc.wait_healthy(deadline_s=180)
        yield proc.url
    finally:
        proc.stop()


STATUSES: dict[int, int] = {}


def send(url: str, path: str, body) -> int:
    """POST ``body`` as JSON as Python writes it (NaN, Infinity and lone surrogates pass);
    the status, which must be below 500 and arrive within the timeout."""
    data = json.dumps(body, allow_nan=True)
    r = httpx.post(
        f"{url}{path}", content=data, headers={"content-type": "application/json"}, timeout=60
    )
    assert r.status_code < 500, (path, data[:300], r.status_code, r.text[:300])
    if r.status_code == 200:
        json.loads(r.text, parse_constant=_refuse)  # strict JSON: no NaN or Infinity
    STATUSES[r.status_code] = STATUSES.get(r.status_code, 0) + 1
    return r.status_code


def _refuse(name: str):
    raise AssertionError(f"a reply carries {name}, which is not JSON")


@FUZZ
@given(body=served | generate_bodies)
def test_fuzz_generate(url, body):
    send(url, "/generate", body)


@FUZZ
@given(body=chat_bodies)
def test_fuzz_chat_completions(url, body):
    send(url, "/v1/chat/completions", body)


def test_the_server_is_healthy_and_idle_after_the_fuzz(url):
    """Runs after the fuzz tests of this module: nothing stuck, still generating; and the fuzz
    reached both the model (200s) and the validation (400s)."""
    print(f"fuzz statuses: {dict(sorted(STATUSES.items()))}")
    assert STATUSES.get(200, 0) >= EXAMPLES // 4 and STATUSES.get(400, 0) >= EXAMPLES // 4
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
    assert httpx.post(f"{url}/generate", json=body, timeout=30).status_code == 200
    loads = httpx.get(f"{url}/v1/loads", timeout=5).json()["loads"][0]
    assert loads["num_running_reqs"] == 0 and loads["num_waiting_reqs"] == 0, loads
