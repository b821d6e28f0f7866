"""code_pair's settings (``recipe_args``): which workflow, the reward's partial credits, the
sandbox that runs the code."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from functools import cached_property

from kernel.hooks import recipe_config
from kernel.sandbox import Sandbox, SandboxConfig

HELPER, MAIN, CODER = "helper", "main", "coder"
WORKFLOWS = ("pair", "single")
CLOSING_FENCE = "\n```\n"  # an opening fence carries a language ("```python\n") or starts the reply


@dataclass
class RecipeConfig:
    """Cooperative code generation (CoMLRL's helper + main pair) or one coder with test
    feedback."""

    workflow: str = "pair"
    """pair: the helper agent writes ``aux``, the main agent writes the entry point (which may
    call it), each from the problem alone, at the same time; single: one coder writes the
    function and, while tests fail, gets the error back for another try (``max_turns``)"""
    max_turns: int = 2
    """single: the coder's tries at most (the first plus feedback rounds)"""
    helper_name: str = "aux"
    """the helper function's name (the main agent is told it exists)"""
    code_prefix: str = ""
    """text every code reply opens with, given and out of the loss (a scaffold, e.g.
    ``"```python\\ndef {function}("``); ``{function}`` becomes the function that agent writes
    (the helper's name for the helper, the entry point for main and the coder)"""
    stop_after_code: bool = False
    """end a reply at its code block's closing fence (``\\n```\\n``, kept in the reply), so a
    model does not go on to explain its code: shorter rollouts, no loss on prose"""
    define_helper: float = 0.4
    """pair: credit when the helper's reply defines the helper with a returned value"""
    define_main: float = 0.6
    """credit when the main (or single) reply defines the entry point with a returned value"""
    parses: float = 0.5
    """credit when the combined program parses"""
    tests: float = 1.0
    """credit times the share of HumanEval's checks that pass"""
    uses_helper: float = 0.5
    """pair: credit when some check passes and main calls the helper"""
    not_wrapper: float = 1.0
    """pair: with uses_helper, credit when main is more than ``return aux(...)``"""
    drops_helper_result: float = 0.5
    """pair: subtracted when main calls the helper and throws its result away"""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """limits of each run of the model's code (kernel.sandbox)"""

    def __post_init__(self) -> None:
        if isinstance(self.sandbox, dict):  # from YAML / JSON recipe_args
            self.sandbox = SandboxConfig(**self.sandbox)

    @cached_property
    def runner(self) -> Sandbox:
        """The sandbox (and its pool) this config's runs share, made once (it probes what
        confinement the machine allows by starting child processes)."""
        return Sandbox(self.sandbox)

    @cached_property
    def trusted_runner(self) -> Sandbox:
        """The sandbox of the problems' own test code (checks.py's plan: the expected values,
        computed apart from any model-written code): the same limits, with room in its output
        for every call's arguments and expected value."""
        return Sandbox(replace(self.sandbox, output_kb=max(self.sandbox.output_kb, 4096)))

    def prefix(self, function: str) -> str:
        """The code prefix of an agent writing ``function``."""
        return self.code_prefix.replace("{function}", function)

    @property
    def sampling(self) -> dict | None:
        """Sampling settings every code reply adds to the agent's own (the stop, if any)."""
        return {"stop": [CLOSING_FENCE], "no_stop_trim": True} if self.stop_after_code else None

    @property
    def max_reward(self) -> float:
        """The most an episode can earn (every credit)."""
        if self.workflow == "single":
            return self.define_main + self.parses + self.tests
        return (
            self.define_helper
            + self.define_main
            + self.parses
            + self.tests
            + self.uses_helper
            + self.not_wrapper
        )

    def validate(self) -> RecipeConfig:
        if self.workflow not in WORKFLOWS:
            raise ValueError(
                f"recipe_args.workflow must be one of {WORKFLOWS}, got {self.workflow!r}"
            )
        if self.max_turns < 1:
            raise ValueError(f"recipe_args.max_turns must be >= 1, got {self.max_turns}")
        if not self.helper_name.isidentifier():
            raise ValueError(
                f"recipe_args.helper_name must be a Python name, got {self.helper_name!r}"
            )
        unknown = set(re.findall(r"\{(\w+)\}", self.code_prefix)) - {"function"}
        if unknown:
            raise ValueError(
                f"recipe_args.code_prefix: unknown placeholder(s) {sorted(unknown)}; the one "
                f"placeholder is {{function}} (got {self.code_prefix!r})"
            )
        credits = ("define_helper", "define_main", "parses", "tests", "uses_helper", "not_wrapper")
        for name in (*credits, "drops_helper_result"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"recipe_args.{name} must be a finite number >= 0, got {value!r}")
        self.sandbox.validate()
        return self


def as_config(value: object) -> RecipeConfig:
    """``ctx.config`` as a RecipeConfig (kernel.hooks.recipe_config)."""
    return recipe_config(value, RecipeConfig)
