"""The gateway (kernel.gateway): a program written for OpenAI's chat API, trained unmodified.

Each test starts the real gateway (uvicorn on 127.0.0.1) and talks to it with the ``openai``
client or httpx. Agents are real embedded engines (the tiny Qwen2 model) or, where a test must
know what the agent samples (a tool call, in a tokenization the tokenizer would not produce
itself), a scripted agent whose turns go through the same Conversation and Dialogue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
from dataclasses import dataclass

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import OpenAI

from kernel.cli import train_config
from kernel.conversation import Conversation
from kernel.engine.client import EngineClient
from kernel.gateway.hooks import GatewayConfig, generate, reward, running_for
from kernel.hooks import HookError, RolloutContext
from kernel.rewards import RewardConfig
from kernel.rollout import EpisodeAborted, RolloutManager
from kernel.run.agents import AgentHandle
from kernel.run.config import GATEWAY_HOOKS
from kernel.sample import Sample, Status
from tests.conftest import _loss_spans

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        },
    },
}


@dataclass
class Said:
    output_ids: list[int]
    logprobs: list[float]
    weight_version: str | None = "0"
    finish_type: str = "stop"


class Scripted:
    """An agent whose turns are the given texts, sampled one character a token (ids the
    tokenizer would merge when encoding the text), through the real Conversation."""

    def __init__(self, name, tokenizer, turns=(), delay_s: float = 0.0, abort: bool = False):
        self.name, self.tokenizer, self.turns = name, tokenizer, list(turns)
        self.delay_s, self.abort, self.sampled = delay_s, abort, []

    def conversation(self, system=None, **kwargs):
        return Conversation(self.tokenizer, 4096, system=system)

    async def generate_turn(self, conv, sampling=None, prefix=""):
        await asyncio.sleep(self.delay_s)
        if self.abort:
            raise EpisodeAborted("the engine aborted the request (weights updated)")
        text = self.turns.pop(0) if self.turns else "fine"
        ids = [self.tokenizer.convert_tokens_to_ids(self.tokenizer.tokenize(c))[0] for c in text]
        ids.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.sampled.append(ids)
        said = Said(ids, [-0.5] * len(ids))
        conv.add_generation(said.output_ids, said.logprobs, 0)
        return said


class Spy(AgentHandle):
    """A real engine's agent that remembers the ids each of its turns was sampled as."""

    sampled: list

    async def generate(self, input_ids, sampling=None):
        reply = await super().generate(input_ids, sampling)
        self.sampled.append(list(reply.output_ids))
        return reply


def spy(name, url, tokenizer) -> Spy:
    agent = Spy(name, [EngineClient(url)], tokenizer, {"temperature": 1.0}, 12, 2048)
    agent.sampled = []
    return agent


async def episode(ctx: RolloutContext, row: dict, index: int = 0):
    seed = Sample(prompt=row.get("prompt", "p"), label=None, metadata=dict(row), index=index)
    return await generate(ctx, seed)


async def closed(ctx: RolloutContext, coro):
    """``coro``, then the run's closers (the gateway's server), as a run ends."""
    try:
        return await coro
    finally:
        for close in ctx.closers:
            await close()


SEEN: list = []  # what program_with_a_tool saw (it runs in the gateway's thread pool)


def program_with_a_tool(base_url, api_key, episode_id, row):
    """Three turns, two agents: the writer calls a tool, gets its result and answers; the
    critic reviews the answer."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "What is 2 + 3?"},
    ]
    first = client.chat.completions.create(model="writer", messages=messages, tools=[ADD])
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    args = json.loads(call.function.arguments)
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append(
        {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])}
    )
    answer = client.chat.completions.create(model="writer", messages=messages, tools=[ADD])
    text = answer.choices[0].message.content
    review = client.chat.completions.create(
        model="critic", messages=[{"role": "user", "content": f"Review: {text}"}], temperature=0.2
    )
    SEEN[:] = [call.function.name, args, text, review.choices[0].message.content]
    return {"writer": 1.0 if text == "The sum is 5." else 0.0, "critic": 0.5}


def test_a_three_turn_two_agent_episode_with_a_tool_call_trains_the_sampled_ids(tiny_engine):
    url, tok = tiny_engine
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    writer = Scripted("writer", tok, [call, "The sum is 5."])
    critic = spy("critic", url, tok)
    ctx = RolloutContext(agents={"writer": writer, "critic": critic})
    ctx.config = GatewayConfig(program=f"{__name__}.program_with_a_tool")
    row = {"prompt": "p"}
    samples = asyncio.run(closed(ctx, episode(ctx, row)))

    assert SEEN[:3] == ["add", {"a": 2, "b": 3}, "The sum is 5."]
    by_agent = {s.agent: s for s in samples}
    assert sorted(by_agent) == ["critic", "writer"] and len(samples) == 2  # one thread each
    w, c = by_agent["writer"], by_agent["critic"]
    # the writer's second call extended its first: both turns in one sample, trained exactly
    # as sampled (one character a token), the tool's result and the template's tokens masked
    assert _loss_spans(w) == writer.sampled
    assert _loss_spans(c) == critic.sampled
    assert (w.metadata["gateway_reward"], c.metadata["gateway_reward"]) == (1.0, 0.5)
    assert w.status is Status.COMPLETED and w.metadata["episode"] == c.metadata["episode"]
    assert reward(ctx, samples) == [s.metadata["gateway_reward"] for s in samples]
    # logged as episode/...: the critic's temperature was not used (it samples at its own)
    assert samples[0].metadata["metrics"] == {"calls": 3, "threads": 2, "ignored_sampling": 1}
    # what re-tokenizing the text would have trained instead: other ids, fewer of them
    for ids in writer.sampled:
        text = tok.decode(ids[:-1])
        assert tok.encode(text, add_special_tokens=False) != ids[:-1]
        assert len(tok.encode(text, add_special_tokens=False)) < len(ids) - 1
    # the tool definitions and the tool's result are in the writer's context, not its loss
    prompt = tok.decode(w.prompt_ids)
    assert '"name": "add"' in prompt and "<tools>" in prompt
    masked = tok.decode([t for t, m in zip(w.response_ids, w.loss_mask, strict=True) if not m])
    assert "5" in masked and "tool" in masked


def test_the_example_program_runs_unchanged_against_the_embedded_engine(tiny_engine):
    """recipes/writer_critic/program.py against the engine's own /v1 (no gateway, no
    training): the same code the gateway trains."""
    from recipes.writer_critic.program import run

    url, _ = tiny_engine
    row = {"prompt": "Describe a river using the words 'cold' and 'stone'.", "keywords": []}
    rewards = run(f"{url}/v1", "none", "local", row)
    assert set(rewards) == {"writer", "critic"} and 0 <= rewards["writer"] <= 1


def digits_program(base_url, api_key, episode_id, row):
    """What ``row["do"]`` says: answer (two calls), raise, call nothing, give no reward, post the
    reward instead of returning it, or sleep past the episode's deadline."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    do = row["do"]
    if do == "sleep":
        time.sleep(3)
    if do == "silent":
        return 1.0
    if do == "raise":
        raise RuntimeError("the program's own bug")
    messages = [{"role": "user", "content": row["prompt"]}]
    first = client.chat.completions.create(model="a", messages=messages, max_tokens=4)
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "user", "content": "again"}]
    second = client.chat.completions.create(model="b", messages=messages, max_tokens=4)
    text = second.choices[0].message.content
    score = sum(ch.isdigit() for ch in text) / max(len(text), 1)
    if do == "post":
        key = {"Authorization": f"Bearer {api_key}"}
        root = base_url.split("/episodes/")[0]
        httpx.post(f"{root}/v1/episodes/{episode_id}/reward", json={"reward": score}, headers=key)
        return None
    return None if do == "no_reward" else score


def test_64_concurrent_episodes_each_trained_once_or_masked_and_counted(tiny_engine):
    url, tok = tiny_engine
    agents = {"a": spy("a", url, tok), "b": spy("b", url, tok)}
    ctx = RolloutContext(agents=agents, config=GatewayConfig(program=f"{__name__}.digits_program"))
    kinds = ["ok"] * 11 + ["post"] * 2 + ["raise", "silent", "no_reward"]  # 16: 4 groups of 4
    groups = [
        [
            Sample(prompt=f"count {g}", label=None, group_id=g, index=i, metadata={"do": kind})
            for i, kind in enumerate(kinds[4 * (g % 4) : 4 * (g % 4) + 4])
        ]
        for g in range(16)
    ]
    manager = RolloutManager(generate, reward, RewardConfig(), concurrency=64, timeout_s=120)

    async def roll():
        run = await running_for(ctx, ctx.config)
        kept, aborted, stats = await manager.run(ctx, groups)
        return kept, aborted, stats, len(run.gateway.episodes)

    kept, aborted, stats, still_open = asyncio.run(closed(ctx, roll()))
    samples = [s for r in kept for s in r.samples]
    assert stats.episodes == 64 and not aborted and still_open == 0
    assert stats.failed == 4 * 3  # raise, silent, no_reward in each group's share
    failed = [s for s in samples if s.status is Status.FAILED]
    assert sorted(s.metadata["do"] for s in failed) == sorted(["raise", "silent", "no_reward"] * 4)
    trained = [s for s in samples if s.status.trainable]
    assert len(trained) == 2 * (64 - 12)  # a and b once each per answered episode
    assert len({(s.group_id, s.index, s.agent, s.turn) for s in trained}) == len(trained)
    assert all(s.reward is not None for s in trained)  # posted rewards arrived too
    posted = [s for s in trained if s.metadata["do"] == "post"]
    assert len(posted) == 2 * 8 and all(s.raw_reward is not None for s in posted)
    # every call sampled once by its agent's engine: the answered episodes' and, masked,
    # the four that gave no reward
    assert [len(a.sampled) for a in agents.values()] == [52 + 4, 52 + 4]


def test_an_episode_past_its_deadline_is_masked_and_its_late_calls_refused(tiny_engine):
    url, tok = tiny_engine
    ctx = RolloutContext(
        agents={"a": spy("a", url, tok), "b": spy("b", url, tok)},
        config=GatewayConfig(program=f"{__name__}.digits_program"),
    )
    seeds = [[Sample(prompt="p", label=None, metadata={"do": "sleep"})]]
    manager = RolloutManager(generate, reward, RewardConfig(), concurrency=4, timeout_s=1)

    async def roll():
        run = await running_for(ctx, ctx.config)
        kept, _, stats = await manager.run(ctx, seeds)
        await asyncio.sleep(3)  # the program wakes up and calls a closed episode: 404
        return kept, stats, run.gateway.episodes

    kept, stats, episodes = asyncio.run(closed(ctx, roll()))
    assert stats.timed_out == 1 and kept[0].samples[0].status is Status.FAILED
    assert episodes == {} and ctx.agents["a"].sampled == []


def test_an_engine_abort_sends_the_group_back_and_the_program_sees_503(smollm2_tokenizer):
    tok = smollm2_tokenizer
    agents = {"a": Scripted("a", tok, abort=True), "b": Scripted("b", tok)}
    ctx = RolloutContext(agents=agents, config=GatewayConfig(program=f"{__name__}.digits_program"))
    group = [Sample(prompt="p", label=None, index=i, metadata={"do": "ok"}) for i in range(2)]
    manager = RolloutManager(generate, reward, RewardConfig(), concurrency=4, timeout_s=30)
    kept, aborted, stats = asyncio.run(closed(ctx, manager.run(ctx, [group])))
    assert kept == [] and len(aborted) == 1 and stats.aborted_groups == 1 and stats.failed == 0


def test_a_client_that_disconnects_mid_call_leaves_nothing_hanging(smollm2_tokenizer):
    """A call the client gave up on still completes in its thread; the episode ends, the
    gateway closes, and the reply the client never read is recorded as sampled."""
    tok = smollm2_tokenizer
    agents = {"a": Scripted("a", tok, ["hello"], delay_s=1.0)}
    ctx = RolloutContext(agents=agents, config=GatewayConfig(program=f"{__name__}.gives_up"))
    samples = asyncio.run(closed(ctx, episode(ctx, {"prompt": "p"})))
    assert [s.agent for s in samples] == ["a"] and _loss_spans(samples[0]) == agents["a"].sampled


def gives_up(base_url, api_key, episode_id, row):
    with contextlib.suppress(httpx.TimeoutException):
        httpx.post(
            f"{base_url}/chat/completions",
            json={"model": "a", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=0.2,
        )
    time.sleep(3)  # the agent's turn (1 s) finishes meanwhile, with room on a busy machine
    return 1.0


def loops(base_url, api_key, episode_id, row):
    """A program that keeps calling: the episode's max_calls stops it with 429."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    answered = 0
    while answered < 100:
        try:
            client.chat.completions.create(model="a", messages=[{"role": "user", "content": "x"}])
        except openai.RateLimitError as e:
            assert e.status_code == 429 and e.body["code"] == "too_many_calls"
            break
        answered += 1
    SEEN[:] = [answered]
    return 1.0


def test_an_episode_cannot_make_more_calls_than_max_calls(smollm2_tokenizer):
    agents = {"a": Scripted("a", smollm2_tokenizer)}
    ctx = RolloutContext(agents=agents, config=GatewayConfig(program=f"{__name__}.loops"))
    ctx.config.max_calls = 5
    samples = asyncio.run(closed(ctx, episode(ctx, {"prompt": "p"})))
    assert SEEN == [5] and len(agents["a"].sampled) == len(samples) == 5


def two_turns(base_url, api_key, episode_id, row):
    """Two turns of one agent in one dialogue; the first turn's reward posted by its id."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    first = client.chat.completions.create(model="a", messages=messages)
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "user", "content": "and then?"}]
    client.chat.completions.create(model="a", messages=messages)
    root = base_url.split("/episodes/")[0]
    body = {"completion_id": first.id, "reward": 0.25}
    headers = {"Authorization": f"Bearer {api_key}"}
    assert httpx.post(
        f"{root}/v1/episodes/{episode_id}/reward", json=body, headers=headers
    ).is_success
    return {"a": 1.0}


def test_credit_per_call_gives_each_turn_its_own_sample_and_reward(smollm2_tokenizer):
    """recipe_args.credit: call: each call's turn is a sample that trains only it (the turns
    before are its context), paid what was posted for its completion id, else the agent's."""
    agents = {"a": Scripted("a", smollm2_tokenizer, ["one", "two"])}
    cfg = GatewayConfig(program=f"{__name__}.two_turns", credit="call")
    ctx = RolloutContext(agents=agents, config=cfg)
    samples = asyncio.run(closed(ctx, episode(ctx, {"prompt": "p"})))
    assert [(s.agent, s.turn) for s in samples] == [("a", 0), ("a", 1)]
    assert [s.metadata["gateway_reward"] for s in samples] == [0.25, 1.0]
    assert [_loss_spans(s) for s in samples] == [[ids] for ids in agents["a"].sampled]
    first, second = samples
    assert second.response_ids[: first.response_length] == first.response_ids  # its context


SCRIPT = """
import json, os
import openai
from openai import OpenAI

row = json.loads(os.environ["TANDEM_ROW"])
client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
reply = client.chat.completions.create(
    model="a", messages=[{"role": "user", "content": row["prompt"]}]
)
print("some log line")
print(json.dumps({"a": len(reply.choices[0].message.content) / 10}))
"""


def test_a_command_program_reads_the_standard_openai_environment(tmp_path, smollm2_tokenizer):
    script = tmp_path / "agents.py"
    script.write_text(SCRIPT)
    agents = {"a": Scripted("a", smollm2_tokenizer, ["12345"])}
    ctx = RolloutContext(agents=agents, config=GatewayConfig(command=[sys.executable, str(script)]))
    (s,) = asyncio.run(closed(ctx, episode(ctx, {"prompt": "Count."})))
    assert s.agent == "a" and s.metadata["gateway_reward"] == 0.5


class LoopThread:
    """An event loop in a thread of its own: the gateway serves there while this thread calls
    it with a blocking client."""

    def __enter__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        return self

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def served(smollm2_tokenizer):
    """(base URL, key, an open episode's id, the gateway) on scripted agents."""
    agents = {"a": Scripted("a", smollm2_tokenizer, ["ok"] * 10_000)}
    config = GatewayConfig(program=f"{__name__}.gives_up", max_calls=10_000)
    ctx = RolloutContext(agents=agents, config=config)
    with LoopThread() as lt:
        run = lt.run(running_for(ctx, ctx.config))
        episode_ = run.gateway.open()
        yield run.base_url, run.api_key, episode_.id, run.gateway
        for close in ctx.closers:
            lt.run(close())


def _post(served, path, body, headers=None, raw=None):
    url, key, _, _ = served
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"} | (
        headers or {}
    )
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(f"{url}{path}", content=content, headers=headers, timeout=30)


def _chat(episode_id, **extra):
    return {
        "model": "a",
        "messages": [{"role": "user", "content": "hi"}],
        "user": episode_id,
    } | extra


def test_bad_requests_get_4xx_in_openais_error_shape_never_5xx(served):
    _, _, eid, _ = served
    path = "/v1/chat/completions"
    cases = [
        (path, None, b"{not json", 400, None),
        (path, None, b'{"model": "a", "messages": NaN}', 400, None),
        (path, None, b"\xff\xfe", 400, None),
        (path, None, b"[" * 100_000 + b"]" * 100_000, 400, None),
        (path, _chat(eid, model="nobody"), None, 404, "model"),
        (path, _chat("not-an-episode"), None, 404, "user"),
        (path, _chat(None), None, 400, "user"),
        (path, _chat(eid, n=100), None, 400, "n"),
        (path, _chat(eid, stream=True), None, 400, "stream"),
        (path, _chat(eid, max_tokens=0), None, 400, "max_tokens"),
        (path, _chat(eid, messages=[]), None, 400, "messages"),
        (path, _chat(eid, messages=[{"role": "wizard", "content": "x"}]), None, 400, None),
        (path, _chat(eid, messages=[{"role": "user", "content": 7}]), None, 400, None),
        (path, _chat(eid, n="two"), None, 400, "n"),
        (
            path,
            _chat(eid, messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
            None,
            400,
            None,
        ),
        (path, _chat(eid, messages=[{"role": "user", "content": "a " * 5_000}]), None, 400, None),
        (path, None, b"x" * (9 << 20), 413, None),
        (f"/v1/episodes/{eid}/reward", {"reward": "high"}, None, 400, "reward"),
        (f"/v1/episodes/{eid}/reward", {"reward": 1, "extra": 2}, None, 400, None),
        (f"/v1/episodes/{eid}/reward", {"agent": "nobody", "reward": 1}, None, 400, "agent"),
        ("/v1/episodes/nope/reward", {"reward": 1}, None, 404, None),
        (f"/v1/episodes/{eid}/reward", {"completion_id": "x", "reward": 1}, None, 400, None),
        (f"/episodes/{eid}/v1/chat/completions", {"model": "a"}, None, 400, None),
    ]
    for where, body, raw, status, param in cases:
        r = _post(served, where, body, raw=raw)
        assert r.status_code == status, (where, body if raw is None else raw[:40], r.text[:300])
        error = r.json()["error"]
        assert set(error) >= {"message", "type"}, r.text
        if param:
            assert error.get("param") == param, (body, r.text)
    url, _, _, _ = served
    for header in ("Bearer wrong", "Bearer \u00e9\u00e9".encode(), "", "Basic abc"):
        r = httpx.post(f"{url}{path}", json=_chat(eid), headers={"Authorization": header})
        assert r.status_code == 401
    r = httpx.post(f"{url}{path}", content=b"\x00", headers={"Authorization": b"Bearer \xff"})
    assert r.status_code == 401
    assert httpx.get(f"{url}/health").status_code == 200


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    ),
    st.sampled_from(["model", "messages", "n", "tools", "user", "stop", "max_tokens", "x"]),
)
def test_fuzzed_requests_never_get_a_5xx(served, value, key):
    _, _, eid, _ = served
    r = _post(served, "/v1/chat/completions", _chat(eid) | {key: value})
    assert r.status_code < 500, r.text[:300]


def test_a_well_formed_call_through_the_path_header_or_user_field(served):
    url, key, eid, _ = served
    client = OpenAI(base_url=f"{url}/episodes/{eid}/v1", api_key=key, max_retries=0)
    reply = client.chat.completions.create(
        model="a", messages=[{"role": "user", "content": "hi"}], n=2
    )
    assert [c.message.content for c in reply.choices] == ["ok", "ok"]
    assert reply.usage.completion_tokens == 2 * 3  # "o", "k" and the end of turn, each choice
    assert [m.id for m in client.models.list().data] == ["a"]
    plain = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    by_header = plain.chat.completions.with_raw_response.create(
        model="a",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"X-Episode-Id": eid},
        temperature=0.3,
    )
    assert by_header.headers["x-tandem-ignored"] == "temperature"
    by_user = plain.chat.completions.create(
        model="a", messages=[{"role": "user", "content": "hi"}], user=eid
    )
    assert by_user.choices[0].message.content == "ok"


def test_agent_program_selects_the_gateways_hooks_and_checks_the_program():
    base = ["--recipe=writer_critic", "--preset=tiny"]
    cfg = train_config(base)
    assert cfg.hooks() == GATEWAY_HOOKS
    plan = cfg.plan()
    assert plan.recipe.program == "recipes.writer_critic.program.run"
    command = train_config([*base, "--agent_program=python my_agents.py --fast"]).plan()
    assert command.recipe.command == ["python", "my_agents.py", "--fast"]
    with pytest.raises(HookError, match="no attribute 'nothing'"):
        train_config([*base, "--agent_program=recipes.writer_critic.program.nothing"])
    with pytest.raises(HookError, match="must accept"):
        train_config([*base, "--agent_program=recipes.writer_critic.program.score"])
    with pytest.raises(ValueError, match="drop \\['generate_fn'\\]"):
        train_config([*base, "--generate_fn=kernel.toy.generate"])


@pytest.mark.slow
def test_the_example_program_learns_through_the_gateway(tmp_path):
    """recipes/writer_critic --preset tiny: the program, unmodified, trained through the gateway
    on one tiny character model playing writer and critic; the final text's share of digits
    (both agents' reward) rises (0.11 -> 0.41 from the first 5 steps to the last 5, measured)."""
    from kernel.run.loop import train

    train(train_config(["--recipe=writer_critic", "--preset=tiny", f"--output_dir={tmp_path}"]))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 30 and all(r["rollout/failed"] == 0 for r in rows)
    first = sum(r["writer/reward"] for r in rows[:5]) / 5
    last = sum(r["writer/reward"] for r in rows[-5:]) / 5
    assert last - first > 0.15, (first, last)


def test_tool_calls_are_read_from_a_reply_and_a_flood_of_unclosed_tags_reads_at_once():
    """parse_tool_calls: each <tool_call> holding a JSON object with a name is a call (its
    arguments as a JSON string), anything else stays in the content; a reply of 16,000
    unclosed <tool_call> tags (quadratic for the regular expression it replaced) is read like
    any other, its one closed call found."""
    from kernel.gateway.episodes import parse_tool_calls

    text = (
        'Let me add. <tool_call>\n {"name": "add", "arguments": {"a": 1}} \n</tool_call> '
        "<tool_call>not json</tool_call> done"
    )
    content, calls = parse_tool_calls(text, "e1", 0)
    assert content == "Let me add.  <tool_call>not json</tool_call> done"
    assert calls == [
        {
            "id": "call_e1_0_0",
            "type": "function",
            "function": {"name": "add", "arguments": '{"a": 1}'},
        }
    ]
    assert parse_tool_calls("no calls", "e1", 0) == ("no calls", [])
    flood = "<tool_call>" * 16000 + '<tool_call>{"name": "f"}</tool_call>'
    content, calls = parse_tool_calls(flood, "e2", 3)
    assert calls == [] and content == flood  # the first opening takes the rest: not JSON
    flood = "<tool_call>" * 16000 + '</tool_call><tool_call>{"name": "f"}</tool_call>'
    content, calls = parse_tool_calls(flood, "e2", 3)
    assert [c["function"]["name"] for c in calls] == ["f"]
