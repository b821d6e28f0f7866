"""One deep_research episode: the main agent researches a question with its searcher.

The main agent (``ctx.agents["agent"]``) takes up to ``max_turns`` turns; each turn is parsed
by ``tools.parse_action``:

- ``<search>sub-question</search>``: the searcher (``ctx.agents["searcher"]``) gets the
  sub-question in a dialogue of its own, takes up to ``searcher_max_turns`` turns of
  ``<query>...</query>`` (each round goes to the retriever's ``/retrieve``; the passages come
  back as its tool response) and ends with ``<summary>...</summary>``, which becomes the main
  agent's tool response. A searcher that writes no summary hands back the ids and titles of
  the documents it found.
- ``<read>doc id</read>``: the document from the retriever's ``/documents``.
- ``<answer>...</answer>``: the episode ends.

With ``recipe_args.scaffold`` every turn starts with the tag the protocol expects (given, not
sampled): ``<search>`` then, in the last turn, ``<answer>``; ``<query>`` then ``<summary>``.

A malformed turn is counted and answered with what was wrong; a retriever failure (after the
client's retries) is counted and answered with the error; neither ends the episode. An episode
with a retriever failure is marked ``retriever_failed`` on every sample, and reward.py gives
its samples None (the kernel's "does not apply": not trained on), counted in the metric
``retriever_failed``. Tool responses enter each dialogue as ``tool_role`` messages, so they are
in the context but masked out of the loss: each agent trains only on the tokens it sampled, in
its own Conversation with its own tokenizer (the two agents may be different models).

``recipe_args.workflow: routed`` is Dr.MAS's search hierarchy instead (``routed`` below): a
verifier routes each loop to the searcher or to an answerer. ``workflow: solo`` is the
single-agent baseline: the same main agent and turns, but a ``<search>`` goes to the retriever
itself and the passages come back to the agent (Search-R1's loop), with no searcher between.

Returns the main agent's sample (turn 0) and one sample per searcher call (agent "searcher",
turn = the call's number). Every sample carries ``final_answer``, ``correct`` (exact match) and
``retriever_failed`` for reward.py and the kernel's outcome weighting; the main agent's sample
carries the episode metrics in ``metadata["metrics"]`` (``exact_match``, ``f1`` and
``gold_in_answer`` of the final answer: reward.answer_metrics).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kernel.dialogue import Dialogue
from kernel.hooks import RolloutContext
from kernel.sample import Sample
from recipes.deep_research import prompts
from recipes.deep_research.config import (
    AGENT,
    ANSWERER,
    SEARCHER,
    VERIFIER,
    RecipeConfig,
    as_config,
)
from recipes.deep_research.reward import answer_metrics, evidence
from recipes.deep_research.tools import (
    ACTION_TAGS,
    AGENT_STOP,
    ANSWERER_STOP,
    ROUTE_TAGS,
    SEARCHER_STOP,
    SEARCHER_TAGS,
    VERIFIER_STOP,
    Action,
    DocumentNotFound,
    FormatError,
    RetrieverClient,
    RetrieverError,
    parse_action,
    parse_route,
    parse_searcher_turn,
)


@dataclass
class Counts:
    """What happened in one episode, turned into ``metadata["metrics"]``."""

    turns: int = 0
    searches: int = 0
    reads: int = 0
    read_misses: int = 0
    format_errors: int = 0
    retriever_errors: int = 0
    searcher_turns: int = 0
    searcher_queries: int = 0
    searcher_format_errors: int = 0
    summaries: int = 0
    notes: list[str] = field(default_factory=list)  # tool errors, for debugging a run


def episode_metrics(c: Counts, answer: str | None, label) -> dict[str, float | None]:
    """Episode metrics (None: not applicable, left out of the averages)."""
    return {
        "turns": float(c.turns),
        "searches": float(c.searches),
        "reads": float(c.reads),
        "read_misses": float(c.read_misses),
        "answered": float(answer is not None),
        "format_errors": float(c.format_errors),
        "retriever_errors": float(c.retriever_errors),
        "retriever_failed": float(c.retriever_errors > 0),
        "searcher_turns": float(c.searcher_turns),
        "searcher_queries": float(c.searcher_queries),
        "searcher_format_errors": float(c.searcher_format_errors),
        "summary_rate": c.summaries / c.searches if c.searches else None,
        **answer_metrics(answer, label),
    }


def _sampling(cfg: RecipeConfig, stop: list[str]) -> dict | None:
    # no_stop_trim: the closing tag stays in the reply text; the ids are kept either way
    stop = [*stop, "\n"] if cfg.scaffold else stop
    return {"stop": stop, "no_stop_trim": True} if cfg.stop_at_tags or cfg.scaffold else None


def _opening(cfg: RecipeConfig, turn: int, turns: int, tag: str, last_tag: str) -> str:
    """With ``scaffold``, the tag turn ``turn`` of ``turns`` starts with; else nothing."""
    if not cfg.scaffold:
        return ""
    return f"<{last_tag}>" if turn == turns - 1 else f"<{tag}>"


def _closed(text: str, opening: str) -> str:
    """A turn whose given opening tag the agent did not close (it stopped at a line break or
    its length), closed at its end."""
    close = "</" + opening[1:]
    return text if not opening or close in text else text.rstrip() + close


async def run_searcher(
    ctx: RolloutContext, retriever: RetrieverClient, sub_question: str, counts: Counts
) -> tuple[str, Dialogue, dict]:
    """One searcher call: (the text handed back to the main agent, its dialogue, metadata)."""
    cfg = as_config(ctx.config)
    d = Dialogue(ctx.agents[SEARCHER], prompts.SEARCHER_SYSTEM, prompts.research(sub_question))
    summary, queries, errors = None, [], 0
    seen: dict[str, str] = {}  # id -> title of every document retrieved
    for k in range(cfg.searcher_max_turns):
        opening = _opening(cfg, k, cfg.searcher_max_turns, "query", "summary")
        text = await d.speak(_sampling(cfg, SEARCHER_STOP), opening)
        if text is None:
            break
        counts.searcher_turns += 1
        turn = parse_searcher_turn(_closed(text, opening), cfg.max_queries_per_turn)
        if isinstance(turn, FormatError):
            errors += 1
            reply = prompts.format_error(turn.why, SEARCHER_TAGS)
        elif turn.summary is not None:
            summary = turn.summary
            break
        else:
            queries += turn.queries
            try:
                hits = await retriever.retrieve(list(turn.queries), cfg.topk)
            except RetrieverError as e:
                counts.retriever_errors += 1
                counts.notes.append(str(e))
                reply = prompts.tool_error(str(e))
            else:
                seen |= {doc["id"]: doc["title"] for docs in hits for doc in docs}
                reply = prompts.results(list(turn.queries), hits, cfg.max_passage_chars)
        if not d.say(cfg.tool_role, prompts.information(reply)):
            break
    counts.searcher_queries += len(queries)
    counts.searcher_format_errors += errors
    counts.summaries += summary is not None
    handed = summary[: cfg.max_summary_chars] if summary else prompts.no_summary(seen)
    meta = {
        "sub_question": sub_question,
        "queries": queries,
        "summary": summary,
        "retrieved": sorted(seen),
        "format_ok": summary is not None and errors == 0,
    }
    return handed, d, meta


async def search_directly(
    retriever: RetrieverClient, query: str, cfg: RecipeConfig, counts: Counts, found: set[str]
) -> str:
    """``workflow: solo``: the agent's search sent to the retriever as one query; the passages
    (as a searcher would see them) are the reply, and their ids join ``found``."""
    try:
        hits = await retriever.retrieve([query], cfg.topk)
    except RetrieverError as e:
        counts.retriever_errors += 1
        counts.notes.append(str(e))
        return prompts.tool_error(str(e))
    found |= {doc["id"] for docs in hits for doc in docs}
    return prompts.results([query], hits, cfg.max_passage_chars)


async def read_document(
    retriever: RetrieverClient, doc_id: str, cfg: RecipeConfig, counts: Counts
) -> str:
    try:
        doc = await retriever.document(doc_id)
    except DocumentNotFound:
        counts.read_misses += 1
        return f"No document has the id {doc_id!r}."
    except RetrieverError as e:
        counts.retriever_errors += 1
        counts.notes.append(str(e))
        return prompts.tool_error(str(e))
    return prompts.passage(doc, cfg.max_read_chars)


async def generate(ctx: RolloutContext, sample: Sample) -> list[Sample | None]:
    """The recipe's generate hook: one research episode (see the module docstring)."""
    cfg = as_config(ctx.config)
    if cfg.workflow == "routed":
        return await routed(ctx, sample)
    solo = cfg.workflow == "solo"
    system = prompts.SOLO_SYSTEM if solo else prompts.AGENT_SYSTEM
    main = Dialogue(ctx.agents[AGENT], system, prompts.question(str(sample.prompt)))
    counts = Counts()
    answer: str | None = None
    searchers: list[tuple[Dialogue, dict]] = []
    found: set[str] = set()  # solo: the documents its own searches retrieved
    retriever = RetrieverClient(
        cfg.retriever_url, cfg.request_timeout_s, cfg.retries, cfg.retriever_api_key
    )
    async with retriever:
        for k in range(cfg.max_turns):
            opening = _opening(cfg, k, cfg.max_turns, "search", "answer")
            text = await main.speak(_sampling(cfg, AGENT_STOP), opening)
            if text is None:
                break
            counts.turns += 1
            action = parse_action(_closed(text, opening))
            if isinstance(action, FormatError):
                counts.format_errors += 1
                reply = prompts.format_error(action.why, ACTION_TAGS)
            elif action.kind == "answer":
                answer = action.arg
                break
            elif action.kind == "search" and solo:
                counts.searches += 1
                reply = await search_directly(retriever, action.arg, cfg, counts, found)
            elif action.kind == "search":
                counts.searches += 1
                reply, dialogue, meta = await run_searcher(ctx, retriever, action.arg, counts)
                searchers.append((dialogue, meta))
            else:  # read
                counts.reads += 1
                reply = await read_document(retriever, action.arg, cfg, counts)
            if not main.say(cfg.tool_role, prompts.information(reply)):
                break

    metrics = episode_metrics(counts, answer, sample.label)
    outcome = {
        "final_answer": answer,
        "correct": metrics["exact_match"] == 1.0,
        "retriever_failed": counts.retriever_errors > 0,  # reward.py masks the episode
    }
    samples = [
        main.sample(
            sample,
            0,
            **outcome,
            format_ok=answer is not None and counts.format_errors == 0,
            retrieved=sorted(found | {i for _, meta in searchers for i in meta["retrieved"]}),
            metrics=metrics,
            tool_errors=counts.notes,
        )
    ]
    if samples[0] is not None and sample.metadata.get("support"):
        metrics["evidence"] = evidence(samples[0])  # logged when the data names support ids
    samples += [d.sample(sample, i, **outcome, **meta) for i, (d, meta) in enumerate(searchers)]
    return samples


async def routed(ctx: RolloutContext, sample: Sample) -> list[Sample | None]:
    """Dr.MAS's search hierarchy (``workflow: routed``): the verifier reads the question and
    the evidence so far and routes each loop to the searcher (``<search>sub-question
    </search>``: a searcher call, its summary back to the verifier as a tool response and into
    the evidence) or to the answerer (``<enough></enough>``); after ``max_loops`` verifier
    turns the answerer answers anyway. The answerer sees the question and the evidence and
    writes ``<answer>...</answer>``. Samples: the verifier's (turn 0), the answerer's (turn
    0), one per searcher call (turn = its number); the verifier's carries the metrics
    (``loops``, ``routed_to_answer``: the verifier said enough, ``searches``, ...)."""
    cfg = as_config(ctx.config)
    question = str(sample.prompt)
    verifier = Dialogue(ctx.agents[VERIFIER], prompts.VERIFIER_SYSTEM, prompts.question(question))
    counts, evidence_found, enough = Counts(), [], False
    searchers: list[tuple[Dialogue, dict]] = []
    retriever = RetrieverClient(
        cfg.retriever_url, cfg.request_timeout_s, cfg.retries, cfg.retriever_api_key
    )
    async with retriever:
        for _ in range(cfg.max_loops):
            text = await verifier.speak(_sampling(cfg, VERIFIER_STOP))
            if text is None:
                break
            counts.turns += 1
            route = parse_route(text)
            if isinstance(route, FormatError):
                counts.format_errors += 1
                reply = prompts.format_error(route.why, ROUTE_TAGS)
            elif route.kind == "enough":
                enough = True
                break
            else:
                counts.searches += 1
                reply, dialogue, meta = await run_searcher(ctx, retriever, route.arg, counts)
                searchers.append((dialogue, meta))
                evidence_found.append(f"{route.arg} {reply}")
            if not verifier.say(cfg.tool_role, prompts.information(reply)):
                break

    view = prompts.evidence_view(question, evidence_found)
    answerer = Dialogue(ctx.agents[ANSWERER], prompts.ANSWERER_SYSTEM, view)
    answer = None
    if answerer.fits:
        opening = "<answer>" if cfg.scaffold else ""
        text = await answerer.speak(_sampling(cfg, ANSWERER_STOP), opening)
        action = parse_action(_closed(text, opening)) if text is not None else None
        answer = action.arg if isinstance(action, Action) and action.kind == "answer" else None

    metrics = episode_metrics(counts, answer, sample.label)
    outcome = {
        "final_answer": answer,
        "correct": metrics["exact_match"] == 1.0,
        "retriever_failed": counts.retriever_errors > 0,  # reward.py masks the episode
    }
    metrics |= {"loops": float(counts.turns), "routed_to_answer": float(enough)}
    retrieved = sorted({i for _, meta in searchers for i in meta["retrieved"]})
    samples = [
        verifier.sample(
            sample,
            0,
            **outcome,
            format_ok=counts.format_errors == 0,
            retrieved=retrieved,
            metrics=metrics,
            tool_errors=counts.notes,
        ),
        answerer.sample(sample, 0, **outcome, format_ok=answer is not None, retrieved=retrieved),
    ]
    samples += [d.sample(sample, i, **outcome, **meta) for i, (d, meta) in enumerate(searchers)]
    return samples
