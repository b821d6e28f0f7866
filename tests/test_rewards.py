"""Golden-value tests for kernel/rewards.py: weighted sums with terms that do not apply,
Miles' asymmetric outcome weighting, and the distribution of a reward hook's result (float,
bilateral dict, None) over the samples of one episode. Arithmetic is written out in comments.
"""

from __future__ import annotations

import math

import pytest

from kernel.rewards import (
    RewardConfig,
    apply_weighting,
    assign_rewards,
    asymmetric,
    overlong,
    weighted_sum,
)
from kernel.sample import Sample


def episode(*agents: str) -> list[Sample]:
    return [Sample(agent=a, turn=t) for t, a in enumerate(agents)]


# --- weighted_sum ----------------------------------------------------------------------------


def test_weighted_sum_excludes_none_terms():
    terms = {"accuracy": 1.0, "format": 0.5, "length": None}
    weights = {"accuracy": 1.0, "format": 0.2, "length": 3.0}
    # 1.0 * 1.0 + 0.2 * 0.5 = 1.1; "length" does not apply and adds nothing
    assert weighted_sum(terms, weights) == pytest.approx(1.1)


def test_weighted_sum_negative_weight():
    # 2.0 * 1.0 + (-0.5) * 4.0 = 0.0: a real zero, not None
    assert weighted_sum({"a": 1.0, "b": 4.0}, {"a": 2.0, "b": -0.5}) == 0.0


def test_weighted_sum_all_none_is_none():
    assert weighted_sum({"a": None, "b": None}, {"a": 1.0, "b": 2.0}) is None
    # ...whereas a term that applies with value 0 gives 0.0
    assert weighted_sum({"a": 0.0, "b": None}, {"a": 1.0, "b": 2.0}) == 0.0


def test_weighted_sum_key_mismatch_names_the_key():
    with pytest.raises(ValueError, match=r"'length'.*no weight"):
        weighted_sum({"accuracy": 1.0, "length": 0.0}, {"accuracy": 1.0})
    with pytest.raises(ValueError, match=r"'format'.*no reward term"):
        weighted_sum({"accuracy": 1.0}, {"accuracy": 1.0, "format": 0.5})


def test_weighted_sum_non_finite_term():
    with pytest.raises(ValueError, match=r"'accuracy'.*finite"):
        weighted_sum({"accuracy": math.nan}, {"accuracy": 1.0})


# --- asymmetric ------------------------------------------------------------------------------


def test_asymmetric_goldens():
    assert asymmetric(1.0, correct=True) == pytest.approx(1.2)  # 1.0 * 1.2
    assert asymmetric(1.0, correct=False) == pytest.approx(0.8)  # 1.0 * 0.8
    assert asymmetric(0.5, correct=True) == pytest.approx(0.6)  # 0.5 * 1.2
    # multiplicative (Miles): on a negative reward x0.8 SHRINKS an incorrect episode's penalty
    assert asymmetric(-1.0, correct=False) == pytest.approx(-0.8)  # -1.0 * 0.8
    assert asymmetric(-1.0, correct=True) == pytest.approx(-1.2)  # -1.0 * 1.2
    assert asymmetric(2.0, True, correct_scale=1.5, incorrect_scale=0.5) == pytest.approx(3.0)
    assert asymmetric(2.0, False, correct_scale=1.5, incorrect_scale=0.5) == pytest.approx(1.0)


# --- assign_rewards --------------------------------------------------------------------------


def test_assign_float_to_every_sample():
    ep = episode("doctor", "patient", "doctor")
    assign_rewards(ep, 0.5)
    assert [s.raw_reward for s in ep] == [0.5, 0.5, 0.5]


def test_assign_bilateral_dict():
    ep = episode("doctor", "patient", "doctor")
    # The patient's reward does not apply in this episode; "judge" has no sample here: ignored.
    assign_rewards(ep, {"doctor": 1.0, "patient": None, "judge": 0.3})
    assert [s.raw_reward for s in ep] == [1.0, None, 1.0]


def test_assign_dict_missing_agent_names_it():
    ep = episode("doctor", "patient")
    with pytest.raises(ValueError, match="'patient'"):
        assign_rewards(ep, {"doctor": 1.0})


def test_assign_none_clears_every_sample():
    ep = episode("doctor", "patient")
    for s in ep:
        s.raw_reward = 7.0  # stale value
    assign_rewards(ep, None)
    assert [s.raw_reward for s in ep] == [None, None]


@pytest.mark.parametrize(
    ("result", "match"),
    [
        (math.inf, "episode reward must be finite"),
        ({"doctor": math.nan}, "agent 'doctor' must be finite"),
        ("1.0", "episode reward must be a real number"),
        ({"doctor": [1.0]}, "agent 'doctor' must be a real number"),
    ],
)
def test_assign_bad_reward(result, match):
    with pytest.raises(ValueError, match=match):
        assign_rewards(episode("doctor"), result)


# --- apply_weighting and RewardConfig --------------------------------------------------------


def bilateral(doctor: float | None, patient: float | None) -> list[Sample]:
    ep = episode("doctor", "patient")
    assign_rewards(ep, {"doctor": doctor, "patient": patient})
    return ep


def test_apply_weighting_default_is_identity():
    ep = bilateral(1.0, -0.5)
    apply_weighting(ep, RewardConfig(), correct=None)
    assert [s.reward for s in ep] == [1.0, -0.5]


def test_asymmetric_sign_aware_goldens():
    # sign-aware: the weighting always moves the reward toward the outcome
    assert asymmetric(-1.0, False, sign_aware=True) == pytest.approx(-1.25)  # -1 / 0.8
    assert asymmetric(-1.0, True, sign_aware=True) == pytest.approx(-1 / 1.2)  # penalty eased
    assert asymmetric(1.0, False, sign_aware=True) == pytest.approx(0.8)  # positives as before
    assert asymmetric(1.0, True, sign_aware=True) == pytest.approx(1.2)
    assert asymmetric(0.0, False, sign_aware=True) == 0.0
    assert asymmetric(-2.0, False, 1.5, 0.5, sign_aware=True) == pytest.approx(-4.0)


def test_apply_weighting_sign_aware_negative_rewards():
    cfg = RewardConfig(asymmetric=True, sign_aware=True, agent_scale={"patient": 0.5})
    ep = [Sample(agent="doctor", raw_reward=-1.0), Sample(agent="patient", raw_reward=-1.0)]
    apply_weighting(ep, cfg, correct=False)
    # agent scale first (-1 * 0.5 = -0.5), then the outcome: -0.5 / 0.8
    assert [s.reward for s in ep] == pytest.approx([-1.25, -0.625])
    apply_weighting(ep, RewardConfig(asymmetric=True), correct=False)  # multiplicative
    assert [s.reward for s in ep] == pytest.approx([-0.8, -0.8])


def test_apply_weighting_asymmetric_and_agent_scale():
    cfg = RewardConfig(asymmetric=True, agent_scale={"patient": 0.5})
    ep = bilateral(1.0, 1.0)
    apply_weighting(ep, cfg, correct=True)
    # doctor: 1.0 * 1.2 = 1.2;  patient: 1.0 * 0.5 * 1.2 = 0.6
    assert [s.reward for s in ep] == pytest.approx([1.2, 0.6])
    ep = bilateral(1.0, 1.0)
    apply_weighting(ep, cfg, correct=False)
    # doctor: 1.0 * 0.8 = 0.8;  patient: 1.0 * 0.5 * 0.8 = 0.4
    assert [s.reward for s in ep] == pytest.approx([0.8, 0.4])


def test_apply_weighting_none_stays_none():
    ep = bilateral(1.0, None)
    apply_weighting(ep, RewardConfig(asymmetric=True), correct=True)
    assert ep[0].reward == pytest.approx(1.2) and ep[1].reward is None


def test_apply_weighting_asymmetric_needs_the_outcome():
    with pytest.raises(ValueError, match="asymmetric"):
        apply_weighting(bilateral(1.0, 1.0), RewardConfig(asymmetric=True), correct=None)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"correct_scale": 0.0}, "correct_scale"),
        ({"incorrect_scale": -0.8}, "incorrect_scale"),
        ({"agent_scale": {"patient": math.nan}}, r"agent_scale\['patient'\]"),
        ({"overlong_buffer_len": 8}, "overlong_buffer_len"),  # no overlong_max_len
        ({"overlong_buffer_len": 8, "overlong_max_len": 8}, "overlong_buffer_len"),
        ({"overlong_buffer_len": 4, "overlong_max_len": 8, "overlong_penalty": -1}, "penalty"),
    ],
)
def test_reward_config_validate_names_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RewardConfig(**kwargs).validate()


def test_assign_rewards_list_gives_one_reward_per_sample():
    samples = [
        Sample(agent="solver", index=0),
        Sample(agent="solver", index=0, turn=1),
        Sample(agent="selector"),
    ]
    assign_rewards(samples, [1.0, 0.0, None])
    assert [s.raw_reward for s in samples] == [1.0, 0.0, None]
    with pytest.raises(ValueError, match="2 entries for an episode of 3 samples"):
        assign_rewards(samples, [1.0, 0.0])
    with pytest.raises(ValueError, match="finite"):
        assign_rewards(samples, [1.0, float("nan"), 0.0])


# --- DAPO overlong shaping -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "expected"),
    # L_max 20, L_cache 8: free up to 12, then -(L - 12) / 8, -1 from 20 on (DAPO eq. 13)
    [(0, 0.0), (12, 0.0), (13, -0.125), (16, -0.5), (19, -0.875), (20, -1.0), (25, -1.0)],
)
def test_overlong_goldens(length, expected):
    assert overlong(length, max_len=20, buffer_len=8) == pytest.approx(expected)


def test_apply_weighting_adds_the_overlong_term_last_over_the_sampled_tokens_only():
    cfg = RewardConfig(
        asymmetric=True, overlong_buffer_len=8, overlong_max_len=20, overlong_penalty=0.5
    ).validate()
    short, long = Sample(agent="a"), Sample(agent="a")
    short.loss_mask = [1] * 10 + [0] * 30  # 10 sampled tokens (a partner's 30 are not counted)
    long.loss_mask = [1] * 16 + [0, 1, 1]  # 18 sampled tokens: -(18 - 12) / 8 = -0.75
    for s in (short, long):
        s.raw_reward = 1.0
    apply_weighting([short, long], cfg, correct=True)
    # 1.0 x 1.2 (correct), then + 0.5 x the overlong term, not scaled by 1.2
    assert [short.reward, long.reward] == pytest.approx([1.2, 1.2 - 0.5 * 0.75])
