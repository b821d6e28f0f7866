"""The tool protocol: parsing each agent's turn into an action, and the retriever client.

Parsing is pure (string in, action or ``FormatError`` out) so the protocol is pinned by golden
strings in the tests. A malformed turn is a value, never an exception: the episode counts it and
tells the agent what was wrong.

Main agent turn: ``<think>...</think>`` (optional) and free text, then exactly one of
``<search>sub-question</search>``, ``<read>doc id</read>``, ``<answer>final answer</answer>``.
Text inside ``<think>`` is ignored, so an agent may think about tags without calling them.

Searcher turn: ``<summary>...</summary>`` (final), or one or more ``<query>...</query>``.

Verifier turn (workflow ``routed``): ``<search>sub-question</search>`` or ``<enough></enough>``;
the answerer's: ``<answer>final answer</answer>``.

``RetrieverClient`` calls the retriever service over HTTP (httpx) with a timeout and retries
(tenacity) on connection errors, timeouts and HTTP 5xx; whatever still fails is a
``RetrieverError`` whose message becomes the tool response.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from kernel.tags import find_tags, outside_tags

ACTIONS = ("search", "read", "answer")
ACTION_TAGS = "<search>...</search>, <read>...</read> or <answer>...</answer>"
SEARCHER_TAGS = "<query>...</query> or <summary>...</summary>"
AGENT_STOP = ["</search>", "</read>", "</answer>"]
SEARCHER_STOP = ["</summary>"]
ROUTE_TAGS = "<search>...</search> or <enough>...</enough>"
VERIFIER_STOP = ["</search>", "</enough>"]
ANSWERER_STOP = ["</answer>"]

ROUTES = ("search", "enough")
# Tags are found by kernel.tags.find_tags, not by r"<(a|b)>(.*?)</\1>": that pattern takes time
# quadratic in a turn of many unclosed tags, which a policy can write.


@dataclass(frozen=True)
class Action:
    """A well-formed main-agent turn: ``kind`` in ACTIONS and its argument (stripped)."""

    kind: str
    arg: str


@dataclass(frozen=True)
class SearcherTurn:
    """A well-formed searcher turn: its queries, or its summary (final; queries ignored)."""

    queries: tuple[str, ...] = ()
    summary: str | None = None


@dataclass(frozen=True)
class FormatError:
    """A malformed turn; ``why`` is told to the agent."""

    why: str


def _outside_think(text: str) -> str | FormatError:
    visible = outside_tags(text, find_tags(text, ["think"]))
    if "<think>" in visible:
        return FormatError("<think> is never closed")
    return visible


def _one_tag(text: str, kinds: Sequence[str], none: str, what: str) -> Action | FormatError:
    """The one ``<kind>arg</kind>`` of ``kinds`` outside ``<think>`` (arg stripped); a
    FormatError when there is none (``none`` says why) or more than one (``what`` tags)."""
    visible = _outside_think(text)
    if isinstance(visible, FormatError):
        return visible
    found = find_tags(visible, kinds)
    if not found:
        return FormatError(none)
    if len(found) > 1:
        return FormatError(f"{len(found)} {what} tags in one turn")
    return Action(found[0].name, found[0].inner.strip())


def parse_action(text: str) -> Action | FormatError:
    """The one action of a main-agent turn (see the module docstring)."""
    action = _one_tag(text, ACTIONS, "no complete action tag", "action")
    if isinstance(action, FormatError):
        return action
    arg = action.arg
    if action.kind == "read":
        arg = arg.strip("[]'\" ")  # "<read>[p017]</read>" names the document p017
    if not arg:
        return FormatError(f"empty <{action.kind}>")
    return Action(action.kind, arg)


def parse_route(text: str) -> Action | FormatError:
    """A verifier turn (workflow routed): ``<search>sub-question</search>`` (more evidence) or
    ``<enough>...</enough>`` (hand over to the answerer; the text inside may be empty)."""
    route = _one_tag(text, ROUTES, "no complete <search> or <enough> tag", "routing")
    if isinstance(route, Action) and route.kind == "search" and not route.arg:
        return FormatError("empty <search>")
    return route


def parse_searcher_turn(text: str, max_queries: int) -> SearcherTurn | FormatError:
    """A searcher turn: the summary if there is one, else its first ``max_queries`` non-empty
    queries (duplicates dropped)."""
    visible = _outside_think(text)
    if isinstance(visible, FormatError):
        return visible
    summaries = [t.inner for t in find_tags(visible, ["summary"])]
    if summaries:
        summary = summaries[-1].strip()
        return SearcherTurn(summary=summary) if summary else FormatError("empty <summary>")
    queries = [t.inner.strip() for t in find_tags(visible, ["query"]) if t.inner.strip()]
    if not queries:
        return FormatError("no <query> and no <summary>")
    return SearcherTurn(queries=tuple(dict.fromkeys(queries))[:max_queries])


# ---- retriever client -----------------------------------------------------------------------


class RetrieverError(RuntimeError):
    """The retriever could not answer (after retries); the message says why, briefly."""


class DocumentNotFound(LookupError):
    """``/documents`` does not know the id (HTTP 404): the agent's mistake, not the service's."""


def _transient(e: BaseException) -> bool:
    if isinstance(e, httpx.HTTPStatusError):
        return e.response.status_code >= 500
    return isinstance(e, httpx.TransportError)  # connect errors, timeouts, dropped connections


def _message(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["message"])
    except Exception:
        return r.text[:200]


class RetrieverClient:
    """``POST /retrieve`` and ``POST /documents`` of one retriever; use as ``async with``."""

    def __init__(
        self, url: str, timeout_s: float = 10.0, retries: int = 2, api_key: str | None = None
    ) -> None:
        self.retries = retries
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self.http = httpx.AsyncClient(base_url=url.rstrip("/"), timeout=timeout_s, headers=headers)

    async def __aenter__(self) -> RetrieverClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.http.aclose()

    async def _post(self, path: str, body: dict) -> httpx.Response:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.retries + 1),
            wait=wait_exponential(multiplier=0.2, max=2.0),
            retry=retry_if_exception(_transient),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    r = await self.http.post(path, json=body)
                    if r.status_code >= 500:
                        r.raise_for_status()
            return r
        except httpx.HTTPStatusError as e:
            code = e.response.status_code
            raise RetrieverError(f"{path}: HTTP {code}: {_message(e.response)}") from e
        except httpx.HTTPError as e:
            raise RetrieverError(f"{path}: {type(e).__name__}: {e or 'no answer'}") from e

    async def retrieve(self, queries: list[str], topk: int) -> list[list[dict]]:
        """Per query, the ranked documents ``{id, title, text, score}``."""
        r = await self._post("/retrieve", {"queries": queries, "topk": topk})
        if r.status_code != 200:
            raise RetrieverError(f"/retrieve: HTTP {r.status_code}: {_message(r)}")
        return r.json()["results"]

    async def document(self, doc_id: str) -> dict:
        """The document ``{id, title, text}``; DocumentNotFound for an unknown id."""
        r = await self._post("/documents", {"ids": [doc_id]})
        if r.status_code == 404:
            raise DocumentNotFound(doc_id)
        if r.status_code != 200:
            raise RetrieverError(f"/documents: HTTP {r.status_code}: {_message(r)}")
        return r.json()["documents"][0]
