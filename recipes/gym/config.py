"""gym's settings (``recipe_args``): which agent plays, the environment of rows that name none,
how many turns an episode may take, and the system prompt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernel.hooks import recipe_config


@dataclass
class RecipeConfig:
    agent: str = "default"
    """The agent that plays (ctx.agents[agent])."""
    env: str | None = None
    """The environment of a row without an ``env`` column (data.metadata_keys: [env])."""
    max_turns: int = 4
    """Actions per episode at most; an episode still open then ends without further reward."""
    system: str | None = None
    """The agent's system prompt (None: the environment's first observation alone)."""
    action_prefix: str = ""
    """Text every action opens with, given and out of the loss (a scaffold for small models,
    e.g. ``"<calculator>"``); the environment sees it as part of the action."""

    def validate(self) -> RecipeConfig:
        if self.max_turns < 1:
            raise ValueError(f"recipe_args.max_turns must be >= 1, got {self.max_turns}")
        return self


def as_config(value: Any) -> RecipeConfig:
    """``ctx.config`` as a RecipeConfig."""
    return recipe_config(value, RecipeConfig)
