"""Environments (kernel.env): the recipes' math and code environments score as their recipes do;
the environment server (``python -m kernel env serve``, started for real on 127.0.0.1) plays the
same episodes as the in-process environments, observation for observation; its errors name what
is wrong and it keeps serving; a run whose server is killed fails (masks) the episodes it
touched and recovers when the server returns; the gym recipe plays either the same way."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx
import pytest

from kernel.engine.launch import LaunchedProcess, free_port
from kernel.env import BadAction, EnvUnavailable, Observation
from kernel.env.server import EnvServerConfig
from kernel.env.spec import EnvSpec, env_specs
from kernel.hooks import RolloutContext
from kernel.rewards import RewardConfig
from kernel.rollout import RolloutManager
from kernel.sample import Sample, Status
from recipes.gym.generate import generate
from recipes.gym.reward import reward

KEY = "test-key"
SANDBOX = {"timeout_s": 5, "cpu_s": 5, "concurrency": 2}
ARGS = {"math": {"format_penalty": -0.5}, "code": {"max_turns": 2, "sandbox": SANDBOX}}
MATH = [
    {"prompt": "Calculate 5 - 3.", "label": "2"},
    {"prompt": "Calculate -62 * 51.", "label": "-3162"},
]
ACTIONS = ["So \\boxed{2}.", "\\boxed{5 - 3}", "The answer is 7.", "I cannot tell."]
CODE = {
    "prompt": 'def f(x):\n    """Return x + 3."""\n',
    "label": "def check(candidate):\n    assert candidate(0) == 3\n    assert candidate(5) == 8\n",
    "entry_point": "f",
}
WRONG, RIGHT = "def f(x):\n    return x + 2", "def f(x):\n    return x + 3"


def run(coro):
    return asyncio.run(coro)


def start_server(port: int, tmp_path, *extra: str, key: str = "") -> LaunchedProcess:
    command = [sys.executable, "-m", "kernel", "env", "serve", f"--port={port}"]
    command += ["--environments=math,code", f"--env_args={json.dumps(ARGS)}", *extra]
    url = f"http://127.0.0.1:{port}"
    env = {"TANDEM_API_KEY": key}  # the key in the environment, never on the command line
    server = LaunchedProcess.start("env server", url, command, tmp_path / f"env{port}.log", env)
    return server.wait_healthy(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    extra = [
        "--environments=math,code,slow=tests.hook_fixtures.envs.SlowEnv,"
        "broken=tests.hook_fixtures.envs.BrokenEnv",
        "--max_sessions=4",
        "--step_timeout_s=1",
    ]
    proc = start_server(free_port(), tmp_path_factory.mktemp("env"), *extra, key=KEY)
    yield proc.url
    proc.stop()


async def play(spec: EnvSpec, item: dict, actions: list[str]) -> list[Observation]:
    async with spec.session() as env:
        seen = [await env.reset(item)]
        for action in actions:
            seen.append(await env.step(action))
            if seen[-1].done:
                break
        return seen


def test_math_env_scores_as_the_recipe_and_refuses_what_it_cannot_take():
    spec = env_specs({"math": {"args": ARGS["math"]}})["math"]
    rewards = [run(play(spec, MATH[0], [a]))[-1] for a in ACTIONS]
    # a boxed restatement is no answer: the last number (3) is read instead, and it is wrong
    assert [o.reward for o in rewards] == [1.0, 0.0, 0.0, -0.5]
    assert all(o.done for o in rewards) and rewards[0].info == {"answer": "2", "correct": True}
    assert run(play(spec, MATH[0], []))[0].text.startswith("Calculate 5 - 3.")

    async def twice():
        async with spec.session() as env:
            await env.reset(MATH[0])
            await env.step("\\boxed{2}")
            await env.step("\\boxed{2}")

    with pytest.raises(BadAction, match="after the episode ended"):
        run(twice())
    with pytest.raises(BadAction, match="needs 'prompt' and 'label'"):
        run(play(spec, {"prompt": "Calculate 1 + 1."}, []))


def test_code_env_gives_feedback_until_the_tests_pass_or_tries_run_out():
    spec = EnvSpec("code", args=ARGS["code"])
    first, wrong, right = run(play(spec, CODE, [WRONG, RIGHT]))
    assert "def f(x)" in first.text and not wrong.done and wrong.text  # the recipe's feedback
    assert wrong.info["correct"] is False and wrong.info["checks_passed"] == 0.0
    assert right.done and right.info == {"status": "passed", "checks_passed": 1.0, "correct": True}
    assert right.reward > wrong.reward
    assert run(play(spec, CODE, [WRONG, WRONG, RIGHT]))[-1].done  # max_turns=2 ends it


def test_specs_name_what_is_wrong():
    with pytest.raises(ValueError, match="no known environment of that name"):
        env_specs({"chess": {}})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['urls'\]"):
        env_specs({"math": {"urls": "http://x"}})
    with pytest.raises(ValueError, match="args do not fit"):
        env_specs({"math": {"args": {"no_such_setting": 1}}})
    with pytest.raises(ValueError, match="must be http"):
        env_specs({"math": {"url": "127.0.0.1:8300"}})
    with pytest.raises(ValueError, match="env_args: \\['cod'\\] not among"):
        EnvServerConfig(environments="math", env_args={"cod": {}}).specs()
    with pytest.raises(ValueError, match="name at least one environment"):
        EnvServerConfig(environments=" , ").specs()


def test_the_server_plays_the_same_episodes_as_in_process(server):
    for name, item, actions in [
        *(("math", m, [a]) for m in MATH for a in ACTIONS),
        ("code", CODE, [WRONG, RIGHT]),
        ("code", CODE, [WRONG, WRONG]),
    ]:
        local = run(play(EnvSpec(name, args=ARGS[name]), item, actions))
        remote = run(play(EnvSpec(name, url=server, api_key=KEY), item, actions))
        assert remote == local, (name, item, actions)


def test_server_errors_name_what_is_wrong_and_it_keeps_serving(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=server, headers=auth, timeout=30) as http:
        assert (
            http.post("/sessions", json={"env": "math"}, headers={"Authorization": ""}).status_code
            == 401
        )
        r = http.post("/sessions", json={"env": "chess", "item": MATH[0]})
        assert r.status_code == 404 and "hosted: ['broken', 'code', 'math', 'slow']" in r.text
        assert http.post("/sessions", json={"item": MATH[0]}).status_code == 422
        r = http.post("/sessions", json={"env": "math", "item": {"prompt": "x"}})
        assert r.status_code == 400 and "needs 'prompt' and 'label'" in r.text
        assert http.post("/sessions/nope/step", json={"action": "1"}).status_code == 404
        sid = http.post("/sessions", json={"env": "math", "item": MATH[0]}).json()["session"]
        assert http.post(f"/sessions/{sid}/step", json={"action": "\\boxed{2}"}).status_code == 200
        r = http.post(f"/sessions/{sid}/step", json={"action": "\\boxed{2}"})
        assert r.status_code == 400 and "is over" in r.text
        assert http.delete(f"/sessions/{sid}").status_code == 200
        slow = http.post("/sessions", json={"env": "slow", "item": {}}).json()["session"]
        r = http.post(f"/sessions/{slow}/step", json={"action": "go"})
        assert r.status_code == 504 and "step_timeout_s=1" in r.text
        assert http.post(f"/sessions/{slow}/step", json={"action": "go"}).status_code == 404
        broken = http.post("/sessions", json={"env": "broken", "item": {}}).json()["session"]
        r = http.post(f"/sessions/{broken}/step", json={"action": "go"})
        assert r.status_code == 500 and "the environment's own bug" in r.text
        assert http.get("/health").json()["sessions"] == 0  # every failed session was closed

    async def full():
        """max_sessions=4: a fifth waits (429, retried) until one of the four closes."""
        spec = EnvSpec("math", url=server, api_key=KEY, timeout_s=10)
        held = [spec.open() for _ in range(4)]
        for env in held:
            await env.reset(MATH[0])
        with httpx.Client(base_url=server, headers=auth) as http:
            assert http.post("/sessions", json={"env": "math", "item": MATH[0]}).status_code == 429
        asyncio.get_running_loop().call_later(0.5, lambda: asyncio.ensure_future(held[0].close()))
        began = time.monotonic()
        seen = await play(spec, MATH[1], ["\\boxed{-3162}"])
        for env in held[1:]:
            await env.close()
        return seen[-1].reward, time.monotonic() - began

    reward_, waited = run(full())
    assert reward_ == 1.0 and waited >= 0.4


def episodes(agent_cls, tok, envs: dict[str, EnvSpec], n: int = 2):
    """One gym group of ``n`` math episodes, the agent scripted to answer right."""
    agent = agent_cls("default", tok, ["\\boxed{2}"] * n)
    ctx = RolloutContext(agents={"default": agent}, config={"env": "math"}, envs=envs)
    seeds = [
        Sample(prompt=MATH[0]["prompt"], label="2", index=i, metadata={"row": 0}) for i in range(n)
    ]
    manager = RolloutManager(generate, reward, RewardConfig(), concurrency=2, timeout_s=30)
    kept, _, stats = run(manager.run(ctx, [seeds]))
    return kept[0].samples, stats


def test_a_killed_server_masks_its_episodes_and_the_run_recovers(
    tmp_path, scripted_agent, smollm2_tokenizer
):
    port = free_port()
    remote = {"math": EnvSpec("math", url=f"http://127.0.0.1:{port}", timeout_s=5)}
    local = {"math": EnvSpec("math", args=ARGS["math"])}
    proc = start_server(port, tmp_path)
    try:
        played, _ = episodes(scripted_agent, smollm2_tokenizer, remote)
        same, _ = episodes(scripted_agent, smollm2_tokenizer, local)
        assert [s.raw_reward for s in played] == [s.raw_reward for s in same] == [1.0, 1.0]
        assert [s.response_ids for s in played] == [s.response_ids for s in same]
        assert played[0].metadata["metrics"]["math/correct"] == 1.0
    finally:
        proc.stop()
    lost, stats = episodes(scripted_agent, smollm2_tokenizer, remote)
    assert stats.failed == 2 and all(s.status is Status.FAILED for s in lost)
    assert "EnvUnavailable" in lost[0].metadata["error"] and f":{port}" in lost[0].metadata["error"]
    proc = start_server(port, tmp_path)  # back: the next episodes play again
    try:
        again, stats = episodes(scripted_agent, smollm2_tokenizer, remote)
        assert stats.failed == 0 and [s.raw_reward for s in again] == [1.0, 1.0]
    finally:
        proc.stop()
    with pytest.raises(EnvUnavailable):
        run(play(remote["math"], MATH[0], []))
