"""The template's rewards, one per sample (a list, in the order generate returned them).

- solver: 1 when its last number equals the problem's value, else 0;
- proposer: 0 for no problem or the wrong operation (its data row's ``label``); else
  ``1 - |2p - 1|`` where p is the share of the solver's attempts that were right: 1 for a
  problem solved half the time, 0 for one always or never solved (nothing to learn from).

The episode's metrics (``metadata["metrics"]``, on the proposer's sample) are logged per step
and per held-out item: the solver's share right and whether a problem was written.
"""

from __future__ import annotations

import re

from kernel.hooks import RolloutContext
from kernel.sample import Sample

NUMBER = re.compile(r"-?\d+")


def answer(text: str) -> int | None:
    """The last integer in ``text`` (the solver is asked to end with 'Answer: N')."""
    found = NUMBER.findall(text)
    return int(found[-1]) if found else None


def reward(ctx: RolloutContext, samples: list[Sample]) -> list[float]:
    proposer, solvers = samples[0], samples[1:]
    value = proposer.metadata["value"]
    right = [float(answer(s.metadata["text"]) == value) for s in solvers]
    share = sum(right) / len(right) if right else 0.0
    wanted = proposer.label in (None, proposer.metadata["op"])
    learnable = 1 - abs(2 * share - 1) if right and wanted else 0.0
    proposer.metadata["metrics"] = {"solved": share, "wrote_problem": float(bool(right))}
    return [learnable, *right]
