"""Advantage estimators for outcome rewards, computed per group, never silently batch-wide.

Every sample gets one scalar advantage (outcome rewards: the loss broadcasts it over the
sample's response tokens). The estimators are pure tensor functions over a reward vector
``(N,)`` and a group index ``(N,)`` (contiguous ints, one per group); ``compute_advantages``
builds those from a list of samples and writes ``sample.advantage`` back.

An estimator is registered by name: ``@estimator("NAME")`` on a function of an
``AdvantageBatch`` (the samples, their rewards ``(N,)`` and group index ``(N,)``) and the
``AdvantageConfig``, returning the advantages ``(N,)``; ``advantage.estimator: NAME`` then
chooses it. Validation, ``compute_advantages`` and ``kernel info`` read the registry, so a new
estimator is that one function (and its settings, if any, on ``AdvantageConfig``).

Estimators (``AdvantageConfig.estimator``), registered in this order:

- ``grpo``: ``(r - mean_g) / (std_g + eps)``; ``std_normalize=False`` drops the division.
  ``std_g`` is the unbiased (Bessel) group std, as ``torch.std`` in TRL and verl.
- ``dr_grpo``: ``r - mean_g``, never divided by the std (Dr. GRPO). Its other half, removing
  the per-sequence ``1/|o|`` length normalisation, lives in the loss aggregation
  (``kernel/loss.py``), not here.
- ``rloo``: ``r - mean of the OTHER samples of the group`` (leave-one-out baseline).
- ``reinforce_pp``: REINFORCE++, ``(r - mean_B) / (std_B + eps)`` over the WHOLE BATCH: the one
  estimator that is batch-wide by design, as its name says; ``group_by`` does not apply.
  Whitened per sample, not per token as OpenRLHF does (a token-weighted whitening would let
  long responses dominate the statistics).
- ``reinforce_pp_baseline``: subtract the group mean, then whiten over the batch.
- ``magrpo``: CoMLRL's MAGRPO in aligned mode. Every agent of an episode gets the team reward
  (``team_reward``: ``mean``, the default, or ``sum`` of the episode's agents' rewards, over
  the agents whose reward is not None, so a member the reward does not apply to neither lowers
  nor raises its partners'; ``sum`` scales with the number of agents that have a reward; an
  agent with several turns counts once, with the mean of its turns' rewards); the advantage
  is ``team - mean`` of the team rewards of the group's episodes, each episode counted once
  per group. With ``group_by="prompt_agent_turn"`` that is CoMLRL's per-turn baseline: the
  episodes that reached the same turn. No std division: CoMLRL's mean baseline alone (CoMLRL
  1.4.3 also divides by the group std by default, ``advantage_normalization``; with a reward
  hook that returns the team reward itself, ``grpo`` computes exactly that).
- CoMLRL's other trainers, the same team reward with another baseline over the group's
  episodes (``advantage_mode`` in CoMLRL 1.4.3's ``MAGRPOTrainer._compute_advantages``):
  ``mareinforce`` (MAREINFORCE: the team reward itself, no baseline), ``marloo`` (MARLOO:
  ``team - mean of the other episodes``) and ``maremax`` (MAReMax: ``team - max`` of the group).
- ``gigpo``: GiGPO (Feng et al. 2025, Dr.MAS), for episodes whose agent turns are separate
  samples (``turn`` = the step). Episode level: GRPO over the episodes' returns (the sum of
  each episode's step rewards, one per (group_id, index, agent)), given to every step of the
  episode. Step level: the discounted return from each step on, ``G_t = sum_k gamma^k r_(t+k)``,
  normalized like GRPO among the steps of the group's episodes that share an anchor state
  (``metadata["anchor"]``, any hashable the recipe sets, e.g. the observation text; a step
  without one, or alone with its anchor, gets 0 there). ``A = A_episode + step_weight *
  A_step``; ``std_normalize`` applies to both levels.
- ``gae``: PPO with a critic. Not computed here: each trainer's critic gives its samples
  per-token GAE advantages (``gamma``, ``lam``) over the agent's own tokens, whitened over the
  step's tokens when ``std_normalize`` (``kernel/train/critic.py``); this function only
  leaves them unset and counts the samples.

Groups (``AdvantageConfig.group_by``): the samples sharing ``group_id`` (``"prompt"``),
plus ``agent`` (``"prompt_agent"``, the default: Dr.MAS, no role is normalised against another
role's samples), plus ``turn`` (``"prompt_agent_turn"``). A recipe splits a prompt's group
further with ``metadata["advantage_group"]`` (any hashable): e.g. K attempts at an item the
episode generated itself (a proposer's problem), compared only with each other.

Degenerate cases, all defined and tested:

- A sample whose ``reward`` is None ("does not apply") or whose ``status`` is not trainable
  is left out of every statistic and gets ``advantage = None``.
- A group of one sample (no baseline available) or with constant rewards (nothing to prefer)
  gets advantage exactly ``0.0`` for every estimator with a baseline (all but
  ``mareinforce``, whose advantage is the team reward by definition). It is masked to 0, not left to
  ``0 / (~0 + eps)``, so floating-point noise in a mean never becomes a signal.
- ``reinforce_pp`` whitening of a batch of one, or of a constant batch, gives 0.0.
"""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from kernel.sample import Sample

Tensor = Any
"""A ``torch.Tensor``. torch is imported in the functions that compute, so the CLI reads this
module's config and registry for its flags without waiting for it; not imported for the
annotation, even under TYPE_CHECKING, whose blocks the CLI's parser runs (kernel/buffer.py's
``Dataset``)."""

GroupBy = Literal["prompt", "prompt_agent", "prompt_agent_turn"]
TeamReward = Literal["sum", "mean"]

GROUP_BY: tuple[str, ...] = typing.get_args(GroupBy)
TEAM_REWARDS: tuple[str, ...] = typing.get_args(TeamReward)


@dataclass
class AdvantageConfig:
    """Which advantage estimator to use and how samples are grouped for its baseline."""

    estimator: str = "grpo"
    """advantage estimator, a registered name (kernel info lists them; reinforce_pp alone is
    batch-wide); see kernel/advantages.py"""
    group_by: GroupBy = "prompt_agent"
    """samples sharing a baseline: prompt, prompt_agent (default, per role) or prompt_agent_turn"""
    std_normalize: bool = True
    """grpo: divide by the group std (dr_grpo and magrpo never do); gae: whiten the per-token
    advantages over the step's tokens"""
    eps: float = 1e-6
    """added to every std before dividing"""
    gamma: float = 1.0
    """gigpo: discount of the step-level returns; gae: discount per own token"""
    lam: float = 1.0
    """gae: GAE's lambda (1: the discounted return minus the value; 0: one-step TD)"""
    step_weight: float = 1.0
    """gigpo: weight of the step-level advantage (GiGPO's omega)"""
    discount: float | None = None
    """magrpo, mareinforce, marloo, maremax: None, one team reward per episode (an agent's
    turns averaged); a number, CoMLRL's multi-turn returns: the team reward of each turn (over
    the agents' samples of that turn) plus ``discount`` times the next turn's return, so every
    turn's samples get the discounted team return from there on (1.0: CoMLRL 1.4.3's
    undiscounted sum); pair it with ``group_by: prompt_agent_turn`` for CoMLRL's per-turn
    baselines"""
    team_reward: TeamReward = "mean"
    """magrpo, mareinforce, marloo, maremax: team reward of an episode = mean (default) or sum
    of the rewards of its agents that have one (None: does not apply, left out)"""

    def validate(self) -> AdvantageConfig:
        get_estimator(self.estimator)  # a name not registered is refused, naming those that are
        for name, value, allowed in (
            ("group_by", self.group_by, GROUP_BY),
            ("team_reward", self.team_reward, TEAM_REWARDS),
        ):
            if value not in allowed:
                raise ValueError(f"AdvantageConfig.{name} must be one of {allowed}, got {value!r}")
        if not (isinstance(self.eps, (int, float)) and math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"AdvantageConfig.eps must be a finite number > 0, got {self.eps!r}")
        if self.estimator == "gigpo" and self.group_by == "prompt_agent_turn":
            raise ValueError(
                "AdvantageConfig.group_by: gigpo compares whole episodes (their turns are its "
                "steps), so group_by must be prompt or prompt_agent, not prompt_agent_turn"
            )
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"AdvantageConfig.gamma must be in [0, 1], got {self.gamma!r}")
        if not 0 <= self.lam <= 1:
            raise ValueError(f"AdvantageConfig.lam must be in [0, 1], got {self.lam!r}")
        if self.discount is not None:
            if not get_estimator(self.estimator).team:
                team = tuple(n for n, e in _REGISTRY.items() if e.team)
                raise ValueError(
                    f"AdvantageConfig.discount applies to {team}, not "
                    f"{self.estimator!r} (gigpo and gae discount with gamma)"
                )
            if not 0 <= self.discount <= 1:
                raise ValueError(
                    f"AdvantageConfig.discount must be in [0, 1], got {self.discount!r}"
                )
        if not (math.isfinite(self.step_weight) and self.step_weight >= 0):
            raise ValueError(f"AdvantageConfig.step_weight must be >= 0, got {self.step_weight!r}")
        return self


# ---------------------------------------------------------------------------------------------
# The registry: an estimator is a function registered by name.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdvantageBatch:
    """What an estimator computes from: the samples that get an advantage (a reward that
    applies and a trainable status; the others are left out before), in the order given."""

    samples: tuple[Sample, ...]
    rewards: Tensor
    """(N,) float64, each sample's reward"""
    index: Tensor
    """(N,) long, each sample's group (``group_by`` and ``metadata["advantage_group"]``
    applied): contiguous ints 0..G-1 in order of first appearance"""


EstimatorFn = Callable[[AdvantageBatch, AdvantageConfig], Tensor | None]
_F = TypeVar("_F", bound=EstimatorFn)


@dataclass(frozen=True)
class Estimator:
    """A registered estimator: its name, its function and how ``compute_advantages`` and the
    config checks treat it."""

    name: str
    fn: EstimatorFn
    """``fn(batch, cfg)``: the advantages ``(N,)``, or None when none are set here (``gae``)"""
    batch_wide: bool = False
    """its statistics span the whole batch (``group_by`` does not apply): the metrics count the
    batch as one group"""
    team: bool = False
    """every agent of an episode gets the team reward: ``discount`` and ``team_reward`` apply,
    and ``reward.joint_mode cross`` (already a joint return) is refused"""


_REGISTRY: dict[str, Estimator] = {}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def estimator(name: str, *, batch_wide: bool = False, team: bool = False) -> Callable[[_F], _F]:
    """Register the decorated function as the advantage estimator ``name``
    (``advantage.estimator: NAME``); the function itself is returned unchanged.

    It is called as ``fn(batch: AdvantageBatch, cfg: AdvantageConfig)`` with at least one
    sample and returns their advantages ``(N,)`` (or None: none set here, as ``gae``, whose
    critic sets them per token). ``batch_wide`` and ``team``: see ``Estimator``. A name
    registered twice is refused, naming the function that has it."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"an estimator's name is a word (letters, digits, _ . -), got {name!r}")

    def register(fn: _F) -> _F:
        if name in _REGISTRY:
            held = _REGISTRY[name].fn
            raise ValueError(
                f"advantage estimator {name!r} is already registered, by "
                f"{held.__module__}.{held.__qualname__}"
            )
        _REGISTRY[name] = Estimator(name, fn, batch_wide, team)
        return fn

    return register


def estimators() -> dict[str, Estimator]:
    """Every registered estimator by name, in the order they were registered (the built-in
    ones, ``ESTIMATORS``, first)."""
    return dict(_REGISTRY)


def get_estimator(name: str) -> Estimator:
    """The estimator registered as ``name``; a ValueError naming every registered one if none
    is."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(
            f"AdvantageConfig.estimator must be one of the registered estimators "
            f"({', '.join(_REGISTRY)}), got {name!r}"
        )
    return _REGISTRY[name]


# ---------------------------------------------------------------------------------------------
# Pure tensor functions. rewards: (N,) float; index: (N,) long, group of each row, 0..G-1.
# ---------------------------------------------------------------------------------------------


def group_stats(rewards: Tensor, index: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-group ``(count, mean, std, degenerate)``, each ``(G,)``; std is unbiased.

    ``degenerate`` marks groups with one sample or constant rewards (max == min, exact).
    """
    import torch

    n_groups = int(index.max()) + 1 if index.numel() else 0
    zeros = rewards.new_zeros(n_groups)  # (G,)
    count = torch.bincount(index, minlength=n_groups).to(rewards.dtype)  # (G,)
    mean = zeros.index_add(0, index, rewards) / count.clamp_min(1)  # (G,)
    sq_dev = zeros.index_add(0, index, (rewards - mean[index]) ** 2)  # (G,)
    std = (sq_dev / (count - 1).clamp_min(1)).sqrt()  # (G,)
    r_max = zeros.scatter_reduce(0, index, rewards, "amax", include_self=False)  # (G,)
    r_min = zeros.scatter_reduce(0, index, rewards, "amin", include_self=False)  # (G,)
    # A group of one has max == min, so this covers both degenerate cases.
    return count, mean, std, r_max == r_min


def grpo_advantages(
    rewards: Tensor, index: Tensor, std_normalize: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO: ``(r - mean_g) / (std_g + eps)``, or ``r - mean_g`` without std normalisation."""
    import torch

    _, mean, std, degenerate = group_stats(rewards, index)
    adv = rewards - mean[index]  # (N,)
    if std_normalize:
        adv = adv / (std[index] + eps)
    return torch.where(degenerate[index], torch.zeros_like(adv), adv)  # (N,)


def dr_grpo_advantages(rewards: Tensor, index: Tensor) -> Tensor:
    """Dr. GRPO: ``r - mean_g``; the length-normalisation fix lives in the loss aggregation."""
    return grpo_advantages(rewards, index, std_normalize=False)


def rloo_advantages(rewards: Tensor, index: Tensor) -> Tensor:
    """RLOO: ``r_i - (sum_g - r_i) / (n_g - 1)``, the mean of the other samples of the group."""
    import torch

    count, mean, _, degenerate = group_stats(rewards, index)
    n = count[index]  # (N,)
    others_mean = (mean[index] * n - rewards) / (n - 1).clamp_min(1)  # (N,)
    adv = rewards - others_mean  # (N,)
    return torch.where(degenerate[index], torch.zeros_like(adv), adv)


def max_baseline_advantages(rewards: Tensor, index: Tensor) -> Tensor:
    """ReMax-style: ``r - max_g``, the group's best reward as the baseline (0 for the best)."""
    best = rewards.new_zeros(int(index.max()) + 1).scatter_reduce(
        0, index, rewards, "amax", include_self=False
    )  # (G,)
    return rewards - best[index]  # (N,)


def discounted_returns(rewards: Tensor, episode: Tensor, step: Tensor, gamma: float) -> Tensor:
    """``G_t = r_t + gamma * G_(t+1)`` within each episode, steps ordered by ``step``; (N,)."""
    returns = rewards.clone()
    order = sorted(range(len(rewards)), key=lambda i: (int(episode[i]), -int(step[i])))
    later: dict[int, float] = {}  # episode -> the return of its next step
    for i in order:
        e = int(episode[i])
        returns[i] = rewards[i] + gamma * later.get(e, 0.0)
        later[e] = float(returns[i])
    return returns


def batch_whiten(values: Tensor, eps: float = 1e-6) -> Tensor:
    """BATCH-WIDE ``(x - mean) / (std + eps)`` over all of ``values`` (N,); 0.0 if degenerate."""
    import torch

    if values.numel() < 2 or bool(values.max() == values.min()):
        return torch.zeros_like(values)
    return (values - values.mean()) / (values.std() + eps)  # (N,)


def reinforce_pp_advantages(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """REINFORCE++: global batch whitening of the rewards; batch-wide by design, no groups."""
    return batch_whiten(rewards, eps)


def reinforce_pp_baseline_advantages(rewards: Tensor, index: Tensor, eps: float = 1e-6) -> Tensor:
    """REINFORCE++ with baseline: subtract the group mean, then whiten over the whole batch.
    A degenerate group stays exactly 0 (whitening would shift it by the batch mean's float
    noise, ~1e-17)."""
    import torch

    adv = batch_whiten(dr_grpo_advantages(rewards, index), eps)  # (N,)
    degenerate = group_stats(rewards, index)[3]  # (G,)
    return torch.where(degenerate[index], torch.zeros_like(adv), adv)


def team_rewards(
    rewards: Tensor, episode: Tensor, agent: Tensor, reduce: TeamReward = "mean"
) -> Tensor:
    """MAGRPO team reward per episode ``(E,)`` from per-sample rewards ``(N,)``.

    ``episode`` and ``agent`` are ``(N,)`` indices. An agent's reward in an episode is the mean
    over its samples there (one per turn), so an agent is not counted once per turn; the team
    reward is the sum (or mean) of those over the agents present in the episode.
    """
    import torch

    n_agents = int(agent.max()) + 1
    n_episodes = int(episode.max()) + 1
    cell = episode * n_agents + agent  # (N,) one cell per (episode, agent)
    n_cells = n_episodes * n_agents
    cell_count = torch.bincount(cell, minlength=n_cells).to(rewards.dtype)  # (E*A,)
    cell_mean = rewards.new_zeros(n_cells).index_add(0, cell, rewards) / cell_count.clamp_min(1)
    team = cell_mean.view(n_episodes, n_agents).sum(dim=1)  # (E,)  absent cells add 0
    if reduce == "mean":
        team = team / (cell_count.view(n_episodes, n_agents) > 0).sum(dim=1)
    return team  # (E,)


# ---------------------------------------------------------------------------------------------
# The estimators, registered by name (kernel info lists them in this order).
# ---------------------------------------------------------------------------------------------


@estimator("grpo")
def grpo(batch: AdvantageBatch, cfg: AdvantageConfig) -> Tensor:
    """GRPO over the batch's groups; ``cfg.std_normalize`` and ``cfg.eps`` apply."""
    return grpo_advantages(batch.rewards, batch.index, cfg.std_normalize, cfg.eps)


@estimator("dr_grpo")
def dr_grpo(batch: AdvantageBatch, cfg: AdvantageConfig) -> Tensor:
    """Dr. GRPO: the group mean subtracted, never divided by the std."""
    return dr_grpo_advantages(batch.rewards, batch.index)


@estimator("rloo")
def rloo(batch: AdvantageBatch, cfg: AdvantageConfig) -> Tensor:
    """RLOO: the mean of the group's other samples subtracted."""
    return rloo_advantages(batch.rewards, batch.index)


@estimator("reinforce_pp", batch_wide=True)
def reinforce_pp(batch: AdvantageBatch, cfg: AdvantageConfig) -> Tensor:
    """REINFORCE++: the rewards whitened over the whole batch (no groups)."""
    return reinforce_pp_advantages(batch.rewards, cfg.eps)


@estimator("reinforce_pp_baseline")
def reinforce_pp_baseline(batch: AdvantageBatch, cfg: AdvantageConfig) -> Tensor:
    """REINFORCE++ with baseline: the group mean subtracted, then whitened over the batch."""
    return reinforce_pp_baseline_advantages(batch.rewards, batch.index, cfg.eps)


def _team(batch: AdvantageBatch, cfg: AdvantageConfig, baseline: Callable) -> Tensor:
    """CoMLRL's family: each sample's team value (the episode's team reward, or with
    ``cfg.discount`` its turn's discounted team return) minus ``baseline`` over the values of
    the group's episodes (or turns), each counted once per group."""
    import torch

    valid, rewards, index = batch.samples, batch.rewards, batch.index
    agent = _indices([s.agent for s in valid])  # (N,)
    if cfg.discount is None:  # one team reward per episode
        unit = _indices([(s.group_id, s.index) for s in valid])  # (N,)
        value = team_rewards(rewards, unit, agent, cfg.team_reward)  # (U,)
    else:  # one per (episode, turn): the discounted team return from that turn on
        unit = _indices([(s.group_id, s.index, s.turn) for s in valid])  # (N,)
        team = team_rewards(rewards, unit, agent, cfg.team_reward)  # (U,)
        episode = _indices([(s.group_id, s.index) for s in valid])  # (N,)
        turn = torch.tensor([s.turn for s in valid])  # (N,)
        unit_episode = episode.new_empty(len(team)).scatter_(0, unit, episode)  # (U,)
        unit_turn = turn.new_empty(len(team)).scatter_(0, unit, turn)  # (U,)
        value = discounted_returns(team, unit_episode, unit_turn, cfg.discount)  # (U,)
    # One row per (group, unit): each episode (or turn) counts once in each group it is in.
    pair = _indices(list(zip(index.tolist(), unit.tolist(), strict=True)))  # (N,)
    n_pairs = int(pair.max()) + 1
    pair_group = index.new_empty(n_pairs).scatter_(0, pair, index)  # (P,)
    pair_team = value.new_empty(n_pairs).scatter_(0, pair, value[unit])  # (P,)
    return baseline(pair_team, pair_group)[pair]  # (N,)


@estimator("magrpo", team=True)
def magrpo(batch: AdvantageBatch, cfg: AdvantageConfig) -> Tensor:
    """MAGRPO: the team reward minus the group mean (CoMLRL's mean baseline)."""
    return _team(batch, cfg, dr_grpo_advantages)


@estimator("mareinforce", team=True)
def mareinforce(batch: AdvantageBatch, cfg: AdvantageConfig) -> Tensor:
    """MAREINFORCE: the team reward itself, no baseline."""
    return _team(batch, cfg, lambda returns, _: returns)


@estimator("marloo", team=True)
def marloo(batch: AdvantageBatch, cfg: AdvantageConfig) -> Tensor:
    """MARLOO: the team reward minus the mean of the group's other episodes."""
    return _team(batch, cfg, rloo_advantages)


@estimator("maremax", team=True)
def maremax(batch: AdvantageBatch, cfg: AdvantageConfig) -> Tensor:
    """MAReMax: the team reward minus the group's best."""
    return _team(batch, cfg, max_baseline_advantages)


@estimator("gigpo")
def gigpo(batch: AdvantageBatch, cfg: AdvantageConfig) -> Tensor:
    """GiGPO's two levels (see the module docstring); ``index`` groups the steps' episodes."""
    import torch

    valid, rewards, index = batch.samples, batch.rewards, batch.index
    episode = _indices([(s.group_id, s.index, s.agent) for s in valid])  # (N,)
    returns = rewards.new_zeros(int(episode.max()) + 1).index_add(0, episode, rewards)  # (E,)
    # one row per episode, in the group of its steps (every step of an episode shares one)
    episode_group = index.new_empty(len(returns)).scatter_(0, episode, index)  # (E,)
    episode_adv = grpo_advantages(returns, episode_group, cfg.std_normalize, cfg.eps)  # (E,)
    step = torch.tensor([s.turn for s in valid])  # (N,)
    step_returns = discounted_returns(rewards, episode, step, cfg.gamma)  # (N,)
    # steps without an anchor each get a group of their own: no step-level signal
    anchors = _indices(
        [
            (int(g), s.metadata["anchor"]) if s.metadata.get("anchor") is not None else (None, i)
            for i, (g, s) in enumerate(zip(index.tolist(), valid, strict=True))
        ]
    )  # (N,)
    step_adv = grpo_advantages(step_returns, anchors, cfg.std_normalize, cfg.eps)  # (N,)
    return episode_adv[episode] + cfg.step_weight * step_adv


@estimator("gae")
def gae(batch: AdvantageBatch, cfg: AdvantageConfig) -> None:
    """PPO with a critic: each trainer's critic sets per-token advantages
    (``kernel/train/critic.py``), so none are set here."""
    return None


ESTIMATORS: tuple[str, ...] = tuple(_REGISTRY)
"""The built-in estimators' names (``estimators()`` also has any registered since)."""


# ---------------------------------------------------------------------------------------------
# The entry point over samples.
# ---------------------------------------------------------------------------------------------


def _group_key(s: Sample, group_by: str) -> tuple:
    sub = s.metadata.get("advantage_group")
    prompt = (s.group_id,) if sub is None else (s.group_id, sub)
    if group_by == "prompt":
        return prompt
    if group_by == "prompt_agent":
        return (*prompt, s.agent)
    return (*prompt, s.agent, s.turn)


def _indices(keys: list) -> Tensor:
    """Contiguous ints 0..K-1 for hashable keys, in order of first appearance; (N,) long."""
    import torch

    ids: dict = {}
    return torch.tensor([ids.setdefault(k, len(ids)) for k in keys], dtype=torch.long)


def compute_advantages(samples: list[Sample], cfg: AdvantageConfig) -> dict[str, float]:
    """Set ``sample.advantage`` for every sample (None for excluded ones); return metrics.

    Metrics: ``adv/mean`` and ``adv/std`` (population) over the samples that got one (NaN when
    none did), ``adv/n_samples``, ``adv/n_excluded``, ``adv/n_groups`` and
    ``adv/n_degenerate_groups`` (groups whose advantages are all 0.0; for a batch-wide
    estimator, ``reinforce_pp``, the batch is the one group).
    """
    import torch

    cfg.validate()
    spec = get_estimator(cfg.estimator)
    valid: list[Sample] = []
    for s in samples:
        s.advantage = None
        if s.reward is None or not s.status.trainable:
            continue
        if not math.isfinite(s.reward):
            raise ValueError(f"sample {s.key}: reward must be finite, got {s.reward}")
        valid.append(s)

    metrics = {
        "adv/mean": math.nan,
        "adv/std": math.nan,
        "adv/n_samples": float(len(valid)),
        "adv/n_excluded": float(len(samples) - len(valid)),
        "adv/n_groups": 0.0,
        "adv/n_degenerate_groups": 0.0,
    }
    if not valid:
        return metrics

    rewards = torch.tensor([s.reward for s in valid], dtype=torch.float64)  # (N,)
    index = _indices([_group_key(s, cfg.group_by) for s in valid])  # (N,)
    adv = spec.fn(AdvantageBatch(tuple(valid), rewards, index), cfg)  # (N,)
    if adv is None:  # gae: each trainer's critic sets them per token
        return metrics
    if not isinstance(adv, torch.Tensor) or adv.shape != rewards.shape:
        got = tuple(adv.shape) if isinstance(adv, torch.Tensor) else type(adv).__name__
        raise ValueError(
            f"advantage estimator {spec.name!r} must return a tensor of shape "
            f"{tuple(rewards.shape)} (one advantage per sample), got {got}"
        )
    # the groups the metrics count: a batch-wide estimator's batch is the one group
    stats_index = torch.zeros_like(index) if spec.batch_wide else index

    for s, a in zip(valid, adv.tolist(), strict=True):
        s.advantage = a
    # a group is degenerate when every advantage in it is exactly 0
    largest = adv.new_zeros(int(stats_index.max()) + 1).scatter_reduce(
        0, stats_index, adv.abs(), "amax", include_self=False
    )  # (G,)
    degenerate = largest == 0
    metrics.update(
        {
            "adv/mean": adv.mean().item(),
            "adv/std": adv.std(correction=0).item(),
            "adv/n_groups": float(degenerate.numel()),
            "adv/n_degenerate_groups": float(degenerate.sum()),
        }
    )
    return metrics
