"""A reward module that registers an advantage estimator of its own, as a recipe's reward.py
may: ``--reward_fn tests.hook_fixtures.own_estimator.reward --advantage.estimator
fixture_centered`` (tests/test_advantages.py). The reward is the toy task's."""

from __future__ import annotations

from kernel.advantages import AdvantageBatch, AdvantageConfig, estimator
from kernel.toy import toy_reward


@estimator("fixture_centered")
def fixture_centered(batch: AdvantageBatch, cfg: AdvantageConfig):
    """r - the batch's mean reward."""
    return batch.rewards - batch.rewards.mean()


def reward(ctx, samples):
    return toy_reward(ctx, samples)
