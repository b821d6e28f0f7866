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
from recipes.code_pair.reward import score_single


@functools.cache
def _config(args: str) -> RecipeConfig:
    """One RecipeConfig (and so one sandbox) per distinct settings, shared by every episode."""
    cfg = RecipeConfig(**{**json.loads(args), "workflow": "single"})
    cfg.validate()
    return cfg


class CodeEnv:
    """One coding problem, tried up to ``max_turns`` times (keyword args: RecipeConfig's)."""

    def __init__(self, **settings: Any) -> None:
        self.cfg = _config(json.dumps(settings, sort_keys=True))
        self.problem: tuple[str, str, str] | None = None
        self.turns, self.done = 0, False

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
        outcome = await score_single(self.cfg, problem, tests, entry, action)
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
