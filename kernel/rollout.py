"""RolloutManager: turns prompt groups into rewarded samples, concurrently and safely.

For every episode seed (a PENDING sample from the DataBuffer) it awaits the recipe's
``generate(ctx, sample)`` under a concurrency bound and a per-episode timeout, then the
recipe's ``reward(ctx, samples)``, then the kernel's reward weighting. What can go wrong is
contained to the episode:

- the hook raises or times out -> the episode becomes one FAILED sample (masked out of the
  loss, counted in the metrics); the step goes on;
- an engine aborts a request (weight update, shutdown) -> ``EpisodeAborted`` (or ABORTED
  samples) and the episode's WHOLE prompt group is returned for requeueing, so no prompt is
  lost or rolled out twice into the same step;
- the reward hook raises -> the episode's samples get no reward (None: not trained on) and are
  counted.

Joint actions (``reward.joint_mode``, CoMLRL's): ``align`` scores each episode on its own.
``cross`` is for agents that each answer once, in parallel (each episode has exactly one
sample per agent, all trainable): when the group's episodes are in, every combination of one
sample per agent (K^N for K episodes and N agents) is handed to the reward hook as a joint
action, and each sample's raw reward is the sum of what it got over the K^(N-1) joint actions
it takes part in (CoMLRL 1.4.3 sums, it does not average). The combinations are scored a
bounded number at a time on copies (only the diagonal, episode k with itself, sees the
originals, so their metadata is the episode's own), and nothing but the K x N samples is kept:
no sample is added to the batch. Per-agent baselines (grpo or dr_grpo, ``group_by:
prompt_agent``) then give CoMLRL's cross-mode advantages.

Dynamic sampling (DAPO) is a group filter: with ``drop_constant_groups`` a group whose
trainable samples all have the same reward (per agent) carries no signal and is dropped; the
loop refills from the buffer.

Partial rollouts (``rollout.over_sample``): ``start`` rolls one group out on its own, as a
``Flight`` the runtime waits for, carries into the next step or cancels; what its episodes
have generated so far is counted in ``Flight.tokens`` (through ``EPISODE_TOKENS``), so a
cancelled group's cost is known.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import dataclasses
import itertools
import logging
import time
from dataclasses import dataclass, field

from kernel.hooks import GenerateFn, RewardFn, RolloutContext, call_reward
from kernel.rewards import RewardConfig, apply_weighting, assign_rewards
from kernel.sample import Sample, Status

log = logging.getLogger(__name__)


EPISODE_TOKENS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "episode_tokens", default=None
)
"""In a ``Flight``'s episodes: a one-element list, the tokens its engine replies have held so far
(``AgentHandle.generate`` adds to it); None elsewhere."""


class EpisodeAborted(Exception):
    """An engine aborted a request of this episode; its prompt group must be rolled out again.

    Raised by ``AgentHandle.generate``; a recipe may also raise it, or return ABORTED samples.
    """


@dataclass
class GroupResult:
    """What became of one prompt group."""

    group: list[Sample]  # the PENDING seeds, as handed out by the buffer
    samples: list[Sample] = field(default_factory=list)  # every agent's samples, all episodes
    aborted: bool = False  # an episode was aborted: requeue the group, use none of it

    def constant_reward(self) -> bool:
        """True if, for every agent, all trainable samples share one reward (no signal)."""
        by_agent: dict[str, set[float]] = {}
        for s in self.samples:
            if s.status.trainable and s.reward is not None:
                by_agent.setdefault(s.agent, set()).add(s.reward)
        return all(len(v) <= 1 for v in by_agent.values())


@dataclass
class RolloutStats:
    """Counters of one rollout phase."""

    episodes: int = 0
    failed: int = 0
    timed_out: int = 0
    aborted_groups: int = 0
    reward_errors: int = 0
    dropped_groups: int = 0
    seconds: float = 0.0
    reward_seconds: float = 0.0  # summed over episodes (reward hooks and weighting)

    def add(self, other: RolloutStats) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_metrics(self) -> dict[str, float]:
        return {f"rollout/{k}": float(v) for k, v in dataclasses.asdict(self).items()}


@dataclass
class Flight:
    """One prompt group rolling out on its own (``RolloutManager.start``): awaiting ``task``
    gives its ``GroupResult`` and ``RolloutStats``."""

    group: list[Sample]  # the PENDING seeds, as handed out by the buffer
    step: int  # the step that started it
    task: asyncio.Future
    tokens: list[int]  # [tokens its episodes' engine replies held so far]

    async def cancel(self) -> int:
        """Stop it (its episodes' requests end at their current turn); the tokens it had
        generated, now discarded."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        return self.tokens[0]


def _copy(s: Sample) -> Sample:
    """A sample for one joint action with its own copy of the metadata, so the reward hook's
    writes stay off the original."""
    return dataclasses.replace(s, metadata=copy.deepcopy(s.metadata))


class RolloutManager:
    """Runs episodes through the recipe's hooks with bounded concurrency and timeouts."""

    def __init__(
        self,
        generate: GenerateFn,
        reward: RewardFn,
        reward_cfg: RewardConfig,
        concurrency: int,
        timeout_s: float,
    ) -> None:
        self.generate = generate
        self.reward = reward
        self.reward_cfg = reward_cfg
        self.timeout_s = timeout_s
        self._semaphore = asyncio.Semaphore(concurrency)

    @property
    def cross(self) -> bool:
        return self.reward_cfg.joint_mode == "cross"

    async def _episode(self, ctx: RolloutContext, seed: Sample, stats: RolloutStats):
        async with self._semaphore:
            stats.episodes += 1
            try:
                samples = await asyncio.wait_for(self.generate(ctx, seed), self.timeout_s)
                # None: an agent that never spoke (Dialogue.sample()), nothing to train on
                samples = [s for s in samples if s is not None]
                if not samples:
                    raise ValueError("generate returned no samples")
                for s in samples:
                    s.validate()
                if len({s.key for s in samples}) < len(samples):
                    raise ValueError(
                        f"two samples share agent and turn ({[s.key for s in samples]}): give "
                        "each of an agent's samples in an episode its own turn "
                        "(Dialogue.sample(seed, turn))"
                    )
            except EpisodeAborted as e:
                return [
                    dataclasses.replace(
                        seed, status=Status.ABORTED, metadata={**seed.metadata, "error": str(e)}
                    )
                ]
            except TimeoutError:
                stats.timed_out += 1
                return [
                    dataclasses.replace(
                        seed,
                        status=Status.FAILED,
                        metadata={**seed.metadata, "error": f"timed out after {self.timeout_s}s"},
                    )
                ]
            except Exception as e:  # a recipe bug or engine error must not crash the step
                stats.failed += 1
                log.warning("episode %s failed: %r", seed.key, e)
                return [
                    dataclasses.replace(
                        seed, status=Status.FAILED, metadata={**seed.metadata, "error": repr(e)}
                    )
                ]
            if any(s.status is Status.ABORTED for s in samples) or self.cross:
                return samples  # cross: the group's joint actions are scored in _group
            t0 = time.perf_counter()
            try:
                assign_rewards(samples, await call_reward(self.reward, ctx, samples))
                correct = samples[0].metadata.get("correct")
                apply_weighting(samples, self.reward_cfg, correct)
            except Exception as e:
                stats.reward_errors += 1
                log.warning("reward of episode %s failed: %r", seed.key, e)
                for s in samples:
                    s.raw_reward = s.reward = None
                    s.metadata["reward_error"] = repr(e)
            stats.reward_seconds += time.perf_counter() - t0
            return samples

    async def _group(self, ctx: RolloutContext, group: list[Sample], stats) -> GroupResult:
        episodes = await asyncio.gather(*(self._episode(ctx, seed, stats) for seed in group))
        result = GroupResult(group=group, samples=[s for ep in episodes for s in ep])
        result.aborted = any(s.status is Status.ABORTED for s in result.samples)
        if self.cross and not result.aborted:
            t0 = time.perf_counter()
            await self._cross(ctx, episodes, stats)
            stats.reward_seconds += time.perf_counter() - t0
        return result

    async def _cross(self, ctx: RolloutContext, episodes: list[list[Sample]], stats) -> None:
        """joint_mode cross (module docstring): score every combination of one sample per
        agent, and give each sample the sum of its rewards."""
        scored = [ep for ep in episodes if all(s.status.trainable for s in ep)]
        if not scored:
            return
        agents = [s.agent for s in scored[0]]
        for ep in scored:
            if [s.agent for s in ep] != agents:
                raise ValueError(
                    f"reward.joint_mode cross needs one sample per agent in every episode, in "
                    f"one order ({agents}); episode {ep[0].key} has {[s.agent for s in ep]}"
                )
        totals: dict[tuple[int, int], float | None] = {}  # (episode, agent) -> summed reward
        bound = asyncio.Semaphore(max(1, len(scored)))

        async def joint(combo: tuple[int, ...]) -> None:
            diagonal = len(set(combo)) == 1
            async with bound:  # at most K joint actions' copies exist at once
                members = [
                    scored[k][a] if diagonal else _copy(scored[k][a]) for a, k in enumerate(combo)
                ]
                try:
                    values = await call_reward(self.reward, ctx, members)
                    assign_rewards(members, values)
                except Exception as e:
                    stats.reward_errors += 1
                    log.warning("reward of joint action %s failed: %r", combo, e)
                    for a, k in enumerate(combo):
                        totals[k, a] = None
                    return
            for a, (k, m) in enumerate(zip(combo, members, strict=True)):
                if totals.get((k, a), 0.0) is None or m.raw_reward is None:
                    totals[k, a] = None
                else:
                    totals[k, a] = totals.get((k, a), 0.0) + m.raw_reward

        combos = itertools.product(range(len(scored)), repeat=len(agents))
        await asyncio.gather(*(joint(c) for c in combos))
        for k, ep in enumerate(scored):
            for a, s in enumerate(ep):
                s.raw_reward = totals.get((k, a))
            try:
                apply_weighting(ep, self.reward_cfg, ep[0].metadata.get("correct"))
            except ValueError as e:  # e.g. asymmetric weighting of an episode with no outcome
                stats.reward_errors += 1
                log.warning("reward weighting of episode %s failed: %r", ep[0].key, e)
                for s in ep:
                    s.raw_reward = s.reward = None

    def start(self, ctx: RolloutContext, group: list[Sample], step: int) -> Flight:
        """Roll ``group`` out in a task of its own (partial rollouts); ``step``: the step it
        starts in. Its stats count its episodes, failures and reward time (not ``seconds``)."""
        tokens = [0]

        async def fly() -> tuple[GroupResult, RolloutStats]:
            EPISODE_TOKENS.set(tokens)  # this task's context, which its episodes copy
            stats = RolloutStats()
            return await self._group(ctx, group, stats), stats

        return Flight(group, step, asyncio.ensure_future(fly()), tokens)

    async def run(
        self, ctx: RolloutContext, groups: list[list[Sample]], drop_constant_groups: bool = False
    ) -> tuple[list[GroupResult], list[GroupResult], RolloutStats]:
        """Roll out ``groups``; returns (kept groups, aborted groups to requeue, stats).

        With ``drop_constant_groups`` groups without reward variance are left out of the kept
        list (counted in ``stats.dropped_groups``); the caller refills.
        """
        stats = RolloutStats()
        t0 = time.perf_counter()
        results = await asyncio.gather(*(self._group(ctx, g, stats) for g in groups))
        stats.seconds = time.perf_counter() - t0
        aborted = [r for r in results if r.aborted]
        kept = [r for r in results if not r.aborted]
        stats.aborted_groups = len(aborted)
        if drop_constant_groups:
            before = len(kept)
            kept = [r for r in kept if not r.constant_reward()]
            stats.dropped_groups = before - len(kept)
        return kept, aborted, stats
