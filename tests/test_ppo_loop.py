"""The PPO update in the loop, end to end on CPU: several updates per rollout make the clip
bind (metrics.jsonl shows it) and still learn; staleness is 0 in sync mode and 1 one step off
policy; an agent trained every 2nd step trains on every rollout of its agent exactly once, with
TIS on the stale ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel.cli import train_config
from kernel.run.loop import train

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "kernel" / "presets" / "toy.yaml"
TOY_DUO = ROOT / "kernel" / "presets" / "toy_duo.yaml"


def mean(rows, key):
    return sum(r[key] for r in rows) / len(rows)


@pytest.mark.slow
def test_two_ppo_epochs_clip_and_learn(tmp_path):
    cfg = train_config(
        [f"--config={TOY}", f"--output_dir={tmp_path}", "--num_steps=40", "--trainer.ppo_epochs=2"]
    )
    rows = train(cfg)
    logged = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/n_updates"] for r in logged] == [2.0] * 40
    # the second update of every step runs off the old policy: the ratio moves, the clip binds
    # early (large first updates), the KL between old and new stays positive throughout
    assert all(r["train/approx_kl"] > 0 and r["train/ratio_max"] > 1.0 for r in logged)
    assert sum(r["train/clipfrac"] > 0 for r in logged[:5]) >= 2
    assert mean(rows[:5], "reward") <= 0.3
    assert mean(rows[-5:], "reward") >= 0.9


@pytest.mark.slow
def test_staleness_is_zero_in_sync_mode_and_one_async(tmp_path):
    flags = ["--num_steps=4", "--data.prompts_per_step=2"]
    sync = train(train_config([f"--config={TOY}", f"--output_dir={tmp_path / 's'}", *flags]))
    assert [r["default/staleness"] for r in sync] == [0.0] * 4
    assert [r["train/stale_samples"] for r in sync] == [0.0] * 4
    assert all("train/tis_weight_mean" not in r for r in sync)  # tis_cap unset, none stale

    # a slow trainer (8 passes over the batch) leaves the next rollout time to finish before
    # the push, so each later step trains on samples one version behind (step 0's rollout ran
    # before any update); how many of them depends on the machine's load, hence a step's worth
    # over the three (all 48 here with a learning run on both cores), never more than one behind
    slow = ["--async_mode=true", "--trainer.ppo_epochs=8"]
    async_ = train(
        train_config([f"--config={TOY}", f"--output_dir={tmp_path / 'a'}", *flags, *slow])
    )
    staleness = [r["default/staleness"] for r in async_]
    assert staleness[0] == 0.0 and all(0.0 <= x <= 1.0 for x in staleness)
    assert sum(staleness[1:]) >= 1.0
    # the trainer counts the same stale samples from their weight versions, and weights them
    for r in async_:
        assert r["train/stale_samples"] == r["default/staleness"] * 16
        if r["train/stale_samples"]:
            assert r["train/tis_weight_mean"] != pytest.approx(1.0, abs=1e-6)


@pytest.mark.slow
def test_update_every_trains_each_rollout_of_its_agent_exactly_once(tmp_path):
    agents = (
        '--agents=[{"name":"doctor","model":"tiny-char"},'
        '{"name":"patient","model":"tiny-char","update_every":2}]'
    )
    flags = [agents, "--num_steps=7", "--async_mode=true", "--data.prompts_per_step=2"]
    rows = train(train_config([f"--config={TOY_DUO}", f"--output_dir={tmp_path}", *flags]))

    rolled = [r["patient/samples"] for r in rows]  # 2 prompts x 8 episodes, every step
    trained = [r.get("train/patient/n_samples", 0.0) for r in rows]
    assert trained == [16.0, 0.0, 32.0, 0.0, 32.0, 0.0, 32.0]  # its own step + the one it sat out
    assert [r["patient/queued"] for r in rows] == [0.0, 16.0, 0.0, 16.0, 0.0, 16.0, 0.0]
    assert sum(trained) == sum(rolled)  # every rollout trained on once: none lost, none twice
    assert all(r["staleness/dropped"] == 0 for r in rows)
    # at step 2k the kept rollout of step 2k-1 was sampled (async, beside the update of step
    # 2k-2): a sample that finished before that update's push is stale and importance-weighted,
    # one that finished after it carries the new version (the push pauses in place, so rows of
    # one request can end on either side of it); this step's own rollout is never stale
    stale = [r["train/patient/stale_samples"] for r in rows[2::2]]
    assert all(0.0 <= x <= 16.0 for x in stale)
    for r in rows[2::2]:
        if r["train/patient/stale_samples"]:
            assert r["train/patient/tis_weight_mean"] != pytest.approx(1.0, abs=1e-6)
    assert all(r["train/doctor/n_samples"] == 16.0 for r in rows)  # the doctor trains each step


@pytest.mark.slow
def test_replay_adds_recent_groups_within_the_staleness_bound(tmp_path):
    flags = ["--num_steps=3", "--data.prompts_per_step=2", "--replay_groups=4"]
    rows = train(train_config([f"--config={TOY}", f"--output_dir={tmp_path}", *flags]))
    # step 0 has nothing to replay; step 1 replays step 0's 2 groups (one version old); at
    # step 2 the replay holds 4 groups, but step 0's are two versions old (max_staleness 1)
    assert [r["replay/samples"] for r in rows] == [0.0, 16.0, 16.0]
    assert [r["train/n_samples"] for r in rows] == [16.0, 32.0, 32.0]
    assert [r["train/stale_samples"] for r in rows] == [0.0, 16.0, 16.0]
    assert all(r["train/tis_weight_mean"] != pytest.approx(1.0, abs=1e-6) for r in rows[1:])


@pytest.mark.slow
@pytest.mark.parametrize("shared", [False, True], ids=["separate", "shared"])
def test_ppo_with_a_critic_learns_the_toy_task(tmp_path, shared):
    """advantage.estimator gae: the critic's per-token GAE advantages alone (no group
    baseline) train the policy from about 0.3 to at least 0.8, and the critic's values, 0 at
    the start, follow the returns up; with a separate value model and with a value head on
    the actor (critic.shared; measured 0.14 -> 0.93 as with a separate one)."""
    flags = ["--num_steps=40", "--advantage.estimator=gae", "--critic.lr=0.002"]
    flags += [f"--critic.shared={str(shared).lower()}"]
    rows = train(train_config([f"--config={TOY}", f"--output_dir={tmp_path}", *flags]))
    assert mean(rows[:5], "reward") <= 0.35
    assert mean(rows[-5:], "reward") >= 0.8
    logged = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["train/critic/n_updates"] == 1.0 for r in logged)
    assert logged[0]["train/critic/value_mean"] == 0.0  # the zero-initialised head
    last = logged[-5:]
    assert mean(last, "train/critic/value_mean") >= 0.75
    gap = [abs(r["train/critic/value_mean"] - r["train/critic/return_mean"]) for r in last]
    assert max(gap) < 0.1


@pytest.mark.slow
def test_a_resumed_gae_run_keeps_its_critic(tmp_path):
    """The critic is checkpointed with its model: a resumed run's first values are the trained
    critic's, not a fresh head's zeros."""
    flags = [f"--output_dir={tmp_path}", "--advantage.estimator=gae", "--critic.lr=0.01"]
    flags += ["--data.prompts_per_step=2", "--save_every=1"]
    first = train(train_config([f"--config={TOY}", *flags, "--num_steps=2"]))
    assert first[0]["train/critic/value_mean"] == 0.0
    resumed = train(train_config([f"--config={TOY}", *flags, "--num_steps=3", "--resume=true"]))
    assert [r["step"] for r in resumed] == [2]
    assert resumed[0]["train/critic/value_mean"] != 0.0
