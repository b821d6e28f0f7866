"""The template's settings (``recipe_args``): how many times the solver answers each problem and
the largest operand a problem may use. The kernel builds ``RecipeConfig(**recipe_args)`` and
calls ``validate()`` before anything starts; hooks read it with ``as_config(ctx.config)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernel.hooks import recipe_config


@dataclass
class RecipeConfig:
    attempts: int = 2
    """Solver answers per problem: the proposer's reward is the share right."""
    max_operand: int = 99
    """A problem whose operands exceed this (in absolute value) is not accepted."""

    def validate(self) -> RecipeConfig:
        if self.attempts < 1:
            raise ValueError(f"recipe_args.attempts must be >= 1, got {self.attempts}")
        if self.max_operand < 1:
            raise ValueError(f"recipe_args.max_operand must be >= 1, got {self.max_operand}")
        return self


def as_config(value: Any) -> RecipeConfig:
    """``ctx.config`` as a RecipeConfig (a dict, as tests may pass, is built and validated)."""
    return recipe_config(value, RecipeConfig)
