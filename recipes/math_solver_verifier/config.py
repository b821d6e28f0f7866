"""The recipe's settings (``recipe_args`` in a preset or ``--recipe_args '{...}'``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kernel.hooks import recipe_config
from recipes.math_solver_verifier.reward import MathRewardConfig

WORKFLOWS = ("solver_rewriter_selector", "solver_selector", "solver_verifier", "solver")
VERIFIER_REWARDS = ("verdict", "outcome")


@dataclass
class RecipeConfig:
    """math_solver_verifier settings."""

    workflow: str = "solver_rewriter_selector"
    """solver_rewriter_selector (parallel solvers, rewriters, one selector), solver_selector
    (parallel solvers, one selector picking a solution), solver_verifier (the solver revises
    until the verifier approves or max_loops) or solver (num_parallel independent solvers,
    nothing else: the single-agent baseline)."""
    num_parallel: int = 2
    """Solvers (and rewriters) per episode in solver_rewriter_selector and solver_selector."""
    max_loops: int = 3
    """Solver/verifier rounds at most in solver_verifier."""
    verifier_reward: str = "verdict"
    """What the verifier is paid for in solver_verifier: verdict (1 when its last verdict is
    right: approve exactly when the final answer is right) or outcome (the final answer's
    score, the solver's team reward: a rejection pays only when the revision that follows is
    right, so saying No to a solver that is almost always wrong earns nothing by itself). A
    missing verdict scores ``answer.format_penalty`` either way."""
    max_solution_chars: int = 1500
    """Each solution quoted to another role is cut to this many characters."""
    selector_prefix: str = ""
    """Text the selector's reply opens with (given, out of its loss), e.g. "Judgment: ": a
    small model that never states ``Judgment: N`` by itself then picks with its first
    tokens (SmolLM2-135M states it in 0 of 128 held-out selections without it)."""
    answer: MathRewardConfig = field(default_factory=MathRewardConfig)
    """Answer extraction and checking."""

    def __post_init__(self) -> None:
        if isinstance(self.answer, dict):  # from YAML / JSON recipe_args
            self.answer = MathRewardConfig(**self.answer)

    def validate(self) -> RecipeConfig:
        if self.workflow not in WORKFLOWS:
            raise ValueError(
                f"recipe_args.workflow must be one of {WORKFLOWS}, got {self.workflow!r}"
            )
        if self.verifier_reward not in VERIFIER_REWARDS:
            raise ValueError(
                f"recipe_args.verifier_reward must be one of {VERIFIER_REWARDS}, "
                f"got {self.verifier_reward!r}"
            )
        if self.num_parallel < 1 or self.max_loops < 1 or self.max_solution_chars < 1:
            raise ValueError("recipe_args.num_parallel, max_loops, max_solution_chars must be >= 1")
        self.answer.validate()
        return self

    @property
    def roles(self) -> tuple[str, ...]:
        if self.workflow == "solver_verifier":
            return ("solver", "verifier")
        if self.workflow == "solver":
            return ("solver",)
        if self.workflow == "solver_selector":
            return ("solver", "selector")
        return ("solver", "rewriter", "selector")


def as_config(value: object) -> RecipeConfig:
    """``ctx.config`` as a RecipeConfig (kernel.hooks.recipe_config)."""
    return recipe_config(value, RecipeConfig)
