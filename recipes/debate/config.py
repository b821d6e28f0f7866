"""debate's settings (``recipe_args``): who debates, for how many rounds, who judges, and the
reward's weights."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kernel.hooks import recipe_config

JUDGE = "judge"
JUDGES = ("majority", "model", "rules")
STYLES = ("answer", "procon")


@dataclass
class RecipeConfig:
    """Several agents answer a question, read each other's answers and revise, for some rounds;
    a judge (a rule or a model) decides the debate's answer."""

    style: str = "answer"
    """answer: the debaters solve a math question (the label checks it); procon: two debaters
    argue assigned opposite sides of a motion and a judge scores their arguments (procon.py)"""
    debaters: list[str] = field(default_factory=lambda: ["alice", "bob"])
    """the debating agents (run.agents must name them), distinct; one alone (with ``rounds: 1``)
    is the single-agent baseline: its answer is the verdict"""
    rounds: int = 2
    """round 1: each answers alone; each later round: each reads the others' last answers and
    answers again"""
    credit: str = "episode"
    """answer style -- episode: one training sample per debater, its whole debate, paid for its
    final answer and the verdict; turn: one sample per debater and round, each training only
    that round's turn (the earlier ones are its context): a round before the last is paid for
    its own answer (correct_weight, format_penalty), the last as in episode (per-turn credit;
    pair it with advantage.group_by prompt_agent_turn for a baseline per round)"""
    judge: str = "majority"
    """answer style -- majority: the final answer more debaters stated than any other (a tie
    between different answers is no verdict); model: agent ``judge`` reads the question and the
    final answers and states the answer (freeze it with trainable: false, or train it too).
    procon style -- rules: the rule judge of procon.py; model: agent ``judge`` scores each side
    0-10 on quality, evidence and consistency"""
    correct_weight: float = 1.0
    """a debater: when its own final answer is right; the judge: when its verdict is right"""
    verdict_weight: float = 0.5
    """a debater: when the verdict is right and is its own final answer (it convinced or
    stood with the winning side)"""
    format_penalty: float = 0.5
    """subtracted from a debater whose final turn (or a judge whose verdict) states no answer"""
    max_quote_chars: int = 300
    """another debater's answer is cut to this many characters when quoted"""
    quality_weight: float = 1.0
    """procon: weight of a speech's argument quality (reasons, its own, of fitting length)"""
    evidence_weight: float = 0.5
    """procon: weight of its evidence (numbers, examples, sources)"""
    consistency_weight: float = 1.0
    """procon: weight of arguing its assigned side (-1 for the other side or a concession)"""
    min_words: int = 40
    """procon: a speech shorter than this loses quality (none at half of it)"""
    max_words: int = 200
    """procon: a speech longer than this loses quality (none at double)"""
    min_sentence_words: int = 6
    """procon: shorter sentences count neither as a reason nor as evidence"""

    def validate(self) -> RecipeConfig:
        if not self.debaters or len(set(self.debaters)) != len(self.debaters):
            raise ValueError(
                f"recipe_args.debaters must name one or more distinct agents, got {self.debaters}"
            )
        if JUDGE in self.debaters:
            raise ValueError(f"recipe_args.debaters: {JUDGE!r} is the judge's agent name")
        if self.rounds < 1:
            raise ValueError(f"recipe_args.rounds must be >= 1, got {self.rounds}")
        if self.style not in STYLES:
            raise ValueError(f"recipe_args.style must be one of {STYLES}, got {self.style!r}")
        judges = ("rules", "model") if self.style == "procon" else ("majority", "model")
        if self.judge not in judges:
            raise ValueError(
                f"recipe_args.judge must be one of {judges} with style {self.style}, "
                f"got {self.judge!r}"
            )
        if self.credit not in ("episode", "turn"):
            raise ValueError(f"recipe_args.credit must be 'episode' or 'turn', got {self.credit!r}")
        if self.style == "procon" and self.credit != "episode":
            raise ValueError("recipe_args.credit: style procon scores whole speeches: episode")
        if self.style == "procon" and len(self.debaters) != 2:
            raise ValueError(
                f"recipe_args.debaters: style procon needs two (one a side), got {self.debaters}"
            )
        if not (0 < self.min_words <= self.max_words and self.min_sentence_words > 0):
            raise ValueError(
                "recipe_args: min_words, max_words and min_sentence_words must be > 0 with "
                f"min_words <= max_words, got {self.min_words}, {self.max_words}, "
                f"{self.min_sentence_words}"
            )
        if self.max_quote_chars < 1:
            raise ValueError(
                f"recipe_args.max_quote_chars must be >= 1, got {self.max_quote_chars}"
            )
        weights = ("correct_weight", "verdict_weight", "format_penalty", "quality_weight")
        for name in (*weights, "evidence_weight", "consistency_weight"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"recipe_args.{name} must be a finite number >= 0, got {value!r}")
        return self


def as_config(value: object) -> RecipeConfig:
    """``ctx.config`` as a RecipeConfig (kernel.hooks.recipe_config)."""
    return recipe_config(value, RecipeConfig)
