"""code_pair's single coder as an environment (``kernel.env``): hosted by ``python -m kernel env
serve --environments code`` or played in-process, one HumanEval problem per episode.

``reset(item)`` shows the coder's prompt for the row (``prompt``, ``label`` = its test code,
``entry_point``); each ``step(reply)`` runs the reply's function against the checks in the
kernel's sandbox and scores it as the recipe's single workflow does (define_main + parses +
tests * share); the episode ends when every check passes or after ``max_turns`` tries, and
until then the observation is the recipe's feedback (status, checks passed, first error).
``info`` carries the sandbox status, ``checks_passed`` (share) and ``correct``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from kernel.env import BadAction, Observation
from recipes.code_pair import prompts
from recipes.code_pair.config import RecipeConfig
from recipes.code_pair.reward import Outcome, score_single


@functools.cache
def _config(args: str) -> RecipeConfig:
    """One RecipeConfig (and so one sandbox) per distinct settings, shared by every episode."""
    cfg = RecipeConfig(**{**json.loads(args), "workflow": "single"})
    cfg.validate()
    return cfg


class CodeEnv:
    """One coding problem, tried up to ``max_turns`` times (keyword args: RecipeConfig's)."""

    def __init__(self, **settings: Any) -> None:
        self.settings = json.dumps(settings, sort_keys=True)
        self.cfg = _config(self.settings)
        self.problem: tuple[str, str, str] | None = None
        self.turns, self.done = 0, False

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its config (which holds the sandbox): the environment server keeps
        an episode as its pickled state between steps, and each worker its own config."""
        return {k: v for k, v in self.__dict__.items() if k != "cfg"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.cfg = _config(self.settings)

    async def reset(self, item: Mapping[str, Any]) -> Observation:
        entry, tests = item.get("entry_point"), item.get("label")
        if not isinstance(entry, str) or not isinstance(tests, str) or not item.get("prompt"):
            raise BadAction("code: an item needs 'prompt', 'label' (the test code), 'entry_point'")
        self.problem = (str(item["prompt"]), tests, entry)
        return Observation(prompts.coder(self.problem[0], entry))

    async def step(self, action: str) -> Observation:
        if self.problem is None or self.done:
            raise BadAction("code: step before reset or after the episode ended")
        problem, tests, entry = self.problem
        try:
            outcome = await score_single(self.cfg, problem, tests, entry, action)
        except (RecursionError, MemoryError):  # code nested past what the parser can read
            why = "the code is nested too deeply to read"
            outcome = Outcome("syntax_error", error=why, terms={"define_main": 0.0})
        self.turns += 1
        correct = outcome.total > 0 and outcome.passed == outcome.total
        self.done = correct or self.turns >= self.cfg.max_turns
        info = {"status": outcome.status, "checks_passed": outcome.share, "correct": correct}
        text = (
            ""
            if self.done
            else prompts.feedback(outcome.status, outcome.passed, outcome.total, outcome.error)
        )
        return Observation(text, outcome.reward, self.done, info)

    async def close(self) -> None:
        self.problem = None
