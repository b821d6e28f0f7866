"""The toy task's reward: share of digits in the response text (golden values)."""

from kernel.hooks import RolloutContext, load_generate, load_reward
from kernel.sample import Sample
from kernel.toy import toy_reward


def test_toy_reward_goldens():
    ctx = RolloutContext()
    assert toy_reward(ctx, [Sample(metadata={"text": "a1b2"})]) == 0.5  # 2 digits / 4 chars
    assert toy_reward(ctx, [Sample(metadata={"text": "123"})]) == 1.0
    assert toy_reward(ctx, [Sample(metadata={"text": ""})]) == 0.0


def test_toy_hooks_load_by_dotted_path():
    assert load_generate("kernel.toy.generate")
    assert load_reward("kernel.toy.reward") is toy_reward
