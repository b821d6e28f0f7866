"""The recipe's settings (``recipe_args`` in a preset, ``--recipe_args.KEY VALUE`` on the
command line): the retriever to call, the turn budgets of both agents, how much retrieved text
enters a context, and the reward weights. See README.md for the protocol they shape."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from kernel.hooks import recipe_config

AGENT, SEARCHER = "agent", "searcher"
VERIFIER, ANSWERER = "verifier", "answerer"
WORKFLOWS = ("agent", "routed", "solo")
"""The two agents' names: ``agents: [agent, searcher]`` in a preset."""

SEARCHER_REWARDS = ("outcome", "outcome_format", "answer_in_summary", "none")


@dataclass
class RecipeConfig:
    """deep_research settings."""

    workflow: str = "agent"
    """agent: one main agent searches (through its searcher), reads and answers; routed:
    Dr.MAS's search hierarchy, a verifier that routes each loop to the searcher (more
    evidence) or to the answerer (enough), which answers from the evidence; solo: the
    single-agent baseline, the main agent alone, its searches answered by the retriever's
    passages (``agents: [agent]``)"""
    max_loops: int = 3
    """routed: the verifier's turns at most; then the answerer answers with what there is"""
    retriever_url: str = "http://127.0.0.1:8000"
    """Base URL of the retriever service (python -m retriever serve)."""
    retriever_api_key: str | None = field(default=None, repr=False)
    """Bearer key of a retriever served with one (default: the ``TANDEM_API_KEY`` environment
    variable, which run.sh's retriever reads too; redacted in the saved config)."""
    topk: int = 3
    """Documents per searcher query."""
    max_turns: int = 4
    """Main agent turns at most (each one <search>, <read> or <answer>)."""
    searcher_max_turns: int = 2
    """Searcher turns at most per sub-question (each one round of <query> or the <summary>)."""
    max_queries_per_turn: int = 3
    """Searcher queries used from one turn (later ones are ignored)."""
    max_passage_chars: int = 300
    """Each retrieved passage shown to the searcher is cut to this many characters."""
    max_read_chars: int = 1200
    """A document returned by <read> is cut to this many characters."""
    max_summary_chars: int = 600
    """The searcher's summary handed to the main agent is cut to this many characters."""
    tool_role: str = "user"
    """Chat role of tool responses (masked out of the loss); 'tool' for templates that know it."""
    stop_at_tags: bool = True
    """End a turn at its closing action tag (</search>, </read>, </answer>, </summary>), so the
    model does not go on to invent the tool's answer."""
    scaffold: bool = False
    """Start every turn with the tag the protocol expects, given rather than sampled: the main
    agent's turns with ``<search>`` and its last one with ``<answer>``, the searcher's with
    ``<query>`` and its last one with ``<summary>``; a turn also ends at its first line break,
    and a tag left open is closed. For models too small to find the tag format on their own
    (SmolLM2-135M-Instruct wrote an action tag in 0 of 24 sampled first turns): the agents then
    learn what to search, query, summarize and answer, not when."""
    request_timeout_s: float = 10.0
    """Timeout of one retriever HTTP request."""
    retries: int = 2
    """Retries of a retriever request after a connection error, timeout or HTTP 5xx."""
    em_weight: float = 1.0
    """Weight of exact match (0/1) of the final answer in the answer score."""
    f1_weight: float = 0.0
    """Weight of token F1 of the final answer in the answer score."""
    format_weight: float = 0.1
    """Weight of the format term (1 if the agent answered with no malformed turn, else 0)."""
    evidence_weight: float = 0.0
    """Weight of the evidence term, added to the agent's and every searcher's reward: the share
    of the question's supporting documents (the data's ``support`` ids, with ``support`` in
    data.metadata_keys) that were retrieved -- by all the episode's searches for the agent, by
    its own queries for a searcher. A denser signal than the answer's for small models; 0: off."""
    searcher_reward: str = "outcome"
    """outcome (the main agent's answer score), outcome_format (plus format_weight x its own
    format term), answer_in_summary (1 if a gold answer is in its summary), or none (the
    searcher is not rewarded: its samples carry None)."""

    def __post_init__(self) -> None:
        self.retriever_api_key = self.retriever_api_key or os.environ.get("TANDEM_API_KEY") or None

    def validate(self) -> RecipeConfig:
        if not self.retriever_url.startswith(("http://", "https://")):
            raise ValueError(
                f"recipe_args.retriever_url must be an http(s) URL, got {self.retriever_url!r}"
            )
        if self.workflow not in WORKFLOWS:
            raise ValueError(
                f"recipe_args.workflow must be one of {WORKFLOWS}, got {self.workflow!r}"
            )
        for name in (
            "max_loops",
            "topk",
            "max_turns",
            "searcher_max_turns",
            "max_queries_per_turn",
            "max_passage_chars",
            "max_read_chars",
            "max_summary_chars",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"recipe_args.{name} must be >= 1, got {getattr(self, name)}")
        if not self.tool_role or self.tool_role == "assistant":
            raise ValueError(
                f"recipe_args.tool_role must be a non-assistant role, got {self.tool_role!r}"
            )
        if not self.request_timeout_s > 0:
            raise ValueError(
                f"recipe_args.request_timeout_s must be > 0, got {self.request_timeout_s}"
            )
        if self.retries < 0:
            raise ValueError(f"recipe_args.retries must be >= 0, got {self.retries}")
        for name in ("em_weight", "f1_weight", "format_weight"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"recipe_args.{name} must be finite, got {getattr(self, name)}")
        if self.searcher_reward not in SEARCHER_REWARDS:
            raise ValueError(
                f"recipe_args.searcher_reward must be one of {SEARCHER_REWARDS}, "
                f"got {self.searcher_reward!r}"
            )
        return self


def as_config(config: object) -> RecipeConfig:
    """``ctx.config`` as a RecipeConfig (kernel.hooks.recipe_config)."""
    return recipe_config(config, RecipeConfig)
