"""The environment server under hostile requests (issue 64), fast tier: a real ``python -m kernel
env serve`` process on 127.0.0.1 hosting math, code and tools (and two environments that
misbehave on purpose), driven as a policy or an attacker would.

- No secret on a command line: ``--api_key`` is refused (env serve, the engine, the retriever),
  the key comes from TANDEM_API_KEY or a file only its user may read.
- Bad headers are 401, never 500 (a non-ASCII Bearer header made the compare raise).
- Bad bodies are 4xx with a message that encodes (NaN, Infinity, lone surrogates, bytes that
  are not UTF-8, nesting past the parser, oversized bodies and actions).
- A tool error of any kind is an observation and the episode goes on (calculator overflow and
  recursion, file-tool OS errors, a retriever answering nonsense, code nested past the parser).
- No request stalls the server: while a step spins the CPU or scores a tower of powers,
  ``/health`` and another session answer within 100 ms (the median; the slowest under 1 s).
- A step past its deadline is 504 with its processes killed and its descriptors closed; a
  reset that fails holds no session.
- Every response in the suite is checked: none is a 500; the server's memory after a hostile
  barrage is within 20% of its start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from kernel.auth import UNAUTHORIZED, bearer_ok, read_key_file, refuse_key_flag, server_key
from kernel.engine.launch import LaunchedProcess, free_port
from kernel.env.workers import (
    BlockingWorker,
    WorkerFailed,
    WorkerLost,
    WorkerPool,
    WorkerTimeout,
)

KEY = "hostile-suite-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
STEP_TIMEOUT_S = 6
MATH = {"prompt": "Calculate 5 - 3.", "label": "2"}
SYMBOLIC = {"prompt": "Expand x times x.", "label": "x^2"}  # math-verify decides, not a number
TOOLS = {"prompt": "What is 4821 * 937?", "label": "4517277"}
CODE = {
    "prompt": 'def f(x):\n    """Return x + 3."""\n',
    "label": "def check(candidate):\n    assert candidate(0) == 3\n    assert candidate(5) == 8\n",
    "entry_point": "f",
}
RIGHT = "def f(x):\n    return x + 3"


class Server:
    """The server under test: its URL, PID, and resident memory when it came up."""

    def __init__(self, proc: LaunchedProcess) -> None:
        self.proc, self.url, self.pid = proc, proc.url, proc.pid
        self.rss_start = rss(self.pid)


def rss(pid: int) -> int:
    """Resident memory of ``pid`` in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def processes() -> dict[int, tuple[str, int]]:
    """PID -> (state, parent PID) of every process now."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
                table[int(name)] = (fields[0], int(fields[1]))
    return table


def below(pid: int) -> list[int]:
    """Live processes below ``pid``."""
    table, out, todo = processes(), [], [pid]
    while todo:
        parent = todo.pop()
        kids = [p for p, (state, pp) in table.items() if pp == parent and state != "Z"]
        out += kids
        todo += kids
    return out


def strays(pid: int) -> list[str]:
    """Live processes below ``pid`` that are not its worker machinery (the fork server, its
    workers, the resource tracker): what a step started and left behind."""
    out = []
    for p in below(pid):
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if "multiprocessing" not in cmd:
                out.append(f"{p}: {cmd[:120]}")
    return out


SEEN = {"responses": 0}


def never_500(response: httpx.Response) -> None:
    """Every response of the suite: never a 500, and its body always UTF-8 JSON."""
    response.read()
    SEEN["responses"] += 1
    assert response.status_code != 500, (response.request.url, response.text[:500])
    if response.status_code != 200 and response.request.url.path != "/health":
        error = json.loads(response.content.decode("utf-8"))["error"]
        assert isinstance(error["message"], str) and error["message"]


def client(url: str, **kwargs) -> httpx.Client:
    kwargs.setdefault("headers", AUTH)
    kwargs.setdefault("timeout", 60)
    return httpx.Client(base_url=url, event_hooks={"response": [never_500]}, **kwargs)


class _NonsenseRetriever(BaseHTTPRequestHandler):
    """A retriever that answers 200 with a shape no client expects."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = b'{"results": {"not": "a list"}}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def retriever():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _NonsenseRetriever)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def env_args(retriever_url: str) -> dict:
    tools = ["calculator", "python", "search", "write", "read"]
    return {
        "math": {"timeout_s": 1},
        "code": {"max_turns": 3, "sandbox": {"timeout_s": 5, "cpu_s": 5}},
        # a python cell may run past the step's deadline: the server's kill, not the sandbox's
        "tools": {"tools": tools, "retriever_url": retriever_url, "sandbox": {"timeout_s": 60}},
    }


def start(tmp_path: Path, retriever_url: str, *extra: str, env=None) -> LaunchedProcess:
    port = free_port()
    command = [sys.executable, "-m", "kernel", "env", "serve", f"--port={port}"]
    command += [
        "--environments=math,code,tools,spin=tests.hook_fixtures.envs.SpinEnv,"
        "fork=tests.hook_fixtures.envs.ForkEnv",
        f"--env_args={json.dumps(env_args(retriever_url))}",
        "--max_sessions=16",
        f"--step_timeout_s={STEP_TIMEOUT_S}",
        "--workers=6",
        *extra,
    ]
    url = f"http://127.0.0.1:{port}"
    proc = LaunchedProcess.start("env server", url, command, tmp_path / f"env{port}.log", env)
    return proc.wait_healthy(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory, retriever):
    proc = start(tmp_path_factory.mktemp("hostile"), retriever, env={"TANDEM_API_KEY": KEY})
    try:
        yield Server(proc)
    finally:
        proc.stop()


def open_session(http: httpx.Client, env: str, item: dict) -> str:
    r = http.post("/sessions", json={"env": env, "item": item})
    assert r.status_code == 200, r.text
    return r.json()["session"]


def act(http: httpx.Client, sid: str, action: str) -> httpx.Response:
    return http.post(f"/sessions/{sid}/step", json={"action": action})


def message(r: httpx.Response) -> str:
    return r.json()["error"]["message"]


# ---- no secret on a command line; one auth helper, never a 500 -------------------------------


def test_bearer_ok_never_raises_whatever_the_header():
    for header in [b"Bearer \xff\xfe", "Bearer ключ", "Bearer \ud800", b"", None, b"\x00" * 9]:
        assert bearer_ok(header, KEY) is False
    assert bearer_ok(f"Bearer {KEY}", KEY) and bearer_ok(f"Bearer {KEY}".encode(), KEY)
    assert bearer_ok("Bearer ключ".encode(), "ключ") and bearer_ok(b"anything", None)


def test_a_key_on_the_command_line_is_refused_by_all_three_servers():
    from kernel.cli import main as kernel_cli
    from kernel.engine.__main__ import parse_config
    from retriever.__main__ import parse as retriever_cli

    for argv in (["--api_key=k"], ["--api-key", "k"], ["--port", "1", "--api_key", "k"]):
        with pytest.raises(ValueError, match="TANDEM_API_KEY") as e:
            refuse_key_flag(argv)
        assert "--api_key_file" in str(e.value)
    refuse_key_flag(["--api_key_file=/x", "--port=1"])  # the file flag is fine
    with pytest.raises(SystemExit):
        kernel_cli(["env", "serve", "--api_key=secret-on-the-command-line"])
    with pytest.raises(SystemExit):
        parse_config(["--model", "m", "--api_key", "k"])
    with pytest.raises(ValueError, match="TANDEM_API_KEY"):
        retriever_cli(["serve", "--index", "i", "--api-key", "k"])


def test_a_key_file_must_be_this_users_alone(tmp_path):
    path = tmp_path / "key"
    path.write_text(f"{KEY}\n")
    for mode in (0o644, 0o640, 0o604, 0o620):
        path.chmod(mode)
        with pytest.raises(ValueError, match="chmod 600"):
            read_key_file(path)
    path.chmod(0o600)
    assert read_key_file(path) == KEY == server_key(path, environ={})
    link = tmp_path / "link"
    link.symlink_to(path)
    with pytest.raises(ValueError, match="cannot open"):
        read_key_file(link)
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "empty").chmod(0o600)
    with pytest.raises(ValueError, match="holds no key"):
        read_key_file(tmp_path / "empty")
    assert server_key(None, environ={"TANDEM_API_KEY": "e"}) == "e"
    assert server_key(None, environ={}) is None


def test_a_server_started_with_a_key_file_guards_its_routes_and_shows_no_key(tmp_path, retriever):
    path = tmp_path / "key"
    path.write_text(KEY)
    path.chmod(0o600)
    proc = start(tmp_path, retriever, f"--api_key_file={path}", env={"TANDEM_API_KEY": ""})
    try:
        for where in ("cmdline", "environ"):
            assert KEY.encode() not in Path(f"/proc/{proc.pid}/{where}").read_bytes()
        with client(proc.url, headers={}) as http:
            assert http.post("/sessions", json={"env": "math", "item": MATH}).status_code == 401
        with client(proc.url) as http:
            sid = open_session(http, "math", MATH)
            assert act(http, sid, "\\boxed{2}").json()["observation"]["reward"] == 1.0
    finally:
        proc.stop()
    path.chmod(0o644)  # group and others may read it now: the server refuses to start
    with pytest.raises(RuntimeError, match="chmod 600"):
        start(tmp_path, retriever, f"--api_key_file={path}")


def test_no_process_the_server_starts_inherits_its_key(server):
    """The server reads TANDEM_API_KEY and drops it: its fork server and workers (and so what
    they start) never hold it."""
    with client(server.url) as http:
        sid = open_session(http, "tools", TOOLS)
        assert act(http, sid, "<calculator>1+1</calculator>").status_code == 200
        http.delete(f"/sessions/{sid}")
    machinery = below(server.pid)
    assert len(machinery) >= 3  # the fork server, its workers, the resource tracker
    for pid in machinery:
        with contextlib.suppress(OSError):  # gone meanwhile
            assert KEY.encode() not in Path(f"/proc/{pid}/environ").read_bytes(), pid


def test_bad_authorization_headers_get_401_never_500(server):
    headers = [
        b"Bearer \xff\xfe\xfd",  # not UTF-8: the compare used to raise (500)
        "Bearer clé".encode("latin-1"),
        "Bearer ключ".encode(),
        b"Bearer",
        b"",
        b"Basic dXNlcjpwYXNz",
        f"Bearer {KEY}x".encode(),
        f"bearer {KEY}".encode(),
        ("Bearer " + "k" * 8000).encode(),
    ]
    with client(server.url, headers={}) as http:
        assert http.post("/sessions", json={"env": "math", "item": MATH}).status_code == 401
        for value in headers:
            for method, path in (("POST", "/sessions"), ("DELETE", "/sessions/x")):
                body = {"env": "math", "item": MATH} if method == "POST" else None
                r = http.request(method, path, json=body, headers={"Authorization": value})
                assert r.status_code == 401, (value[:20], r.status_code, r.text)
                assert message(r) == UNAUTHORIZED
        assert http.get("/health").status_code == 200


# ---- bad bodies: 4xx with a message that encodes ---------------------------------------------


BAD_OPEN = [
    (b'{"env": "math", "item": {"prompt": NaN, "label": "2"}}', 400),
    (b'{"env": "math", "item": {"prompt": "x", "label": Infinity}}', 400),
    (b'{"env": "math", "item": {"prompt": "x", "label": -Infinity}}', 400),
    (b'{"env": "\\ud800", "item": {}}', 400),
    (b'{"env": "math", "item": {"prompt": "\\udc00 hi", "label": "2"}}', 400),
    (b'{"env": "math", "item": {"prompt": "\xff\xfe", "label": "2"}}', 400),
    (b"[" * 100_000 + b"]" * 100_000, 400),
    (b'{"env": "math", "item": ' + b'{"a":' * 5000 + b"1" + b"}" * 5001, 400),
    (b"not json", 400),
    (b"", 400),
    (b'{"env": 5, "item": NaN}', 400),
    (b'{"env": 5}', 422),
    (b'{"env": "math", "item": []}', 422),
    (b'{"env": "chess", "item": {}}', 404),
]
BAD_STEP = [
    (b'{"action": NaN}', 400),
    (b'{"action": "\\ud800"}', 400),
    (b'{"action": "ok \\udfff"}', 400),
    (b'{"action": 5}', 422),
    (b"{}", 422),
    (b'{"action": ["a"]}', 422),
]


def test_malformed_bodies_get_4xx_with_an_encodable_message(server):
    with client(server.url) as http:
        for body, status in BAD_OPEN:
            r = http.post("/sessions", content=body, headers={"content-type": "application/json"})
            assert r.status_code == status, (body[:60], r.status_code, r.text[:300])
        sid = open_session(http, "tools", TOOLS)
        for body, status in BAD_STEP:
            r = http.post(
                f"/sessions/{sid}/step", content=body, headers={"content-type": "application/json"}
            )
            assert r.status_code == status, (body[:60], r.status_code, r.text[:300])
        r = http.post(f"/sessions/{sid}/step", content=b'{"action": "x"}')  # no content type
        assert r.status_code == 415
        assert act(http, sid, "<answer>4517277</answer>").json()["observation"]["reward"] == 1.0
        assert http.delete(f"/sessions/{sid}").status_code == 200


def test_oversized_bodies_and_actions_get_413(server):
    with client(server.url) as http:
        sid = open_session(http, "tools", TOOLS)
        r = act(http, sid, "<calculator>1+1</calculator>" + "x" * 250_000)
        assert r.status_code == 413 and "max_action_chars" in message(r)
        big = b'{"action": "' + b"y" * (5 * 2**20) + b'"}'
        r = http.post(
            f"/sessions/{sid}/step", content=big, headers={"content-type": "application/json"}
        )
        assert r.status_code == 413 and "max_body_mb" in message(r)

        def streamed():  # no Content-Length: counted as it arrives
            yield b'{"action": "'
            for _ in range(6):
                yield b"z" * 2**20
            yield b'"}'

        r = http.post(
            f"/sessions/{sid}/step",
            content=streamed(),
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 413
        assert act(http, sid, "<calculator>2+3</calculator>").json()["observation"]["text"] == "5"
        http.delete(f"/sessions/{sid}")


# ---- every tool error is an observation; the episode goes on ---------------------------------


def test_tool_errors_are_observations_and_the_episode_goes_on(server):
    errors = [
        ("<calculator>1e300**2</calculator>", "calculator error: a number in it is too large"),
        ("<calculator>1e39 ** 64</calculator>", "calculator error: the result is too large"),
        ("<calculator>" + "-" * 2000 + "1</calculator>", "calculator error: the expression is"),
        ("<calculator>" + "(" * 500 + "1" + ")" * 500 + "</calculator>", "calculator error:"),
        ("<calculator>0x" + "f" * 130_000 + " ** 64</calculator>", "calculator error:"),
        ("<calculator>(-8) ** 0.5</calculator>", "calculator error: the result is not a real"),
        (f'<write path="{"a" * 300}.txt">x</write>', "write error:"),
        ('<write path="notes.txt/inner.txt">y</write>', "write error:"),
        ('<write path="' + "d/" * 40 + 'f.txt">z</write>', "write error:"),
        ("<read>notes.txt/inner.txt</read>", "read error:"),
        ("<search>cats</search>", "search error: the retriever answered in an unexpected shape"),
    ]
    with client(server.url) as http:
        sid = open_session(http, "tools", TOOLS)
        assert act(http, sid, '<write path="notes.txt">4517277</write>').status_code == 200
        for action, expected in errors:
            r = act(http, sid, action)
            assert r.status_code == 200, (action[:60], r.status_code, r.text[:300])
            obs = r.json()["observation"]
            assert obs["text"].startswith(expected) and not obs["done"], (action[:60], obs)
            assert "/tmp" not in obs["text"]  # no server path in an OS error
        obs = act(http, sid, "<read>notes.txt</read>").json()["observation"]
        assert obs["text"] == "4517277"
        obs = act(http, sid, "<answer>4517277</answer>").json()["observation"]
        assert obs["done"] and obs["reward"] == 1.0 and obs["info"]["errors"] == len(errors)
        http.delete(f"/sessions/{sid}")


def test_code_nested_past_the_parser_is_scored_not_a_500(server):
    deep = "```python\ndef f(x):\n    return " + "-" * 100_000 + "x\n```"
    attrs = "def f(x):\n    return x" + ".a" * 50_000
    comment = "def f(x):\n    # " + "c" * 190_000 + "\n    return x + 2"
    with client(server.url) as http:
        sid = open_session(http, "code", CODE)
        for reply in (deep, attrs):
            obs = act(http, sid, reply).json()["observation"]
            assert obs["info"]["status"] == "syntax_error" and obs["reward"] == 0.0
        http.delete(f"/sessions/{sid}")
        sid = open_session(http, "code", CODE)
        obs = act(http, sid, comment).json()["observation"]
        assert obs["info"]["status"] == "failed" and not obs["done"]
        obs = act(http, sid, RIGHT).json()["observation"]
        assert obs["done"] and obs["info"]["correct"] is True
        http.delete(f"/sessions/{sid}")


# ---- no request stalls the server ------------------------------------------------------------


def timed(fn) -> tuple[float, httpx.Response]:
    began = time.perf_counter()
    r = fn()
    return time.perf_counter() - began, r


def test_a_stuck_step_never_delays_health_or_another_session(server):
    """A step that holds the CPU for 3 s in code that never yields (on the server's event loop
    it would stall every request): /health and another session's steps answer within 100 ms
    the whole time."""
    with client(server.url) as http, client(server.url) as other:
        spin = open_session(http, "spin", {})
        sid = open_session(other, "tools", TOOLS)
        assert act(other, sid, "<calculator>1+1</calculator>").status_code == 200  # warm
        done = {}
        stuck = threading.Thread(target=lambda: done.update(r=act(http, spin, "3")))
        began = time.monotonic()
        stuck.start()
        time.sleep(0.3)
        health, steps = [], []
        while time.monotonic() - began < 2.5:
            seconds, r = timed(lambda: other.get("/health"))
            assert r.status_code == 200
            health.append(seconds)
            seconds, r = timed(lambda: act(other, sid, "<calculator>6*7</calculator>"))
            assert r.json()["observation"]["text"] == "42"
            steps.append(seconds)
        stuck.join(30)
        assert done["r"].status_code == 200
        assert float(done["r"].json()["observation"]["text"].split()[1]) >= 3.0
        assert time.monotonic() - began >= 3.0  # it was stuck all along the measurements
        print(
            f"while stuck: /health max {max(health) * 1e3:.1f} ms over {len(health)}, "
            f"another session's step max {max(steps) * 1e3:.1f} ms over {len(steps)}"
        )
        # On the event loop the spin would hold every request for the rest of its 3 s; a loaded
        # machine (2 cores, a test neighbour) can delay a single answer by a scheduling slice,
        # so the typical answer is held to 100 ms and the slowest far below a stall.
        assert statistics.median(health) < 0.1 and max(health) < 1.0, health
        assert statistics.median(steps) < 0.1 and max(steps) < 1.0, steps
        for s in (spin, sid):
            http.delete(f"/sessions/{s}")


def test_cpu_heavy_actions_answer_in_bounded_time_and_never_stall_health(server):
    """The actions that stalled the server for seconds: 60 KB of unclosed tags (a quadratic
    scan), a 130 KB hex power for the calculator, a tower of powers for math-verify, a long
    comment line for the code environment. Each is answered (the tower scored within
    math-verify's own 1 s limit, in the worker's main thread) while /health stays fast."""
    unclosed = "<calculator>" * 5000
    hostile = [
        # bounds: answered, not frozen (each froze the server for seconds to over a minute);
        # loose enough for a loaded machine
        ("tools", TOOLS, unclosed, 10.0),
        ("tools", TOOLS, "<python>" * 7500, 10.0),
        ("tools", TOOLS, "<calculator>0x" + "f" * 130_000 + " ** 64</calculator>", 10.0),
        ("math", SYMBOLIC, "\\boxed{9^{9^{9^{9}}}}", 15.0),
        ("code", CODE, "def f(x):\n    # " + "c" * 190_000 + "\n    return x + 3", 15.0),
    ]
    with client(server.url) as http:
        sids = [open_session(http, env, item) for env, item, _, _ in hostile]
        results: dict[int, tuple[float, httpx.Response]] = {}

        def one(i: int) -> None:
            with client(server.url) as own:
                results[i] = timed(lambda: act(own, sids[i], hostile[i][2]))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(hostile))]
        for t in threads:
            t.start()
        health = []
        while any(t.is_alive() for t in threads):
            seconds, r = timed(lambda: http.get("/health"))
            health.append(seconds)
            time.sleep(0.02)
        for i, (env, _, action, bound) in enumerate(hostile):
            seconds, r = results[i]
            assert r.status_code == 200, (env, action[:40], r.status_code, r.text[:300])
            assert seconds < bound, (env, action[:40], seconds)
        math_obs = results[3][1].json()["observation"]
        assert math_obs["reward"] == 0.0 and math_obs["done"]
        print(f"/health max {max(health) * 1e3:.1f} ms over {len(health)} during hostile actions")
        assert statistics.median(health) < 0.1 and max(health) < 1.0, health  # as above
        for sid in sids:
            http.delete(f"/sessions/{sid}")


# ---- deadlines kill what the step started; failures hold nothing ---------------------------


def test_a_step_past_its_deadline_is_killed_with_its_processes_and_descriptors(server, tmp_path):
    with client(server.url) as http:
        sids = {
            "fork": open_session(http, "fork", {}),
            "loop": open_session(http, "tools", TOOLS),
        }
        # the python cell runs in the sandbox, whose own limit (60 s) is past the deadline
        actions = {"fork": str(tmp_path / "pid"), "loop": "<python>while True: pass</python>"}
        before = fds(server.pid)
        answers = {}

        def one(name: str) -> None:
            with client(server.url) as own:
                answers[name] = act(own, sids[name], actions[name])

        threads = [threading.Thread(target=one, args=(n,)) for n in sids]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for name, r in answers.items():
            assert r.status_code == 504, (name, r.status_code, r.text)
            assert f"step_timeout_s={STEP_TIMEOUT_S}" in message(r)
            assert act(http, sids[name], "again").status_code == 404  # the session was closed
        sleeper = int((tmp_path / "pid").read_text())
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and (strays(server.pid) or _alive(sleeper)):
            time.sleep(0.1)
        assert not _alive(sleeper), "the step's own process outlived its deadline"
        assert strays(server.pid) == []
        assert fds(server.pid) <= before, (before, fds(server.pid))
        assert http.get("/health").json()["status"] == "ok"


def test_the_worker_pool_answers_kills_and_replaces_its_workers():
    """kernel.env.workers on its own: a result, the call's own error by type, a deadline that
    kills the worker (the next call gets a fresh one), a worker that dies mid-call."""

    async def main():
        pool = WorkerPool(2)
        try:
            assert await pool.run(10, pow, 2, 10) == 1024
            with pytest.raises(WorkerFailed, match="ValueError: invalid literal"):
                await pool.run(10, int, "x")
            began = time.monotonic()
            with pytest.raises(WorkerTimeout):
                await pool.run(0.5, time.sleep, 60)
            assert time.monotonic() - began < 5 and pool.killed == 1
            with pytest.raises(WorkerLost):
                await pool.run(10, os._exit, 3)
            assert await pool.run(10, sum, [1, 2, 3]) == 6  # fresh workers answer
            assert pool.started <= 2
        finally:
            pool.close()

    asyncio.run(main())


def test_the_blocking_worker_answers_kills_and_replaces_its_worker():
    """BlockingWorker (a scorer's boundary): a result, the call's own error by type, a deadline
    that kills the worker, a worker that dies mid-call, one killed between calls (the next call
    still answers), and calls from threads that have ended since."""
    worker = BlockingWorker()
    try:
        assert worker.call(10, pow, 2, 10) == 1024
        first = worker._proc.pid
        with pytest.raises(WorkerFailed, match="ValueError: invalid literal"):
            worker.call(10, int, "x")
        began = time.monotonic()
        with pytest.raises(WorkerTimeout):
            worker.call(0.5, time.sleep, 60)
        assert time.monotonic() - began < 10 and worker.killed == 1
        assert not _alive(first)
        with pytest.raises(WorkerLost):
            worker.call(10, os._exit, 3)
        assert worker.call(10, sum, [1, 2, 3]) == 6
        os.kill(worker._proc.pid, 9)
        worker._proc.wait(10)
        assert worker.call(10, sum, [4]) == 4  # died between calls: no call lost
        out: list = []
        t = threading.Thread(target=lambda: out.append(worker.call(10, pow, 3, 2)))
        t.start()
        t.join()
        time.sleep(0.2)
        assert out == [9] and worker.call(10, pow, 2, 3) == 8  # alive after that thread ended
    finally:
        worker.close()


def test_a_blocking_worker_busy_in_c_dies_with_its_caller(tmp_path):
    """A caller killed while its worker computes a huge power (C code holding the GIL: the
    worker's own threads cannot run) leaves no worker behind."""
    script = tmp_path / "caller.py"
    script.write_text(
        "import os, sys, threading, time\n"
        "from kernel.env.workers import BlockingWorker\n"
        "w = BlockingWorker()\n"
        "w.call(30, pow, 2, 2)\n"
        "print(w._proc.pid, flush=True)\n"
        "threading.Thread(target=w.call, args=(None, pow, 9, 9**9**2), daemon=True).start()\n"
        "time.sleep(1)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    pid = int(run.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_failed_resets_hold_no_session(server):
    """A reset the server cannot answer used to leave its session open (500, its id never
    told): ~512 of them filled max_sessions. Here max_sessions is 16 and 40 resets fail."""
    raw = {"content-type": "application/json"}
    with client(server.url) as http:
        open_before = http.get("/health").json()["sessions"]
        for i in range(40):
            body = b'{"env": "tools", "item": {"prompt": "\\ud800 %d", "label": "1"}}' % i
            assert http.post("/sessions", content=body, headers=raw).status_code == 400
        for _ in range(5):
            r = http.post("/sessions", json={"env": "math", "item": {"prompt": "no label"}})
            assert r.status_code == 400 and "needs 'prompt' and 'label'" in message(r)
        assert http.get("/health").json()["sessions"] == open_before
        sids = [open_session(http, "math", MATH) for _ in range(16 - open_before)]
        assert http.post("/sessions", json={"env": "math", "item": MATH}).status_code == 429
        for sid in sids:
            assert http.delete(f"/sessions/{sid}").status_code == 200


# ---- the whole barrage: no 500, memory flat --------------------------------------------------


def barrage(url: str) -> None:
    """One round of the fast hostile requests above."""
    raw = {"content-type": "application/json"}
    with client(url) as http, client(url, headers={}) as anonymous:
        for value in (b"Bearer \xff\xfe", "Bearer ключ".encode(), b""):
            r = anonymous.post("/sessions", json={}, headers={"Authorization": value})
            assert r.status_code == 401
        for body, status in BAD_OPEN:
            assert http.post("/sessions", content=body, headers=raw).status_code == status
        sid = open_session(http, "tools", TOOLS)
        for body, status in BAD_STEP:
            assert (
                http.post(f"/sessions/{sid}/step", content=body, headers=raw).status_code == status
            )
        big = b'{"action": "' + b"y" * (5 * 2**20) + b'"}'
        assert http.post(f"/sessions/{sid}/step", content=big, headers=raw).status_code == 413
        for action in (
            "<calculator>1e300**2</calculator>",
            "<calculator>" + "-" * 2000 + "1</calculator>",
            f'<write path="{"a" * 300}">x</write>',
            "<search>cats</search>",
            "<calculator>" * 5000,
            "x" * 250_000,
        ):
            assert act(http, sid, action).status_code in (200, 413)
        assert act(http, sid, "<answer>4517277</answer>").json()["observation"]["done"]
        http.delete(f"/sessions/{sid}")
        code = open_session(http, "code", CODE)
        act(http, code, "def f(x):\n    return " + "-" * 100_000 + "x")
        http.delete(f"/sessions/{code}")
        for i in range(10):
            body = b'{"env": "math", "item": {"prompt": "\\ud800 %d", "label": "1"}}' % i
            assert http.post("/sessions", content=body, headers=raw).status_code == 400


def test_the_hostile_barrage_gets_no_500_and_memory_stays_flat(server):
    began = SEEN["responses"]
    for _ in range(4):
        barrage(server.url)
    after = rss(server.pid)
    print(
        f"{SEEN['responses'] - began} hostile requests; server RSS "
        f"{server.rss_start / 2**20:.0f} MiB at start, {after / 2**20:.0f} MiB after"
    )
    assert after <= 1.2 * server.rss_start, (server.rss_start, after)
    with client(server.url) as http:
        assert http.get("/health").json()["sessions"] == 0
