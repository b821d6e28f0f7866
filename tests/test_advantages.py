"""Golden-value tests for kernel/advantages.py: every estimator, every grouping mode, and the
degenerate cases (singleton groups, constant rewards, None rewards, untrainable samples).

Every expected value is worked out by hand in the comments. GRPO uses the unbiased std and
``/(std + eps)`` with eps = 1e-6, so those goldens carry the eps explicitly.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch
import yaml
from torch.testing import assert_close

from kernel import advantages
from kernel.advantages import (
    ESTIMATORS,
    AdvantageBatch,
    AdvantageConfig,
    compute_advantages,
    estimator,
    estimators,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    team_rewards,
)
from kernel.rewards import RewardConfig, apply_weighting, assign_rewards
from kernel.sample import Sample, Status

EPS = 1e-6


def sample(reward, group=0, index=0, agent="a", turn=0, status=Status.COMPLETED) -> Sample:
    return Sample(group_id=group, index=index, agent=agent, turn=turn, status=status, reward=reward)


def episodes(rewards, group=0, agent="a") -> list[Sample]:
    """One sample per episode of one prompt group, episode index = position."""
    return [sample(r, group=group, index=i, agent=agent) for i, r in enumerate(rewards)]


def advs(samples: list[Sample]) -> list[float | None]:
    return [s.advantage for s in samples]


def run(samples, **cfg) -> dict[str, float]:
    return compute_advantages(samples, AdvantageConfig(**cfg))


# --- one prompt group, one agent --------------------------------------------------------------


def test_grpo_golden():
    s = episodes([1, 0, 0, 1])
    metrics = run(s, estimator="grpo")
    # mean = 0.5; deviations +-0.5; unbiased var = 4 * 0.25 / 3 = 1/3; std = sqrt(1/3) = 0.57735
    a = 0.5 / (math.sqrt(1 / 3) + EPS)  # = 0.866024...
    assert advs(s) == pytest.approx([a, -a, -a, a])
    assert metrics["adv/n_groups"] == 1 and metrics["adv/n_degenerate_groups"] == 0
    assert metrics["adv/mean"] == pytest.approx(0.0)
    assert metrics["adv/std"] == pytest.approx(a)  # population std of [a, -a, -a, a] is a


def test_grpo_without_std_normalisation():
    s = episodes([1, 0, 0, 1])
    run(s, estimator="grpo", std_normalize=False)
    # mean = 0.5 -> r - 0.5
    assert advs(s) == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_dr_grpo_golden_ignores_std_normalize():
    s = episodes([1, 0, 0, 0])
    run(s, estimator="dr_grpo", std_normalize=True)  # Dr. GRPO never divides by the std
    # mean = 1/4 = 0.25 -> [1 - 0.25, 0 - 0.25, ...]
    assert advs(s) == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_rloo_n2_and_n3():
    n2 = episodes([1, 0], group=0)
    n3 = episodes([3, 0, 0], group=1)
    run(n2 + n3, estimator="rloo")
    # n=2: the baseline is the other sample: 1 - 0 = 1, 0 - 1 = -1
    assert advs(n2) == pytest.approx([1.0, -1.0])
    # n=3: 3 - (0 + 0)/2 = 3;  0 - (3 + 0)/2 = -1.5;  0 - (3 + 0)/2 = -1.5
    # (check: n/(n-1) * (r - mean) = 1.5 * (3 - 1) = 3 and 1.5 * (0 - 1) = -1.5)
    assert advs(n3) == pytest.approx([3.0, -1.5, -1.5])


def test_rloo_tensor_function():
    rewards = torch.tensor([1.0, 0.0, 3.0, 0.0, 0.0])  # (5,)
    index = torch.tensor([0, 0, 1, 1, 1])  # group 0: n=2, group 1: n=3 (same goldens as above)
    assert_close(rloo_advantages(rewards, index), torch.tensor([1.0, -1.0, 3.0, -1.5, -1.5]))


def test_grpo_tensor_function_two_groups():
    rewards = torch.tensor([1.0, 0.0, 2.0, 4.0], dtype=torch.float64)  # (4,)
    index = torch.tensor([0, 0, 1, 1])
    # group 0: mean 0.5, dev +-0.5, std = sqrt(0.5); group 1: mean 3, dev +-1, std = sqrt(2)
    a0 = 0.5 / (math.sqrt(0.5) + EPS)
    a1 = 1.0 / (math.sqrt(2.0) + EPS)
    expected = torch.tensor([a0, -a0, -a1, a1], dtype=torch.float64)
    assert_close(grpo_advantages(rewards, index, eps=EPS), expected)


# --- batch-wide REINFORCE++ ------------------------------------------------------------------


def test_reinforce_pp_whitens_the_whole_batch():
    g0 = episodes([1, 0], group=0)
    g1 = episodes([1, 1], group=1)
    metrics = run(g0 + g1, estimator="reinforce_pp")
    # batch [1, 0, 1, 1]: mean 0.75; dev [0.25, -0.75, 0.25, 0.25];
    # sum dev^2 = 3 * 0.0625 + 0.5625 = 0.75; unbiased var = 0.75 / 3 = 0.25; std = 0.5
    d = 0.5 + EPS
    assert advs(g0 + g1) == pytest.approx([0.25 / d, -0.75 / d, 0.25 / d, 0.25 / d])
    # Batch-wide on purpose: group 1's constant rewards still get a non-zero advantage.
    assert g1[0].advantage > 0.49
    assert metrics["adv/n_groups"] == 1  # the batch is the one group


def test_reinforce_pp_tensor_degenerate_batches():
    assert_close(reinforce_pp_advantages(torch.tensor([2.0])), torch.tensor([0.0]))
    assert_close(reinforce_pp_advantages(torch.tensor([2.0, 2.0])), torch.tensor([0.0, 0.0]))


def test_reinforce_pp_baseline_group_mean_then_whiten():
    g0 = episodes([1, 0], group=0)
    g1 = episodes([1, 1], group=1)
    run(g0 + g1, estimator="reinforce_pp_baseline")
    # group means 0.5 and 1.0 -> centred [0.5, -0.5, 0, 0]; batch mean 0;
    # sum dev^2 = 0.5; unbiased var = 0.5 / 3 = 1/6; std = sqrt(1/6) = 0.408248
    a = 0.5 / (math.sqrt(1 / 6) + EPS)  # = 1.224742...
    assert advs(g0 + g1) == pytest.approx([a, -a, 0.0, 0.0])


# --- grouping modes: roles and turns are never mixed unless asked ------------------------------


def mixed_group() -> list[Sample]:
    """One prompt group, two episodes; the doctor speaks twice (turns 0, 1), the patient once."""
    return [
        sample(1, index=0, agent="doctor", turn=0),
        sample(0, index=1, agent="doctor", turn=0),
        sample(3, index=0, agent="doctor", turn=1),
        sample(1, index=1, agent="doctor", turn=1),
        sample(0, index=0, agent="patient", turn=0),
        sample(0, index=1, agent="patient", turn=0),
    ]


@pytest.mark.parametrize(
    ("group_by", "expected", "n_groups", "n_degenerate"),
    [
        # all six together: mean = (1+0+3+1+0+0)/6 = 5/6
        ("prompt", [1 / 6, -5 / 6, 13 / 6, 1 / 6, -5 / 6, -5 / 6], 1, 0),
        # doctor [1, 0, 3, 1]: mean 5/4 -> [-0.25, -1.25, 1.75, -0.25]; patient [0, 0]: constant
        ("prompt_agent", [-0.25, -1.25, 1.75, -0.25, 0.0, 0.0], 2, 1),
        # doctor t0 [1, 0]: mean 0.5; doctor t1 [3, 1]: mean 2; patient t0 [0, 0]: constant
        ("prompt_agent_turn", [0.5, -0.5, 1.0, -1.0, 0.0, 0.0], 3, 1),
    ],
)
def test_dr_grpo_grouping_modes(group_by, expected, n_groups, n_degenerate):
    s = mixed_group()
    metrics = run(s, estimator="dr_grpo", group_by=group_by)
    assert advs(s) == pytest.approx(expected)
    assert metrics["adv/n_groups"] == n_groups
    assert metrics["adv/n_degenerate_groups"] == n_degenerate


def test_grpo_per_agent_does_not_mix_roles():
    s = mixed_group()
    run(s, estimator="grpo")  # default group_by="prompt_agent"
    # doctor [1, 0, 3, 1]: mean 1.25, dev [-0.25, -1.25, 1.75, -0.25],
    # sum dev^2 = 0.0625 + 1.5625 + 3.0625 + 0.0625 = 4.75; var = 4.75 / 3; std = 1.258306
    d = math.sqrt(4.75 / 3) + EPS
    assert advs(s[:4]) == pytest.approx([-0.25 / d, -1.25 / d, 1.75 / d, -0.25 / d])
    # The patient's constant rewards are not normalised against the doctor's: exactly 0.
    assert advs(s[4:]) == [0.0, 0.0]


def test_grpo_per_turn():
    s = mixed_group()
    run(s, estimator="grpo", group_by="prompt_agent_turn")
    # doctor t0 [1, 0]: dev +-0.5, std sqrt(0.5); doctor t1 [3, 1]: dev +-1, std sqrt(2)
    a0 = 0.5 / (math.sqrt(0.5) + EPS)
    a1 = 1.0 / (math.sqrt(2.0) + EPS)
    assert advs(s) == pytest.approx([a0, -a0, a1, -a1, 0.0, 0.0])


def test_an_advantage_group_splits_a_prompts_group():
    # two episodes of one prompt, each a generated problem attempted twice (turns 0 and 1);
    # problem 0 is easy (1, 1), problem 1 hard (0, 0): together they would look like skill
    s = [
        sample(r, index=i, turn=t)
        for i, t, r in [(0, 0, 1.0), (0, 1, 1.0), (1, 0, 0.0), (1, 1, 0.0)]
    ]
    run(s, estimator="dr_grpo")
    assert advs(s) == [0.5, 0.5, -0.5, -0.5]
    for x in s:
        x.metadata["advantage_group"] = x.index  # each problem's attempts against each other
    metrics = run(s, estimator="dr_grpo")
    assert advs(s) == [0.0, 0.0, 0.0, 0.0]
    assert metrics["adv/n_groups"] == 2 and metrics["adv/n_degenerate_groups"] == 2


def test_rloo_per_agent():
    s = mixed_group()
    run(s, estimator="rloo")
    # doctor [1, 0, 3, 1], sum 5, n 4: r - (5 - r)/3
    #   1 - 4/3 = -1/3;  0 - 5/3 = -5/3;  3 - 2/3 = 7/3;  1 - 4/3 = -1/3
    assert advs(s) == pytest.approx([-1 / 3, -5 / 3, 7 / 3, -1 / 3, 0.0, 0.0])


# --- MAGRPO: team reward, baseline over the group's episodes -----------------------------------


def two_agent_episodes(group: int, pairs: list[tuple[float, float]]) -> list[Sample]:
    out = []
    for i, (ra, rb) in enumerate(pairs):
        out += [
            sample(ra, group=group, index=i, agent="a"),
            sample(rb, group=group, index=i, agent="b"),
        ]
    return out


@pytest.mark.parametrize("group_by", ["prompt", "prompt_agent"])
def test_magrpo_team_sum(group_by):
    g0 = two_agent_episodes(0, [(1, 0), (1, 1), (0, 0)])
    g1 = two_agent_episodes(1, [(2, 2), (1, 1)])
    metrics = run(g0 + g1, estimator="magrpo", group_by=group_by, team_reward="sum")
    # group 0 teams (sum): 1, 2, 0 -> mean 1 -> advantages 0, +1, -1, for BOTH agents
    assert advs(g0) == pytest.approx([0.0, 0.0, 1.0, 1.0, -1.0, -1.0])
    # group 1 teams: 4, 2 -> mean 3 -> +1, -1 (its own prompt group's baseline, not group 0's)
    assert advs(g1) == pytest.approx([1.0, 1.0, -1.0, -1.0])
    # prompt: 2 groups; prompt_agent: (0,a), (0,b), (1,a), (1,b), each over the same teams
    assert metrics["adv/n_groups"] == (2 if group_by == "prompt" else 4)


def test_magrpo_team_mean():
    g0 = two_agent_episodes(0, [(1, 0), (1, 1), (0, 0)])
    run(g0, estimator="magrpo", team_reward="mean")
    # teams (mean): 0.5, 1, 0 -> mean 0.5 -> 0, +0.5, -0.5
    assert advs(g0) == pytest.approx([0.0, 0.0, 0.5, 0.5, -0.5, -0.5])


def test_magrpo_agent_with_two_turns_counts_once():
    s = [
        sample(1, index=0, agent="a", turn=0),
        sample(1, index=0, agent="a", turn=1),
        sample(1, index=0, agent="b"),
        sample(0, index=1, agent="a", turn=0),
        sample(0, index=1, agent="b"),
    ]
    run(s, estimator="magrpo", team_reward="sum")
    # episode 0: a = mean(1, 1) = 1, b = 1 -> team 2 (3 if a's turns were each counted);
    # episode 1: team 0 -> mean 1 -> +1, -1 (double counting would give +-1.5)
    assert advs(s) == pytest.approx([1.0, 1.0, 1.0, -1.0, -1.0])
    run(s, estimator="magrpo", group_by="prompt_agent_turn", team_reward="sum")
    # per-turn baseline: a's turn 1 was reached only in episode 0 -> a group of one -> 0.0
    assert advs(s) == pytest.approx([1.0, 0.0, 1.0, -1.0, -1.0])


def test_magrpo_default_team_is_the_mean_and_a_none_member_does_not_count():
    g0 = two_agent_episodes(0, [(1, 0), (1, 1), (0, 0)])
    run(g0, estimator="magrpo")
    # default team_reward "mean": as test_magrpo_team_mean
    assert advs(g0) == pytest.approx([0.0, 0.0, 0.5, 0.5, -0.5, -0.5])
    # b's reward does not apply in episode 0: the team there is a's alone (1), not (1 + 0)/2
    # nor 1 + 0. a's baseline: teams 1, 1, 0 -> mean 2/3 -> +1/3, +1/3, -2/3; b's (per agent,
    # over the episodes b has a reward in): teams 1, 0 -> +1/2, -1/2; b's own sample: None
    g0[1].reward = None
    run(g0, estimator="magrpo")
    assert [s.advantage for s in g0] == pytest.approx([1 / 3, None, 1 / 3, 0.5, -2 / 3, -0.5])
    # with sum, the None member lowered its partner's team: 1, 2, 0 would give a 0.0 there
    g0[1].reward = 0.0
    run(g0, estimator="magrpo", team_reward="sum")
    assert advs(g0)[0] == pytest.approx(0.0)


def test_reinforce_pp_baseline_degenerate_group_is_exactly_zero():
    # group 0 is constant; groups 1 and 2 are not: whitening shifts by the batch mean, which
    # is float noise here (each group's deviations sum to ~0), and must not reach group 0
    s = [
        *(sample(0.7, group=0, index=i) for i in range(3)),
        *(sample(r, group=1, index=i) for i, r in enumerate([0.1, 0.3, 0.9])),
        *(sample(r, group=2, index=i) for i, r in enumerate([0.2, 0.7])),
    ]
    run(s, estimator="reinforce_pp_baseline")
    assert [x.advantage for x in s[:3]] == [0.0, 0.0, 0.0]  # exact, not -2e-17
    assert all(x.advantage != 0.0 for x in s[3:])


def test_team_rewards_tensor_function():
    rewards = torch.tensor([1.0, 3.0, 2.0, 4.0])  # (N,)
    episode = torch.tensor([0, 0, 0, 1])
    agent = torch.tensor([0, 0, 1, 0])
    # episode 0: agent 0 mean(1, 3) = 2, agent 1 = 2 -> sum 4, mean 2; episode 1: agent 0 = 4
    assert_close(team_rewards(rewards, episode, agent, "sum"), torch.tensor([4.0, 4.0]))
    assert_close(team_rewards(rewards, episode, agent, "mean"), torch.tensor([2.0, 4.0]))


# --- CoMLRL's family: the team reward with another baseline ------------------------------------

# group 0, two agents, team rewards (mean of the pair): 1, 0, 0.5, 0.5 (mean 0.5, max 1)
COMLRL_PAIRS = [(1, 1), (0, 0), (1, 0), (0.5, 0.5)]
COMLRL_GOLDENS = {
    "magrpo": [0.5, -0.5, 0.0, 0.0],  # team - mean
    "mareinforce": [1.0, 0.0, 0.5, 0.5],  # the team reward itself
    # team - mean of the OTHER three: 1 - 1/3, 0 - 2/3, 0.5 - 1/2, 0.5 - 1/2
    "marloo": [2 / 3, -2 / 3, 0.0, 0.0],
    "maremax": [0.0, -1.0, -0.5, -0.5],  # team - max
}


@pytest.mark.parametrize("estimator", list(COMLRL_GOLDENS))
def test_comlrl_family_goldens_given_to_both_agents(estimator):
    s = two_agent_episodes(0, COMLRL_PAIRS)
    run(s, estimator=estimator)
    expected = COMLRL_GOLDENS[estimator]
    assert advs(s)[0::2] == pytest.approx(expected) and advs(s)[1::2] == pytest.approx(expected)


@pytest.mark.parametrize("estimator", list(COMLRL_GOLDENS))
def test_comlrl_family_matches_comlrls_own_advantage_function(estimator):
    """The same team returns through CoMLRL 1.4.3's MAGRPOTrainer._compute_advantages, with
    the advantage_mode each of its trainers sets (peers extra)."""
    comlrl = pytest.importorskip("comlrl.trainers.reinforce")
    trainer = {
        "magrpo": comlrl.MAGRPOTrainer,
        "mareinforce": comlrl.MAREINFORCETrainer,
        "marloo": comlrl.MARLOOTrainer,
        "maremax": comlrl.MAReMaxTrainer,
    }[estimator]
    mode = trainer.default_config_cls().advantage_mode if estimator != "magrpo" else "mean"
    theirs = trainer._compute_advantages(
        type("Stub", (), {"advantage_mode": mode})(),
        torch.tensor([(a + b) / 2 for a, b in COMLRL_PAIRS]),
    )
    s = two_agent_episodes(0, COMLRL_PAIRS)
    run(s, estimator=estimator)
    assert advs(s)[0::2] == pytest.approx(theirs.tolist())


def test_mareinforce_has_no_baseline_so_a_constant_group_keeps_its_reward():
    s = episodes([0.1, 0.1, 0.1])
    metrics = run(s, estimator="mareinforce")
    assert advs(s) == pytest.approx([0.1, 0.1, 0.1])
    assert metrics["adv/n_degenerate_groups"] == 0  # not all zero: it trains
    zero = episodes([0.0, 0.0])
    assert run(zero, estimator="mareinforce")["adv/n_degenerate_groups"] == 1


# --- GiGPO ---------------------------------------------------------------------------------------


def gigpo_episodes(steps_per_episode, group=0) -> list[Sample]:
    """One sample per step: steps_per_episode[e] = [(reward, anchor), ...] in turn order."""
    out = []
    for e, steps in enumerate(steps_per_episode):
        for t, (r, anchor) in enumerate(steps):
            s = sample(r, group=group, index=e, turn=t)
            if anchor is not None:
                s.metadata["anchor"] = anchor
            out.append(s)
    return out


def test_gigpo_golden_mean_normalized():
    s = gigpo_episodes(
        [[(0, "s"), (1, "x")], [(0, "s"), (0, "y")], [(0, "s"), (1, "x")]]  # 3 episodes
    )
    run(s, estimator="gigpo", std_normalize=False, gamma=0.5, step_weight=1.0)
    # episode returns 1, 0, 1 -> mean 2/3 -> A_E = 1/3, -2/3, 1/3 (every step of the episode)
    # step returns (gamma 0.5): ep0 0 + 0.5 * 1 = 0.5, 1; ep1 0, 0; ep2 0.5, 1
    # anchor s: 0.5, 0, 0.5 -> mean 1/3 -> +1/6, -1/3, +1/6; anchor x: 1, 1 -> 0; y alone -> 0
    assert advs(s) == pytest.approx([1 / 3 + 1 / 6, 1 / 3, -2 / 3 - 1 / 3, -2 / 3, 0.5, 1 / 3])


def test_gigpo_with_std_step_weight_and_a_step_without_anchor():
    s = gigpo_episodes([[(0, "s"), (1, None)], [(0, "s"), (0, None)]])
    run(s, estimator="gigpo", gamma=1.0, step_weight=0.5)
    # returns 1, 0 -> GRPO: +-0.5 / (std sqrt(0.5) + eps)
    a = 0.5 / (math.sqrt(0.5) + EPS)
    # anchor s: step returns 1, 0 -> the same +-a, weighted 0.5; no anchor: 0 at step level
    assert advs(s) == pytest.approx([a + 0.5 * a, a, -a - 0.5 * a, -a])


def test_gigpo_needs_whole_episodes_in_a_group():
    with pytest.raises(ValueError, match="gigpo compares whole episodes"):
        AdvantageConfig(estimator="gigpo", group_by="prompt_agent_turn").validate()


# --- degenerate groups, None rewards, untrainable samples --------------------------------------


@pytest.mark.parametrize(
    "estimator", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "magrpo", "marloo", "maremax"]
)
def test_group_of_one_gets_exactly_zero(estimator):
    lonely = episodes([5.0], group=0)
    other = episodes([1, 0], group=1)
    metrics = run(lonely + other, estimator=estimator)
    assert lonely[0].advantage == 0.0  # no baseline available
    assert other[0].advantage > other[1].advantage and other[1].advantage < 0
    assert metrics["adv/n_degenerate_groups"] == 1


@pytest.mark.parametrize("estimator", [e for e in ESTIMATORS if e not in ("mareinforce", "gae")])
def test_constant_rewards_give_exactly_zero(estimator):
    # 0.1 + 0.1 + 0.1 = 0.30000000000000004, so the float mean is 0.1 + 1.4e-17: without the
    # explicit mask, (r - mean) / (std + eps) would be about -1.4e-11, not 0.
    s = episodes([0.1, 0.1, 0.1])
    metrics = run(s, estimator=estimator)
    assert advs(s) == [0.0, 0.0, 0.0]
    assert metrics["adv/n_degenerate_groups"] == 1


def test_none_and_untrainable_are_excluded():
    s = [
        sample(1, index=0),
        sample(None, index=1),  # reward does not apply
        sample(0, index=2),
        sample(5, index=3, status=Status.FAILED),  # a reward, but not trainable
        sample(9, index=4, status=Status.ABORTED),
        sample(1, index=5, status=Status.TRUNCATED),  # truncated is still trainable
    ]
    s[1].advantage = 0.3  # a stale value must not survive
    metrics = run(s, estimator="dr_grpo")
    # statistics over [1, 0, 1] only: mean 2/3 -> 1/3, -2/3, 1/3
    assert advs(s) == pytest.approx([1 / 3, None, -2 / 3, None, None, 1 / 3])
    assert metrics["adv/n_samples"] == 3 and metrics["adv/n_excluded"] == 3


def test_nothing_to_train_on():
    s = [sample(None), sample(1, status=Status.FAILED)]
    metrics = run(s)
    assert advs(s) == [None, None]
    assert metrics["adv/n_groups"] == 0 and math.isnan(metrics["adv/mean"])


def test_non_finite_reward_names_the_sample():
    s = episodes([1.0, math.nan])
    with pytest.raises(ValueError, match=r"g0/e1/a/t0"):
        run(s)


# --- config ----------------------------------------------------------------------------------


def test_estimators_listed():
    assert ESTIMATORS == (
        "grpo",
        "dr_grpo",
        "rloo",
        "reinforce_pp",
        "reinforce_pp_baseline",
        "magrpo",
        "mareinforce",
        "marloo",
        "maremax",
        "gigpo",
        "gae",
    )


def test_gae_leaves_the_advantages_to_the_critic():
    s = episodes([1.0, 0.0, 1.0])
    for x in s:
        x.advantage = 0.5  # a stale value must not survive
    metrics = run(s, estimator="gae")
    assert advs(s) == [None, None, None]  # each trainer's critic sets them, per token
    assert metrics["adv/n_samples"] == 3 and metrics["adv/n_groups"] == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("estimator", "ppo"),
        ("group_by", "agent"),
        ("team_reward", "max"),
        ("eps", 0.0),
        ("gamma", 1.5),
        ("step_weight", -1.0),
    ],
)
def test_config_validate_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"AdvantageConfig.{field}"):
        AdvantageConfig(**{field: value}).validate()


# --- the path a reward takes: hook result -> weighting -> advantages ---------------------------


def test_bilateral_rewards_to_per_agent_advantages():
    batch = []
    # two episodes of one prompt; the hook scores doctor and patient separately
    for index, result in enumerate(
        [{"doctor": 1.0, "patient": 0.0}, {"doctor": 0.0, "patient": 0.0}]
    ):
        ep = [sample(None, index=index, agent="doctor"), sample(None, index=index, agent="patient")]
        assign_rewards(ep, result)
        apply_weighting(ep, RewardConfig(asymmetric=True), correct=index == 0)
        batch += ep
    # rewards: doctor 1 * 1.2 = 1.2 and 0 * 0.8 = 0; patient 0 and 0
    run(batch, estimator="dr_grpo")
    # doctor: mean 0.6 -> +0.6, -0.6; patient: constant -> 0
    assert advs(batch) == pytest.approx([0.6, 0.0, -0.6, 0.0])


def test_team_discount_gives_each_turn_its_discounted_team_return():
    """CoMLRL's multi-turn returns: two agents, two turns, two episodes. Team reward per turn
    (mean of the agents): ep0 (0.5, 1.0), ep1 (0.0, 0.5). discount 0.5: G(ep0) = (0.5 + 0.5 x
    1.0, 1.0) = (1.0, 1.0), G(ep1) = (0.0 + 0.5 x 0.5, 0.5) = (0.25, 0.5). Per-turn groups,
    mean baseline: turn 0 (1.0, 0.25) -> +-0.375, turn 1 (1.0, 0.5) -> +-0.25, for both agents."""
    rewards = {(0, 0): (1, 0), (0, 1): (1, 1), (1, 0): (0, 0), (1, 1): (1, 0)}
    s = [
        sample(r, index=e, agent=agent, turn=t)
        for (e, t), pair in rewards.items()
        for agent, r in zip("ab", pair, strict=True)
    ]
    run(s, estimator="magrpo", discount=0.5, group_by="prompt_agent_turn")
    got = {(x.index, x.turn, x.agent): x.advantage for x in s}
    for agent in "ab":
        assert got[0, 0, agent] == pytest.approx(0.375) and got[1, 0, agent] == pytest.approx(
            -0.375
        )
        assert got[0, 1, agent] == pytest.approx(0.25) and got[1, 1, agent] == pytest.approx(-0.25)
    # discount 1.0 is CoMLRL's undiscounted sum: ep0 t0 1.5, ep1 t0 0.5 -> +-0.5
    run(s, estimator="magrpo", discount=1.0, group_by="prompt_agent_turn")
    assert [x.advantage for x in s if x.turn == 0 and x.agent == "a"] == [0.5, -0.5]
    # without discount one team reward per episode: ep0 (0.5 + 1.0) / 2 ... the old rule
    run(s, estimator="magrpo", group_by="prompt_agent")
    assert [x.advantage for x in s if x.turn == 0 and x.agent == "a"] == [0.25, -0.25]


def test_discount_is_for_the_team_estimators_only():
    with pytest.raises(ValueError, match="discount applies to"):
        AdvantageConfig(estimator="grpo", discount=0.9).validate()
    with pytest.raises(ValueError, match="discount must be in"):
        AdvantageConfig(estimator="marloo", discount=1.5).validate()


# --- the registry ----------------------------------------------------------------------------


@pytest.fixture
def registry(monkeypatch):
    """The estimator registry as it is now, given back after the test (its toys leave)."""
    monkeypatch.setattr(advantages, "_REGISTRY", dict(advantages._REGISTRY))


def test_a_registered_estimator_is_chosen_by_name(registry, capfd):
    """A new estimator is one decorated function: validation, compute_advantages, the CLI's
    flag, the training config and kernel info take it by name."""

    @estimator("median_baseline")
    def median_baseline(batch: AdvantageBatch, cfg: AdvantageConfig) -> torch.Tensor:
        """r - the median reward of the sample's group (the lower one of an even group)."""
        groups = range(int(batch.index.max()) + 1)
        medians = torch.stack([batch.rewards[batch.index == g].median() for g in groups])
        return batch.rewards - medians[batch.index]  # (N,)

    s = [*episodes([3, 1, 0]), sample(None, index=3), *episodes([5, 5], group=1)]
    metrics = run(s, estimator="median_baseline")
    assert advs(s) == [2.0, 0.0, -1.0, None, 0.0, 0.0]  # medians 1 and 5; None left out
    assert metrics["adv/n_groups"] == 2 and metrics["adv/n_degenerate_groups"] == 1
    # group_by applies to it as to the built-ins: two agents' samples of one prompt
    duo = [*episodes([3, 1, 0], agent="a"), *episodes([5, 5], agent="b")]
    run(duo, estimator="median_baseline")  # prompt_agent: medians 1 and 5
    assert advs(duo) == [2.0, 0.0, -1.0, 0.0, 0.0]
    run(duo, estimator="median_baseline", group_by="prompt")  # one group, median 3
    assert advs(duo) == [0.0, -2.0, -3.0, 2.0, 2.0]
    assert estimators()["median_baseline"].fn is median_baseline
    assert "median_baseline" not in ESTIMATORS  # the built-ins only

    # the command line: the flag shows it, a training config takes it, kernel info lists it
    from kernel.cli import COMMANDS, main

    assert ",gae,median_baseline}" in COMMANDS["train"].parser().format_usage()
    main(["config", "--preset", "toy", "--advantage.estimator", "median_baseline"])
    assert yaml.safe_load(capfd.readouterr().out)["advantage"]["estimator"] == "median_baseline"
    main(["info"])
    assert "median_baseline" in capfd.readouterr().out

    # a team estimator: the team settings apply to it, as to magrpo
    estimator("team_sum", team=True)(lambda batch, cfg: batch.rewards)
    AdvantageConfig(estimator="team_sum", discount=0.5).validate()
    with pytest.raises(ValueError, match=r"discount applies to \('magrpo', .*'team_sum'\)"):
        AdvantageConfig(estimator="median_baseline", discount=0.5).validate()


def test_an_unknown_estimator_is_refused_naming_the_registered_ones(registry):
    known = "grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline, magrpo, mareinforce, "
    known += "marloo, maremax, gigpo, gae"
    refused = f"AdvantageConfig.estimator must be one of the registered estimators \\({known}\\)"
    with pytest.raises(ValueError, match=f"{refused}, got 'grpoo'"):
        AdvantageConfig(estimator="grpoo").validate()
    with pytest.raises(ValueError, match=f"{refused}, got 'grpoo'"):
        run(episodes([1, 0]), estimator="grpoo")
    with pytest.raises(ValueError, match=f"{refused}, got \\['grpo'\\]"):  # a YAML list
        AdvantageConfig(estimator=["grpo"]).validate()
    estimator("mine")(lambda batch, cfg: batch.rewards)
    with pytest.raises(ValueError, match=r"\(grpo, .*, gae, mine\), got 'yours'"):
        AdvantageConfig(estimator="yours").validate()
    # a name taken, or no word, is refused; so is an answer that is not one per sample
    with pytest.raises(
        ValueError, match=r"'grpo' is already registered, by kernel\.advantages\.grpo"
    ):
        estimator("grpo")(lambda batch, cfg: batch.rewards)
    with pytest.raises(ValueError, match="a word"):
        estimator("two words")
    estimator("short")(lambda batch, cfg: batch.rewards[:1])
    with pytest.raises(ValueError, match=r"'short' must return a tensor of shape \(2,\).*\(1,\)"):
        run(episodes([1, 0]), estimator="short")


def test_an_estimator_a_recipe_module_registers_is_taken_from_the_command_line(
    registry, capfd, monkeypatch
):
    """An estimator registered by the hooks' own modules (a recipe's reward.py) is chosen by
    name on the command line: the run's hooks are imported before advantage.estimator is
    checked, so `kernel config` and `kernel train` take it without a launcher of one's own."""
    from kernel.cli import main

    module = "tests.hook_fixtures.own_estimator"
    monkeypatch.delitem(sys.modules, module, raising=False)
    assert "fixture_centered" not in estimators()  # not imported yet
    hooks = [f"--reward_fn={module}.reward", "--advantage.estimator", "fixture_centered"]
    main(["config", "--preset", "toy", *hooks])
    assert yaml.safe_load(capfd.readouterr().out)["advantage"]["estimator"] == "fixture_centered"
    with pytest.raises(SystemExit):  # a name nothing registers is still refused
        main(["config", "--preset", "toy", "--advantage.estimator", "fixture_nowhere"])
    assert "fixture_nowhere" in capfd.readouterr().err
    sys.modules.pop(module)  # forgotten with its estimator (the registry fixture drops that)
