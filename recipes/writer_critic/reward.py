"""The score of ``program.py`` for the recipe version (``generate.py``): both agents get the
writer's final text's score."""

from __future__ import annotations

from kernel.hooks import RolloutContext
from kernel.sample import Sample

from .program import score


def reward(ctx: RolloutContext, samples: list[Sample]) -> float:
    writer = next(s for s in samples if s.agent == "writer")
    return score(writer.metadata["final"], {"prompt": writer.prompt, **writer.metadata})
