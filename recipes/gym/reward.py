"""gym's reward: what the environment gave the episode's actions, summed (generate.py stores it
in ``metadata["env_reward"]``); the environment is the judge, so the reward is one line."""

from __future__ import annotations

from kernel.hooks import RolloutContext
from kernel.sample import Sample


def reward(ctx: RolloutContext, samples: list[Sample]) -> list[float]:
    return [float(s.metadata["env_reward"]) for s in samples]
