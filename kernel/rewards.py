"""Reward weighting: turn what a recipe's reward hook returned into ``Sample.reward``.

A recipe's reward hook scores one episode (see ``kernel/hooks.py``): a float for every sample of
the episode, a dict ``agent -> float | None`` for bilateral rewards (doctor and patient scored
separately), or None for "does not apply". This module does the two steps after the hook:

1. ``assign_rewards`` puts that result into ``sample.raw_reward``, checking it is complete and
   finite, so a typo in an agent name fails loudly instead of training on a missing reward;
2. ``apply_weighting`` sets ``sample.reward`` from ``raw_reward`` with one visible line: a
   per-agent scale and, optionally, Miles' asymmetric outcome weighting (every sample of an
   episode is multiplied by 1.2 when the episode was correct, by 0.8 when it was not) and
   DAPO's overlong shaping (a penalty growing linearly over the last tokens before a length).

``weighted_sum`` combines several reward terms (accuracy, format, length...) the way TRL does:
a term that is None does not apply and contributes nothing; only when no term applies is the
result None. Advantages are computed later, from ``sample.reward``, in ``kernel/advantages.py``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field

from kernel.hooks import RewardResult
from kernel.sample import Sample


def _finite(value: object, what: str) -> float:
    """``value`` as a float; ValueError naming ``what`` when it is not a finite real number."""
    # bool is a numbers.Real: a reward hook returning True/False is a plain 1.0/0.0 reward.
    if not isinstance(value, numbers.Real):
        raise ValueError(f"{what} must be a real number or None, got {type(value).__name__}")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{what} must be finite, got {out}")
    return out


def weighted_sum(terms: Mapping[str, float | None], weights: Mapping[str, float]) -> float | None:
    """``sum(weights[k] * terms[k])`` over the terms that apply (are not None).

    A None term is excluded: it adds nothing and does not make the result None. The result is
    None only when every term is None, so "nothing applied" stays distinguishable from a real
    0.0. Every term needs a weight and every weight a term, so a renamed reward cannot be
    silently dropped: a mismatch raises ValueError naming the key.
    """
    if missing := sorted(set(terms) - set(weights)):
        raise ValueError(f"reward term(s) {missing} have no weight")
    if unused := sorted(set(weights) - set(terms)):
        raise ValueError(f"weight(s) {unused} name no reward term")
    applied = [
        _finite(weights[k], f"weight {k!r}") * _finite(t, f"reward term {k!r}")
        for k, t in terms.items()
        if t is not None
    ]
    return math.fsum(applied) if applied else None


def asymmetric(
    reward: float,
    correct: bool,
    correct_scale: float = 1.2,
    incorrect_scale: float = 0.8,
    sign_aware: bool = False,
) -> float:
    """Miles' multi-agent outcome weighting: scale by the episode's outcome.

    Every sample of a correct episode is multiplied by ``correct_scale``, every sample of an
    incorrect one by ``incorrect_scale``, so agents are pushed harder toward joint successes.
    That is multiplicative (Miles): on a NEGATIVE reward the factors work the other way, x0.8
    shrinks the penalty of an incorrect episode and x1.2 deepens a correct one's.
    ``sign_aware`` makes the weighting always move the reward toward the outcome: a negative
    reward is divided by the factor instead (incorrect: -1 -> -1.25; correct: -1 -> -0.83).
    """
    factor = correct_scale if correct else incorrect_scale
    if sign_aware and reward < 0:
        factor = 1.0 / factor
    return reward * factor


def assign_rewards(samples: list[Sample], result: RewardResult) -> None:
    """Write a reward hook's ``result`` for one episode into ``sample.raw_reward``.

    float -> every sample; dict agent -> float | None -> each sample gets its agent's entry
    (keys for agents with no sample in this episode are ignored: an agent may sit an episode
    out); list -> one reward (or None) per sample, in order (e.g. several attempts of one agent
    in one episode, each scored on its own answer); None -> every ``raw_reward`` is None.
    Raises ValueError for an agent that has samples but no entry, a list of the wrong length,
    and a non-finite or non-numeric reward, naming the agent or sample.
    """
    if result is None:
        for s in samples:
            s.raw_reward = None
        return
    if isinstance(result, list | tuple):
        if len(result) != len(samples):
            raise ValueError(
                f"reward list has {len(result)} entries for an episode of {len(samples)} samples"
            )
        for s, r in zip(samples, result, strict=True):
            s.raw_reward = None if r is None else _finite(r, f"reward of sample {s.key}")
        return
    if isinstance(result, Mapping):
        agents = sorted({s.agent for s in samples})
        if missing := [a for a in agents if a not in result]:
            raise ValueError(
                f"reward dict has no entry for agent(s) {missing} (keys: {sorted(result)}); "
                "return None for an agent the reward does not apply to"
            )
        per_agent = {
            a: None if result[a] is None else _finite(result[a], f"reward of agent {a!r}")
            for a in agents
        }
        for s in samples:
            s.raw_reward = per_agent[s.agent]
        return
    value = _finite(result, "episode reward")
    for s in samples:
        s.raw_reward = value


JOINT_MODES = ("align", "cross")


@dataclass
class RewardConfig:
    """How raw rewards become the rewards advantages are computed from."""

    asymmetric: bool = False
    """scale every sample of an episode by its outcome (correct_scale / incorrect_scale)"""
    correct_scale: float = 1.2
    """with asymmetric: factor for the samples of a correct episode"""
    incorrect_scale: float = 0.8
    """with asymmetric: factor for the samples of an incorrect episode"""
    sign_aware: bool = False
    """with asymmetric: divide a negative reward by the factor instead of multiplying, so an
    incorrect episode's penalty grows (x1/0.8) rather than shrinks (see kernel.rewards)"""
    agent_scale: dict[str, float] = field(default_factory=dict)
    """per-agent reward factor, e.g. {patient: 0.5}; agents not listed get 1.0"""
    overlong_buffer_len: int = 0
    """DAPO's overlong reward shaping, off at 0: a sample whose own (sampled) tokens run into
    the last ``overlong_buffer_len`` of ``overlong_max_len`` loses up to ``overlong_penalty``,
    linearly (see ``overlong``)"""
    overlong_max_len: int = 0
    """with overlong_buffer_len: the length at which the full penalty applies (DAPO's L_max;
    usually the rollout's max_response_len)"""
    overlong_penalty: float = 1.0
    """with overlong_buffer_len: the largest penalty"""
    joint_mode: str = "align"
    """CoMLRL's joint_mode for agents that each answer once, in parallel: align (episode k's
    samples are one joint action) or cross (every combination of the group's samples, one per
    agent, is a joint action the reward hook scores; a sample's reward is the SUM of the
    rewards it got over the joint actions it is part of; see kernel.rollout)"""

    def validate(self) -> RewardConfig:
        for name in ("correct_scale", "incorrect_scale"):
            value = getattr(self, name)
            # A negative factor would flip which outcome is rewarded; zero would erase it.
            if not (isinstance(value, numbers.Real) and math.isfinite(value) and value > 0):
                raise ValueError(f"RewardConfig.{name} must be a finite number > 0, got {value!r}")
        if self.overlong_buffer_len:
            if not 0 < self.overlong_buffer_len < self.overlong_max_len:
                raise ValueError(
                    "RewardConfig.overlong_buffer_len must be in (0, overlong_max_len), got "
                    f"{self.overlong_buffer_len} with overlong_max_len {self.overlong_max_len}"
                )
            penalty = self.overlong_penalty
            if not (isinstance(penalty, numbers.Real) and math.isfinite(penalty) and penalty >= 0):
                raise ValueError(
                    f"RewardConfig.overlong_penalty must be a finite number >= 0, got {penalty!r}"
                )
        if self.joint_mode not in JOINT_MODES:
            raise ValueError(
                f"RewardConfig.joint_mode must be one of {JOINT_MODES}, got {self.joint_mode!r}"
            )
        for agent, value in self.agent_scale.items():
            if not (isinstance(value, numbers.Real) and math.isfinite(value)):
                raise ValueError(
                    f"RewardConfig.agent_scale[{agent!r}] must be a finite number, got {value!r}"
                )
        return self


def overlong(length: int, max_len: int, buffer_len: int) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), in [-1, 0]: 0 up to
    ``max_len - buffer_len`` tokens, then falling linearly to -1 at ``max_len``, and -1 beyond."""
    start = max_len - buffer_len
    if length <= start:
        return 0.0
    return max((start - length) / buffer_len, -1.0)


def apply_weighting(samples: list[Sample], cfg: RewardConfig, correct: bool | None) -> None:
    """Set ``sample.reward`` for the samples of one episode; a None ``raw_reward`` stays None.

    Order: the agent's scale, Miles' outcome weighting (if on), then DAPO's overlong term (if
    on) added last, counted over the sample's own sampled tokens (``loss_mask``), so that no
    outcome factor scales it.

    ``correct`` is the episode's outcome; it is required when ``cfg.asymmetric`` is on (a
    ValueError otherwise, rather than silently skipping the weighting) and unused when off.
    """
    if cfg.asymmetric and correct is None:
        raise ValueError("RewardConfig.asymmetric is on but the episode's `correct` is None")
    for s in samples:
        raw = s.raw_reward
        if raw is None:
            s.reward = None
            continue
        s.reward = raw * cfg.agent_scale.get(s.agent, 1.0)
        if cfg.asymmetric:  # Miles' outcome weighting, by the episode's outcome
            s.reward = asymmetric(
                s.reward, correct, cfg.correct_scale, cfg.incorrect_scale, cfg.sign_aware
            )
        if cfg.overlong_buffer_len:
            length = sum(s.loss_mask)
            term = overlong(length, cfg.overlong_max_len, cfg.overlong_buffer_len)
            s.reward += cfg.overlong_penalty * term
