"""RolloutManager: concurrency bound, timeouts and failures contained to the episode, aborted
groups returned whole, reward errors masked, DAPO constant-group filter."""

import asyncio
import dataclasses

import pytest

from kernel.hooks import RolloutContext
from kernel.rewards import RewardConfig
from kernel.rollout import RolloutManager
from kernel.sample import Sample, Status


def seeds(group_id: int, n: int) -> list[Sample]:
    return [
        Sample(prompt=f"p{group_id}", group_id=group_id, index=i, metadata={"row": group_id})
        for i in range(n)
    ]


def finished(seed: Sample, agent: str, value: int, status=Status.COMPLETED) -> Sample:
    return dataclasses.replace(
        seed,
        agent=agent,
        prompt_ids=[1, 2],
        response_ids=[3, value],
        loss_mask=[1, 1],
        status=status,
        metadata=dict(seed.metadata),
    )


def run(manager, groups, **kw):
    return asyncio.run(manager.run(RolloutContext(), groups, **kw))


async def two_agents(ctx, seed):
    await asyncio.sleep(0)
    return [finished(seed, "solver", seed.index), finished(seed, "selector", 7)]


def reward_by_agent(ctx, samples):
    return {s.agent: float(s.response_ids[-1]) for s in samples}


def test_two_agents_get_their_own_rewards():
    m = RolloutManager(two_agents, reward_by_agent, RewardConfig(), concurrency=4, timeout_s=5)
    kept, aborted, stats = run(m, [seeds(0, 3)])
    assert not aborted and stats.episodes == 3 and stats.failed == 0
    samples = kept[0].samples
    assert [s.reward for s in samples if s.agent == "solver"] == [0.0, 1.0, 2.0]
    assert [s.reward for s in samples if s.agent == "selector"] == [7.0, 7.0, 7.0]


def test_concurrency_is_bounded():
    live, peak = 0, 0

    async def slow(ctx, seed):
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        await asyncio.sleep(0.01)
        live -= 1
        return [finished(seed, "a", 1)]

    m = RolloutManager(slow, lambda c, s: 1.0, RewardConfig(), concurrency=3, timeout_s=5)
    _, _, stats = run(m, [seeds(g, 4) for g in range(3)])
    assert stats.episodes == 12 and peak == 3


def test_timeout_and_exception_become_failed_samples_and_the_step_goes_on():
    async def flaky(ctx, seed):
        if seed.index == 0:
            await asyncio.sleep(10)
        if seed.index == 1:
            raise RuntimeError("engine said no")
        return [finished(seed, "a", seed.index)]

    m = RolloutManager(flaky, lambda c, s: 1.0, RewardConfig(), concurrency=8, timeout_s=0.2)
    kept, aborted, stats = run(m, [seeds(0, 3)])
    assert stats.timed_out == 1 and stats.failed == 1 and not aborted
    by_index = {s.index: s for s in kept[0].samples}
    assert by_index[0].status is Status.FAILED and "timed out" in by_index[0].metadata["error"]
    assert by_index[1].status is Status.FAILED and "engine said no" in by_index[1].metadata["error"]
    assert by_index[2].status is Status.COMPLETED and by_index[2].reward == 1.0


def test_an_agent_that_never_spoke_is_dropped_and_an_empty_episode_fails():
    async def one_spoke(ctx, seed):  # Dialogue.sample() of a silent agent is None
        return [None] if seed.index == 0 else [None, finished(seed, "b", 1)]

    seen = []

    def reward(ctx, samples):
        seen.append([s.agent for s in samples])
        return 1.0

    m = RolloutManager(one_spoke, reward, RewardConfig(), concurrency=2, timeout_s=5)
    kept, _, stats = run(m, [seeds(0, 2)])
    assert seen == [["b"]] and stats.failed == 1
    by_index = {s.index: s for s in kept[0].samples}
    assert "generate returned no samples" in by_index[0].metadata["error"]
    assert by_index[1].agent == "b" and by_index[1].reward == 1.0


def test_two_samples_of_one_agent_and_turn_are_a_failed_episode():
    async def twice(ctx, seed):  # the second would overwrite the first wherever keyed
        return [finished(seed, "a", 1), finished(seed, "a", 2)]

    m = RolloutManager(twice, lambda c, s: 1.0, RewardConfig(), concurrency=2, timeout_s=5)
    kept, _, stats = run(m, [seeds(0, 1)])
    assert stats.failed == 1
    assert "share agent and turn" in kept[0].samples[0].metadata["error"]


def test_invalid_sample_from_hook_is_a_failed_episode():
    async def broken(ctx, seed):
        s = finished(seed, "a", 1)
        s.loss_mask = [1]  # shorter than the response
        return [s]

    m = RolloutManager(broken, lambda c, s: 1.0, RewardConfig(), concurrency=2, timeout_s=5)
    kept, _, stats = run(m, [seeds(0, 2)])
    assert stats.failed == 2
    assert "len(loss_mask)=1" in kept[0].samples[0].metadata["error"]


def test_an_aborted_episode_returns_the_whole_group_for_requeue():
    async def aborts(ctx, seed):
        status = Status.ABORTED if (seed.group_id, seed.index) == (1, 2) else Status.COMPLETED
        return [finished(seed, "a", 1, status)]

    m = RolloutManager(aborts, lambda c, s: 1.0, RewardConfig(), concurrency=8, timeout_s=5)
    kept, aborted, stats = run(m, [seeds(0, 3), seeds(1, 3)])
    assert [r.group[0].group_id for r in kept] == [0]
    assert [r.group[0].group_id for r in aborted] == [1] and stats.aborted_groups == 1
    assert all(s.status is Status.PENDING for s in aborted[0].group)  # seeds untouched


def test_reward_error_masks_the_episode():
    def bad_reward(ctx, samples):
        if samples[0].index == 1:
            raise KeyError("label")
        return 0.5

    m = RolloutManager(two_agents, bad_reward, RewardConfig(), concurrency=2, timeout_s=5)
    kept, _, stats = run(m, [seeds(0, 2)])
    assert stats.reward_errors == 1
    rewards = {(s.index, s.agent): s.reward for s in kept[0].samples}
    assert rewards[(0, "solver")] == 0.5 and rewards[(1, "solver")] is None


def test_asymmetric_weighting_reads_the_episode_outcome():
    async def outcome(ctx, seed):
        s = finished(seed, "a", 1)
        s.metadata["correct"] = seed.index == 0
        return [s]

    cfg = RewardConfig(asymmetric=True)
    m = RolloutManager(outcome, lambda c, s: 1.0, cfg, concurrency=2, timeout_s=5)
    kept, _, _ = run(m, [seeds(0, 2)])
    assert [s.reward for s in kept[0].samples] == [1.2, 0.8]  # 1.0 x 1.2 / 1.0 x 0.8


def test_dynamic_sampling_drops_constant_groups():
    async def gen(ctx, seed):
        # group 0: rewards differ across episodes; group 1: all equal
        return [finished(seed, "a", seed.index if seed.group_id == 0 else 5)]

    m = RolloutManager(
        gen, lambda c, s: float(s[0].response_ids[-1]), RewardConfig(), concurrency=8, timeout_s=5
    )
    kept, _, stats = run(m, [seeds(0, 3), seeds(1, 3)], drop_constant_groups=True)
    assert [r.group[0].group_id for r in kept] == [0] and stats.dropped_groups == 1


def test_loop_refills_dropped_and_aborted_groups_from_the_buffer(tmp_path):
    """kernel.run.runtime.Runtime.collect: DAPO-dropped groups are replaced by new prompts; an
    aborted group is requeued and rolled out again in the next round; every row is used once."""
    import json

    from kernel.buffer import DataBuffer, DataConfig
    from kernel.run.config import TrainConfig
    from kernel.run.runtime import Runtime

    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(8)))
    data = DataConfig(
        path=str(path), label_key=None, n_samples_per_prompt=2, shuffle=False, prompts_per_step=3
    )
    cfg = TrainConfig(data=data, dynamic_sampling=True, max_refill_rounds=4)
    attempts: dict[int, int] = {}

    async def gen(ctx, seed):
        row = seed.metadata["row"]
        if seed.index == 0:
            attempts[row] = attempts.get(row, 0) + 1
        status = Status.ABORTED if row == 1 and attempts[row] == 1 else Status.COMPLETED
        # rows 0 and 2: constant reward in the group -> dropped by dynamic sampling
        return [finished(seed, "a", 9 if row in (0, 2) else seed.index, status)]

    def reward(ctx, samples):
        return float(samples[0].response_ids[-1])

    buffer = DataBuffer(data)
    manager = RolloutManager(gen, reward, RewardConfig(), concurrency=8, timeout_s=5)
    runtime = Runtime(cfg, [], buffer, RolloutContext(), manager, logger=None, start=0)
    batch = asyncio.run(runtime.rollout(step=0))
    kept_rows = sorted(r.group[0].metadata["row"] for r in batch.results)
    assert kept_rows == [1, 3, 4]  # 1 after its abort, 3 and 4 refilled for the dropped 0 and 2
    assert attempts == {0: 1, 1: 2, 2: 1, 3: 1, 4: 1}
    assert batch.stats.dropped_groups == 2 and batch.stats.aborted_groups == 1
    assert buffer.next_groups(1)[0][0].metadata["row"] == 5  # nothing skipped or repeated


# ---- joint_mode cross (CoMLRL) ----------------------------------------------------------------


async def pair(ctx, seed):
    """Two agents answering in parallel: a's answer is index + 1, b's is 10 x (index + 1)."""
    return [finished(seed, "a", seed.index + 1), finished(seed, "b", 10 * (seed.index + 1))]


def test_cross_scores_every_combination_and_sums_each_samples_rewards():
    calls, live, peak = [], 0, 0

    async def product(ctx, samples):
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        await asyncio.sleep(0.001)
        live -= 1
        a, b = (s.response_ids[-1] for s in samples)
        calls.append((a, b))
        for s in samples:
            s.metadata["scored_with"] = (a, b)  # a hook writing metadata
        return {"a": float(a * b), "b": float(a * b)}  # one team reward per joint action

    cfg = RewardConfig(joint_mode="cross")
    m = RolloutManager(pair, product, cfg, concurrency=8, timeout_s=5)
    kept, _, stats = run(m, [seeds(0, 3)])
    # 3 x 3 joint actions; a_i's reward = a_i x (10 + 20 + 30), b_j's = b_j x (1 + 2 + 3)
    assert sorted(calls) == sorted((a, b) for a in (1, 2, 3) for b in (10, 20, 30))
    samples = kept[0].samples
    assert len(samples) == 6  # nothing but the K x N samples is kept
    assert [s.reward for s in samples if s.agent == "a"] == [60.0, 120.0, 180.0]
    assert [s.reward for s in samples if s.agent == "b"] == [60.0, 120.0, 180.0]
    # each original carries its own episode's scoring (the diagonal), never another's
    assert [s.metadata["scored_with"] for s in samples if s.agent == "a"] == [
        (1, 10), (2, 20), (3, 30)
    ]  # fmt: skip
    assert peak <= 3 and stats.reward_errors == 0  # at most K joint actions at once


def test_cross_none_or_failing_joint_actions_mask_their_members():
    def picky(ctx, samples):
        a, b = (s.response_ids[-1] for s in samples)
        if (a, b) == (1, 20):
            raise RuntimeError("judge down")
        return {"a": 1.0, "b": None if b == 30 else 1.0}

    m = RolloutManager(pair, picky, RewardConfig(joint_mode="cross"), concurrency=8, timeout_s=5)
    kept, _, stats = run(m, [seeds(0, 3)])
    rewards = {(s.agent, s.index): s.reward for s in kept[0].samples}
    # (1, 20) failed: a_0 and b_1 lose their sums; b_2 is None in every joint action
    assert rewards == {("a", 0): None, ("a", 1): 3.0, ("a", 2): 3.0,
                       ("b", 0): 3.0, ("b", 1): None, ("b", 2): None}  # fmt: skip
    assert stats.reward_errors == 1


def test_cross_refuses_episodes_without_one_sample_per_agent():
    async def lonely(ctx, seed):
        return [finished(seed, "a", 1)] if seed.index else [finished(seed, "b", 1)]

    m = RolloutManager(lonely, lambda c, s: 1.0, RewardConfig(joint_mode="cross"), 8, 5)
    with pytest.raises(ValueError, match=r"one sample per agent.*g0/e1/a/t0"):
        run(m, [seeds(0, 2)])


def test_cross_config_refuses_a_team_estimator():
    from kernel.cli import train_config

    flags = ["--data.path=x.jsonl", "--reward.joint_mode=cross", "--advantage.estimator=magrpo"]
    with pytest.raises(ValueError, match="use grpo or dr_grpo"):
        train_config(flags)
    with pytest.raises(ValueError, match="joint_mode"):
        RewardConfig(joint_mode="crossed").validate()


def test_cross_weighting_error_masks_the_episode_and_counts():
    cfg = RewardConfig(joint_mode="cross", asymmetric=True)  # the hook sets no "correct"
    m = RolloutManager(pair, lambda c, s: {"a": 1.0, "b": 1.0}, cfg, concurrency=8, timeout_s=5)
    kept, _, stats = run(m, [seeds(0, 2)])
    assert all(s.reward is None for s in kept[0].samples) and stats.reward_errors == 2
