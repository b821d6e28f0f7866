"""deep_research's generate against the REAL retriever (uvicorn on 127.0.0.1 over a corpus
built with the real MiniLM model) and a real embedded engine serving a tiny model.

A tiny random model almost never writes a valid tag, so the tool loop is also driven
deterministically: ``ScriptedAgent`` is a real AgentHandle (real tokenizer, Conversation,
generate_turn) whose engine call is replaced by a fixed list of replies, returned as the token
ids the tokenizer gives for them, ended like the engine ends a turn at a stop string. Only the
sampling is scripted: the retriever, the tool dispatch and the loss masks are the real ones.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import pytest

from kernel.engine.client import GenerateResult
from kernel.engine.launch import free_port
from kernel.engine.pool import EngineConfig, EnginePool
from kernel.hooks import RolloutContext
from kernel.run.agents import AgentHandle
from kernel.sample import Sample, Status
from recipes.deep_research.config import RecipeConfig
from recipes.deep_research.generate import generate
from recipes.deep_research.make_data import make_world
from recipes.deep_research.reward import reward
from retriever import BuildConfig, RetrieverSettings, build_index, create_app


@pytest.fixture(scope="module")
def world():
    """12 documents of the shipped fictional world: a company, its founder and their towns,
    and 8 other people as distractors."""
    corpus, _ = make_world(seed=0)
    by_id = {d["id"]: d for d in corpus}
    company = by_id["c000"]
    founder = next(d for d in corpus if d["id"].startswith("p") and d["title"] in company["text"])
    town_of = {d["id"]: d for d in corpus if d["id"].startswith("t")}
    towns = [t for t in town_of.values() if t["title"] in company["text"] + founder["text"]]
    people = [d for d in corpus if d["id"].startswith("p") and d is not founder][:8]
    return {"company": company, "founder": founder, "docs": [company, founder, *towns, *people]}


@pytest.fixture(scope="module")
def retriever_url(world, tmp_path_factory):
    import json

    import uvicorn

    root = tmp_path_factory.mktemp("dr_retriever")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in world["docs"]))
    index = build_index(BuildConfig(corpus=str(corpus), out=str(root / "index")), progress=False)
    port = free_port()
    app = create_app(RetrieverSettings(index=str(index), port=port))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "retriever did not start"
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    assert httpx.get(url + "/health").json()["documents"] == len(world["docs"])
    yield url
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from kernel.models import load_tokenizer, materialize_model

    work = tmp_path_factory.mktemp("dr_engine")
    model = materialize_model("tiny-smollm2", work)
    with EnginePool(EngineConfig(num_threads=1), model, work / "logs") as pool:
        yield pool.urls[0], load_tokenizer(model)


class ScriptedAgent(AgentHandle):
    """An AgentHandle whose replies are scripted (see the module docstring)."""

    def __init__(self, name: str, tokenizer, replies: list[str], max_context_len: int = 2048):
        super().__init__(name, ["scripted"], tokenizer, {}, 64, max_context_len)
        self.replies = list(replies)
        self.prompts: list[list[int]] = []

    async def generate(self, input_ids, sampling=None):
        self.prompts.append(list(input_ids))
        text = self.replies.pop(0)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return GenerateResult(
            output_ids=ids,
            logprobs=[-0.25] * len(ids),
            finish_reason={"type": "stop", "matched": text[text.rfind("</") :]},
            weight_version="0",
        )


def _real(name: str, engine) -> AgentHandle:
    from kernel.engine.client import EngineClient

    url, tok = engine
    return AgentHandle(name, [EngineClient(url)], tok, {"temperature": 1.0}, 24, 768)


def _ctx(agents: dict, url: str, **cfg) -> RolloutContext:
    config = RecipeConfig(retriever_url=url, em_weight=1.0, f1_weight=0.5, **cfg).validate()
    return RolloutContext(agents=agents, config=config)


def _seed(question: str, label) -> Sample:
    return Sample(prompt=question, label=label, group_id=4, index=1, metadata={"row": 7})


async def _run(ctx: RolloutContext, seed: Sample) -> list[Sample]:
    try:
        return await generate(ctx, seed)
    finally:
        for agent in ctx.agents.values():
            for c in agent.clients:
                if hasattr(c, "aclose"):
                    await c.aclose()


def _split(sample: Sample, tok) -> tuple[str, str]:
    """(text of the tokens it trains on, text of the whole response)."""
    own = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m]
    return tok.decode(own), tok.decode(sample.response_ids)


def _dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def test_full_tool_loop_with_the_real_retriever(world, retriever_url, smollm2_tokenizer):
    tok, company, founder = smollm2_tokenizer, world["company"], world["founder"]
    agent_replies = [
        f"<think>I need the founder.</think><search>Who founded {company['title']}?</search>",
        f"<think>Read the founder's page.</think><read>[{founder['id']}]</read>",
        f"<answer>{founder['title']}</answer>",
    ]
    searcher_replies = [
        f"<query>{company['title']} founder</query>",
        f"<summary>{company['title']} was founded by {founder['title']} "
        f"[{company['id']}].</summary>",
    ]
    agents = {
        "agent": ScriptedAgent("agent", tok, agent_replies),
        "searcher": ScriptedAgent("searcher", tok, searcher_replies),
    }
    ctx = _ctx(agents, retriever_url, topk=3)
    seed = _seed(f"Who founded {company['title']}?", [founder["title"]])
    samples = asyncio.run(_run(ctx, seed))

    assert [(s.agent, s.turn) for s in samples] == [("agent", 0), ("searcher", 0)]
    main, searcher = samples
    for s in samples:
        s.validate()
        assert s.status is Status.COMPLETED
        assert (s.group_id, s.index, s.metadata["row"]) == (4, 1, 7)
        assert s.metadata["final_answer"] == founder["title"] and s.metadata["correct"] is True

    # each agent trains on exactly what it sampled, nothing of the tools
    own, whole = _split(main, tok)
    assert own == "".join(agent_replies)
    summary = searcher_replies[1][len("<summary>") : -len("</summary>")]
    assert summary in whole and founder["text"] in whole  # the tool responses are in context
    assert summary not in own and founder["text"] not in own and "<information>" not in own
    own, whole = _split(searcher, tok)
    assert own == "".join(searcher_replies)
    assert f"[{company['id']}] {company['title']}: {company['text']}" in whole  # real retrieval
    assert company["text"] not in own and "<information>" not in own
    # the main agent's prompt ends with the question: everything after it is the response
    prompt = tok.decode(main.prompt_ids)
    assert prompt.endswith(f"Question: {seed.prompt}<|im_end|>\n<|im_start|>assistant\n")

    assert main.metadata["metrics"] == {
        "turns": 3.0,
        "searches": 1.0,
        "reads": 1.0,
        "read_misses": 0.0,
        "answered": 1.0,
        "format_errors": 0.0,
        "retriever_errors": 0.0,
        "retriever_failed": 0.0,
        "searcher_turns": 2.0,
        "searcher_queries": 1.0,
        "searcher_format_errors": 0.0,
        "summary_rate": 1.0,
        "exact_match": 1.0,
        "f1": 1.0,
        "gold_in_answer": 1.0,
    }
    assert not main.metadata["retriever_failed"] and not searcher.metadata["retriever_failed"]
    assert searcher.metadata["queries"] == [f"{company['title']} founder"]
    # agent: 1.0 * EM 1 + 0.5 * F1 1 + 0.1 * format 1 = 1.6; searcher (outcome): 1 + 0.5 = 1.5
    assert reward(ctx, samples) == [pytest.approx(1.6), pytest.approx(1.5)]


def test_scaffold_gives_each_turn_its_tag_and_trains_only_what_was_sampled(
    world, retriever_url, smollm2_tokenizer
):
    """recipe_args.scaffold: the agent's turns open with <search> then <answer>, the searcher's
    with <query> then <summary> (sent with the prompt, not trained on); the replies here close
    no tag, as a model cut at a line break would not, and each is closed for it."""
    tok, company, founder = smollm2_tokenizer, world["company"], world["founder"]
    agent_replies = [f"Who founded {company['title']}?\n", founder["title"]]
    searcher_replies = [f"{company['title']} founder", f"It was founded by {founder['title']}."]
    agents = {
        "agent": ScriptedAgent("agent", tok, agent_replies),
        "searcher": ScriptedAgent("searcher", tok, searcher_replies),
    }
    ctx = _ctx(agents, retriever_url, scaffold=True, max_turns=2, searcher_max_turns=2)
    seed = _seed(f"Who founded {company['title']}?", [founder["title"]])
    main, searcher = asyncio.run(_run(ctx, seed))

    sent = [tok.decode(p) for p in agents["agent"].prompts + agents["searcher"].prompts]
    assert [p[p.rfind("\n") + 1 :] for p in sent] == [
        "<search>",
        "<answer>",
        "<query>",
        "<summary>",
    ]
    assert main.metadata["final_answer"] == founder["title"] and main.metadata["correct"] is True
    assert searcher.metadata["queries"] == [f"{company['title']} founder"]
    assert searcher.metadata["summary"] == searcher_replies[1]
    assert company["id"] in searcher.metadata["retrieved"]  # real retrieval, for the evidence
    assert main.metadata["retrieved"] == searcher.metadata["retrieved"]
    assert main.metadata["metrics"]["format_errors"] == 0.0
    for sample, replies in ((main, agent_replies), (searcher, searcher_replies)):
        own, whole = _split(sample, tok)
        assert own == "".join(replies)  # the given tags are context only
        assert "<answer>" in whole or "<summary>" in whole


def test_dead_retriever_is_counted_and_masks_the_episode(smollm2_tokenizer):
    tok = smollm2_tokenizer
    agents = {
        "agent": ScriptedAgent(
            "agent",
            tok,
            ["<search>who?</search>", "<read>p001</read>", "<answer>nobody</answer>"],
        ),
        "searcher": ScriptedAgent("searcher", tok, ["<query>who</query>"]),
    }
    ctx = _ctx(agents, _dead_url(), retries=1, request_timeout_s=2.0, searcher_max_turns=1)
    main, searcher = asyncio.run(_run(ctx, _seed("Who?", ["Mibek Brier"])))
    m = main.metadata["metrics"]
    # the searcher's query and the main agent's read both failed, after one retry each
    assert (m["retriever_errors"], m["searches"], m["reads"], m["turns"]) == (2.0, 1.0, 1.0, 3.0)
    assert m["summary_rate"] == 0.0 and m["answered"] == 1.0 and m["exact_match"] == 0.0
    assert m["retriever_failed"] == 1.0
    assert main.metadata["retriever_failed"] and searcher.metadata["retriever_failed"]
    assert reward(ctx, [main, searcher]) == [None, None]  # not trained on
    assert len(main.metadata["tool_errors"]) == 2
    assert all("ConnectError" in e for e in main.metadata["tool_errors"])
    _, whole = _split(main, tok)
    assert "The assistant found nothing." in whole  # no summary and no documents
    _, whole = _split(searcher, tok)
    assert "The search engine failed: /retrieve: ConnectError" in whole
    assert searcher.metadata["summary"] is None and searcher.metadata["format_ok"] is False


def test_a_failed_search_masks_its_episode_and_the_step_goes_on(
    world, retriever_url, smollm2_tokenizer
):
    """Three episodes of one prompt group through the kernel's RolloutManager and GRPO, against
    the real retriever: in the first, the searcher's query is longer than the retriever takes
    (its max_query_chars, 2048), so /retrieve answers HTTP 422 -- a failed retriever call. That
    episode answers right, yet none of its samples gets a reward or an advantage (nothing of it
    is trained on); the other two are scored, and the group's advantages come from them alone."""
    from kernel.advantages import AdvantageConfig, compute_advantages
    from kernel.rewards import RewardConfig
    from kernel.rollout import RolloutManager
    from kernel.train.update import trainable

    tok, company, founder = smollm2_tokenizer, world["company"], world["founder"]
    question = f"Who founded {company['title']}?"
    summary = f"<summary>{company['title']} was founded by {founder['title']}.</summary>"
    too_long = " ".join([company["title"]] * 300)  # > 2048 characters
    assert len(too_long) > 2048
    agent_replies, searcher_replies = [], []
    for answer, query in (
        (founder["title"], too_long),  # right answer, failed search
        (founder["title"], f"{company['title']} founder"),  # right
        ("Nobody", f"{company['title']} founder"),  # wrong
    ):
        agent_replies += [f"<search>{question}</search>", f"<answer>{answer}</answer>"]
        searcher_replies += [f"<query>{query}</query>", summary]
    agents = {
        "agent": ScriptedAgent("agent", tok, agent_replies, max_context_len=4096),
        "searcher": ScriptedAgent("searcher", tok, searcher_replies, max_context_len=4096),
    }
    ctx = _ctx(agents, retriever_url, max_turns=2, searcher_max_turns=2)
    seeds = [Sample(prompt=question, label=[founder["title"]], index=i) for i in range(3)]
    # concurrency 1: the episodes run one after another, so each takes its own scripted replies
    manager = RolloutManager(generate, reward, RewardConfig(), concurrency=1, timeout_s=120)
    kept, aborted, stats = asyncio.run(manager.run(ctx, [seeds]))
    assert not aborted and (stats.failed, stats.timed_out, stats.reward_errors) == (0, 0, 0)
    samples = kept[0].samples
    assert [(s.index, s.agent) for s in samples] == [
        (0, "agent"),
        (0, "searcher"),
        (1, "agent"),
        (1, "searcher"),
        (2, "agent"),
        (2, "searcher"),
    ]
    compute_advantages(samples, AdvantageConfig(estimator="grpo"))
    failed, right, wrong = samples[0:2], samples[2:4], samples[4:6]

    m = failed[0].metadata["metrics"]
    assert (m["retriever_errors"], m["retriever_failed"], m["exact_match"]) == (1.0, 1.0, 1.0)
    assert "/retrieve: HTTP 422" in failed[0].metadata["tool_errors"][0]
    assert "The search engine failed: /retrieve: HTTP 422" in tok.decode(failed[1].response_ids)
    for s in failed:
        assert s.status is Status.COMPLETED  # a finished episode, only not scored
        assert s.raw_reward is None and s.reward is None and s.advantage is None
        assert not trainable(s)
    assert right[0].metadata["metrics"]["retriever_failed"] == 0.0
    for s in right + wrong:
        assert not s.metadata["retriever_failed"]
        assert s.raw_reward is not None and trainable(s)
    # agent: 1 + 0.5 + 0.1 = 1.6 (right) against 0.1 (wrong): GRPO over these two only
    assert (right[0].raw_reward, wrong[0].raw_reward) == (pytest.approx(1.6), pytest.approx(0.1))
    assert right[0].advantage == pytest.approx(-wrong[0].advantage) and right[0].advantage > 0


def test_malformed_turns_and_unknown_ids_are_counted(retriever_url, smollm2_tokenizer):
    tok = smollm2_tokenizer
    replies = ["It is Ostmark.", "<read>zzz9</read>", "<answer>Ostmark</answer>"]
    agents = {"agent": ScriptedAgent("agent", tok, replies)}
    ctx = _ctx(agents, retriever_url)
    (main,) = asyncio.run(_run(ctx, _seed("Where?", ["Ostmark"])))
    m = main.metadata["metrics"]
    assert (m["format_errors"], m["read_misses"], m["retriever_errors"]) == (1.0, 1.0, 0.0)
    assert m["summary_rate"] is None  # no search: not applicable
    assert main.metadata["format_ok"] is False and main.metadata["correct"] is True
    own, whole = _split(main, tok)
    assert own == "".join(replies)
    assert "Invalid turn: no complete action tag." in whole
    assert "No document has the id 'zzz9'." in whole
    # 1.0 * EM 1 + 0.5 * F1 1 + 0.1 * format 0 = 1.5
    assert reward(ctx, [main]) == [pytest.approx(1.5)]


def test_turn_budget_ends_the_episode_unanswered(retriever_url, smollm2_tokenizer):
    tok = smollm2_tokenizer
    agents = {"agent": ScriptedAgent("agent", tok, ["<read>p001</read>"] * 2)}
    ctx = _ctx(agents, retriever_url, max_turns=2)
    (main,) = asyncio.run(_run(ctx, _seed("Who?", ["x"])))
    m = main.metadata["metrics"]
    assert (m["turns"], m["reads"], m["answered"]) == (2.0, 2.0, 0.0)
    assert main.metadata["final_answer"] is None and agents["agent"].replies == []


def test_real_engine_episode(engine, retriever_url):
    """Both agents on the embedded engine (random tiny model): samples are well formed and
    tool responses (here: the format errors it is told about) never enter the loss."""
    agents = {"agent": _real("agent", engine), "searcher": _real("searcher", engine)}
    ctx = _ctx(agents, retriever_url, max_turns=2, searcher_max_turns=1)
    samples = asyncio.run(_run(ctx, _seed("In which town was Mibek Brier born?", ["Torhaven"])))
    tok = engine[1]
    main = samples[0]
    assert main.agent == "agent" and all(s.agent == "searcher" for s in samples[1:])
    m = main.metadata["metrics"]
    assert len(samples) - 1 == m["searches"]
    assert m["turns"] >= 1
    for s in samples:
        s.validate()
        assert s.status in (Status.COMPLETED, Status.TRUNCATED)
        assert len(s.rollout_logprobs) == s.response_length
        own, _ = _split(s, tok)
        assert "<information>" not in own and "Invalid turn" not in own
        assert sum(s.loss_mask) > 0
    if m["turns"] == 2:  # the first turn got a tool response before the second
        assert "<information>" in _split(main, tok)[1]


def test_real_searcher_and_dead_retriever(engine, smollm2_tokenizer):
    """The main agent is scripted to search and read; the searcher is the real engine. Its
    samples exist with agent='searcher'; the dead retriever is counted on read."""
    agents = {
        "agent": ScriptedAgent(
            "agent", smollm2_tokenizer, ["<search>a</search>", "<read>p1</read>", "<answer>b"]
        ),
        "searcher": _real("searcher", engine),
    }
    ctx = _ctx(agents, _dead_url(), retries=0, max_turns=3, searcher_max_turns=1)
    samples = asyncio.run(_run(ctx, _seed("Q?", ["b"])))
    assert [s.agent for s in samples] == ["agent", "searcher"]
    m = samples[0].metadata["metrics"]
    # the read always fails; the searcher's random turn may or may not hold a <query>
    assert m["retriever_errors"] == 1.0 + m["searcher_queries"] and m["reads"] == 1.0
    # "<answer>b" is never closed: a malformed last turn, so not answered
    assert m["format_errors"] == 1.0 and m["answered"] == 0.0
    samples[1].validate()


@pytest.mark.slow
def test_short_cpu_training_run_logs_every_metric(tmp_path, retriever_url):
    from kernel.cli import train_config
    from kernel.run.loop import train

    tiny = Path(__file__).resolve().parents[2] / "recipes/deep_research/presets/tiny.yaml"
    cfg = train_config(
        [
            f"--config={tiny}",
            f"--output_dir={tmp_path}",
            f"--recipe_args.retriever_url={retriever_url}",
            "--eval.every=2",
        ]
    )
    rows = train(cfg)
    assert [r["step"] for r in rows] == [0, 1]
    for row in rows:
        for key in ("reward", "response_length", "mask_share", "samples"):
            assert f"agent/{key}" in row, key
        for key in (
            "turns",
            "answered",
            "format_errors",
            "retriever_errors",
            "retriever_failed",
            "exact_match",
            "f1",
            "gold_in_answer",
        ):
            assert f"episode/{key}" in row, key
        assert row["train/n_samples"] > 0
    assert "eval/agent/pass@2" in rows[-1]


# ---- workflow routed: Dr.MAS's verifier -> searcher | answerer ---------------------------------


def test_parse_route_goldens():
    from recipes.deep_research.tools import Action, FormatError, parse_route

    assert parse_route("<search>Who founded X?</search>") == Action("search", "Who founded X?")
    assert parse_route("<think>done</think><enough></enough>") == Action("enough", "")
    assert parse_route("<enough>the summary names him</enough>").kind == "enough"
    assert parse_route("<search> </search>") == FormatError("empty <search>")
    assert isinstance(parse_route("<answer>X</answer>"), FormatError)
    assert isinstance(parse_route("<search>a</search><enough></enough>"), FormatError)


def _routed(world, tok, verifier_replies, searcher_replies, answer, url, **cfg):
    company, founder = world["company"], world["founder"]
    agents = {
        "verifier": ScriptedAgent("verifier", tok, verifier_replies),
        "searcher": ScriptedAgent("searcher", tok, searcher_replies),
        "answerer": ScriptedAgent("answerer", tok, [answer]),
    }
    ctx = _ctx(agents, url, workflow="routed", **cfg)
    seed = _seed(f"Who founded {company['title']}?", [founder["title"]])
    return agents, ctx, asyncio.run(_run(ctx, seed))


def test_routed_verifier_sends_to_the_searcher_then_to_the_answerer(
    world, retriever_url, smollm2_tokenizer
):
    tok, company, founder = smollm2_tokenizer, world["company"], world["founder"]
    summary = f"{company['title']} was founded by {founder['title']} [{company['id']}]."
    _, ctx, samples = _routed(
        world,
        tok,
        [f"<search>Who founded {company['title']}?</search>", "<enough></enough>"],
        [f"<query>{company['title']} founder</query>", f"<summary>{summary}</summary>"],
        f"<answer>{founder['title']}</answer>",
        retriever_url,
    )
    assert [(s.agent, s.turn) for s in samples] == [
        ("verifier", 0),
        ("answerer", 0),
        ("searcher", 0),
    ]
    verifier, answerer, _ = samples
    for s in samples:
        s.validate()
        assert s.metadata["final_answer"] == founder["title"] and s.metadata["correct"] is True
    # the summary went back to the verifier (in context, out of its loss) and to the answerer
    own, whole = _split(verifier, tok)
    assert summary in whole and summary not in own
    assert summary in tok.decode(answerer.prompt_ids)
    assert _split(answerer, tok)[0] == f"<answer>{founder['title']}</answer>"
    m = verifier.metadata["metrics"]
    assert (m["loops"], m["searches"], m["routed_to_answer"]) == (2.0, 1.0, 1.0)
    assert (m["exact_match"], m["gold_in_answer"], m["retriever_failed"]) == (1.0, 1.0, 0.0)
    # verifier and answerer: EM 1 + 0.5 F1 1 + 0.1 format; searcher (outcome) 1.5
    assert reward(ctx, samples) == [pytest.approx(1.6), pytest.approx(1.6), pytest.approx(1.5)]


def test_routed_answers_anyway_after_max_loops_and_counts_a_bad_route(
    world, retriever_url, smollm2_tokenizer
):
    tok, company = smollm2_tokenizer, world["company"]
    agents, ctx, samples = _routed(
        world,
        tok,
        ["I think it is fine.", f"<search>{company['title']}</search>"],
        [f"<query>{company['title']}</query>", "<summary>nothing useful</summary>"],
        "<answer>Nobody</answer>",
        retriever_url,
        max_loops=2,
    )
    verifier = samples[0]
    m = verifier.metadata["metrics"]
    assert (m["loops"], m["format_errors"], m["searches"], m["routed_to_answer"]) == (
        2.0,
        1.0,
        1.0,
        0.0,
    )
    assert "Invalid turn: no complete <search> or <enough> tag" in tok.decode(
        verifier.prompt_ids + verifier.response_ids
    )
    assert agents["answerer"].replies == [] and samples[1].metadata["correct"] is False
    # the verifier made a malformed turn: no format credit; the answerer answered: it has one
    r = reward(ctx, samples)
    assert r[0] == pytest.approx(0.0) and r[1] == pytest.approx(0.1)


def test_routed_dead_retriever_masks_every_role(world, smollm2_tokenizer):
    """workflow routed: a failed search masks the verifier, the answerer and the searcher."""
    tok, company, founder = smollm2_tokenizer, world["company"], world["founder"]
    _, ctx, samples = _routed(
        world,
        tok,
        [f"<search>Who founded {company['title']}?</search>", "<enough></enough>"],
        [f"<query>{company['title']} founder</query>", "<summary>nothing</summary>"],
        f"<answer>{founder['title']}</answer>",
        _dead_url(),
        retries=0,
    )
    assert [s.agent for s in samples] == ["verifier", "answerer", "searcher"]
    m = samples[0].metadata["metrics"]
    assert (m["retriever_errors"], m["retriever_failed"], m["exact_match"]) == (1.0, 1.0, 1.0)
    assert reward(ctx, samples) == [None, None, None]


# ---- workflow solo: the single-agent baseline, its searches answered by the retriever -------


def test_solo_agent_reads_the_passages_itself_and_trains_on_its_own_turns(
    world, retriever_url, smollm2_tokenizer
):
    """workflow solo: a <search> goes straight to the retriever (no searcher dialogue, no
    searcher sample); the passages come back to the agent, masked; its evidence term counts the
    documents its own search retrieved."""
    tok, company, founder = smollm2_tokenizer, world["company"], world["founder"]
    replies = [
        f"<search>Who founded {company['title']}?</search>",
        f"<answer>{founder['title']}</answer>",
    ]
    agents = {"agent": ScriptedAgent("agent", tok, replies)}
    ctx = _ctx(agents, retriever_url, topk=3, workflow="solo", evidence_weight=0.5)
    seed = _seed(f"Who founded {company['title']}?", [founder["title"]])
    seed.metadata["support"] = [company["id"]]
    samples = asyncio.run(_run(ctx, seed))

    assert [(s.agent, s.turn) for s in samples] == [("agent", 0)]
    (main,) = samples
    main.validate()
    own, whole = _split(main, tok)
    assert own == "".join(replies)
    passage = f"[{company['id']}] {company['title']}: {company['text'][:300].strip()}"
    assert passage in whole and passage not in own  # the retriever's passage, masked
    assert "search engine replies with the passages" in tok.decode(main.prompt_ids)
    assert company["id"] in main.metadata["retrieved"]
    m = main.metadata["metrics"]
    assert (m["searches"], m["searcher_turns"], m["searcher_queries"]) == (1.0, 0.0, 0.0)
    assert (m["exact_match"], m["evidence"]) == (1.0, 1.0)
    # em 1 + f1 0.5 * 1 + format 0.1 + evidence 0.5 * 1
    assert reward(ctx, samples) == [pytest.approx(2.1)]


def test_solo_dead_retriever_masks_the_episode(world, smollm2_tokenizer):
    tok, company, founder = smollm2_tokenizer, world["company"], world["founder"]
    replies = [f"<search>{company['title']}</search>", f"<answer>{founder['title']}</answer>"]
    agents = {"agent": ScriptedAgent("agent", tok, replies)}
    ctx = _ctx(agents, _dead_url(), workflow="solo", retries=0)
    samples = asyncio.run(_run(ctx, _seed(f"Who founded {company['title']}?", ["x"])))
    assert samples[0].metadata["metrics"]["retriever_failed"] == 1.0
    assert "The search engine failed" in tok.decode(samples[0].response_ids)
    assert reward(ctx, samples) == [None]
