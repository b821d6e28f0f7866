"""The math checker as an environment (``kernel.env``): hosted by ``python -m kernel env serve
--environments math`` or played in-process, one problem per episode.

``reset(item)`` shows the solver's prompt for the row (``prompt``; ``label`` is the answer);
``step(reply)`` scores the reply with the recipe's strict scorer (``reward.score``: 1.0 right,
0.0 wrong, ``format_penalty`` when no numeric answer can be found; a boxed restatement of the
problem is no answer) and ends the episode. ``info``: the extracted ``answer`` and ``correct``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernel.env import BadAction, Observation
from kernel.env.workers import offload
from recipes.math_solver_verifier import prompts
from recipes.math_solver_verifier.reward import MathRewardConfig, final_answer, score


def _judge(action: str, label: str, cfg: MathRewardConfig) -> tuple[float, str | None]:
    return score(action, label, cfg), final_answer(action, label, cfg)


class MathEnv:
    """One math problem, one answer (keyword args: MathRewardConfig's)."""

    def __init__(self, **scoring: Any) -> None:
        self.cfg = MathRewardConfig(**scoring).validate()
        self.label: str | None = None

    async def reset(self, item: Mapping[str, Any]) -> Observation:
        if not item.get("prompt") or item.get("label") is None:
            raise BadAction("math: an item needs 'prompt' and 'label' (the answer)")
        self.label = str(item["label"])
        return Observation(prompts.solver(str(item["prompt"])))

    async def step(self, action: str) -> Observation:
        if self.label is None:
            raise BadAction("math: step before reset or after the episode ended")
        label, self.label = self.label, None  # one answer per episode
        # math-verify's parse can take a while: off the event loop (in the server's worker
        # process, on its main thread, where math-verify's own timeouts work)
        reward, answer = await offload(_judge, action, label, self.cfg)
        return Observation("", reward, True, {"answer": answer, "correct": reward == 1.0})

    async def close(self) -> None:
        self.label = None
