"""The in-process demo learns: a tiny model's reward rises through buffer -> reward ->
advantages -> loss -> AdamW. A flipped sign or a lost update makes it fail."""

from kernel.hooks import RolloutContext
from kernel.sample import Sample
from kernel.toy import DemoConfig, run_demo, toy_reward


def test_toy_reward_goldens():
    ctx = RolloutContext()
    assert toy_reward(ctx, [Sample(metadata={"text": "a1b2"})]) == 0.5  # 2 digits / 4 chars
    assert toy_reward(ctx, [Sample(metadata={"text": "123"})]) == 1.0
    assert toy_reward(ctx, [Sample(metadata={"text": ""})]) == 0.0


def test_demo_reward_rises(tmp_path):
    rows = run_demo(DemoConfig(steps=40, output_dir=str(tmp_path)), log=lambda line: None)
    first = sum(r["reward"] for r in rows[:5]) / 5
    last = sum(r["reward"] for r in rows[-5:]) / 5
    assert first <= 0.3, first
    assert last >= 0.8, (first, last)
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 40
