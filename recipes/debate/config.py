"""debate's settings (``recipe_args``): who debates, for how many rounds, who judges, and the
reward's weights."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kernel.hooks import recipe_config

JUDGE = "judge"
JUDGES = ("majority", "model")


@dataclass
class RecipeConfig:
    """Several agents answer a question, read each other's answers and revise, for some rounds;
    a judge (a rule or a model) decides the debate's answer."""

    debaters: list[str] = field(default_factory=lambda: ["alice", "bob"])
    """the debating agents (run.agents must name them), distinct; one alone (with ``rounds: 1``)
    is the single-agent baseline: its answer is the verdict"""
    rounds: int = 2
    """round 1: each answers alone; each later round: each reads the others' last answers and
    answers again"""
    judge: str = "majority"
    """majority: the most common final answer (a tie goes to the earliest debater in
    ``debaters`` among the tied); model: agent ``judge`` reads the question and the final
    answers and states the answer (freeze it with trainable: false, or train it too)"""
    correct_weight: float = 1.0
    """a debater: when its own final answer is right; the judge: when its verdict is right"""
    verdict_weight: float = 0.5
    """a debater: when the verdict is right and is its own final answer (it convinced or
    stood with the winning side)"""
    format_penalty: float = 0.5
    """subtracted from a debater whose final turn (or a judge whose verdict) states no answer"""
    max_quote_chars: int = 300
    """another debater's answer is cut to this many characters when quoted"""

    def validate(self) -> RecipeConfig:
        if not self.debaters or len(set(self.debaters)) != len(self.debaters):
            raise ValueError(
                f"recipe_args.debaters must name one or more distinct agents, got {self.debaters}"
            )
        if JUDGE in self.debaters:
            raise ValueError(f"recipe_args.debaters: {JUDGE!r} is the judge's agent name")
        if self.rounds < 1:
            raise ValueError(f"recipe_args.rounds must be >= 1, got {self.rounds}")
        if self.judge not in JUDGES:
            raise ValueError(f"recipe_args.judge must be one of {JUDGES}, got {self.judge!r}")
        if self.max_quote_chars < 1:
            raise ValueError(
                f"recipe_args.max_quote_chars must be >= 1, got {self.max_quote_chars}"
            )
        for name in ("correct_weight", "verdict_weight", "format_penalty"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"recipe_args.{name} must be a finite number >= 0, got {value!r}")
        return self


def as_config(value: object) -> RecipeConfig:
    """``ctx.config`` as a RecipeConfig (kernel.hooks.recipe_config)."""
    return recipe_config(value, RecipeConfig)
