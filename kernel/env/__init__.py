"""Environments: the gym-like protocol a recipe drives, in-process or on a server (as MRLM hosts
its environments apart from training).

An environment plays one episode per instance: ``await env.reset(item)`` opens it on a data
row (its prompt, label and metadata) and returns the first ``Observation``; each ``await
env.step(action)`` takes the agent's text and returns the next one, with the reward of that
action (None: none yet), whether the episode is over, and ``info`` (JSON values the recipe may
log or score by); ``await env.close()`` frees what it holds. An action it cannot take (a step
after the end, an empty action) raises ``BadAction``; everything the agent may get wrong
inside an action (a wrong answer, code that fails) is an observation and a reward, not an error.

``kernel.env.spec.EnvSpec`` names one environment of a run (``TrainConfig.environments``): a
class or factory by dotted path (``spec.KNOWN`` gives the recipes' environments short names)
with its keyword ``args``, played in this process; or, with ``url``, the same environment
hosted by ``python -m kernel env serve`` (``kernel.env.server``), played over HTTP by
``kernel.env.client.RemoteEnvironment``.
One setting moves an environment out of the process; the recipe's code does not change.
Hooks reach them as ``ctx.envs[name]``: ``async with ctx.envs["math"].session() as env: ...``.

An environment that cannot be reached (a server down, a session it lost) raises
``EnvUnavailable``; the rollout then fails that episode (masked out of training, never trained
on) and the next episodes open new sessions, so a run recovers when the server returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from kernel.auth import API_KEY_ENV  # noqa: F401  (the key a client sends, by default)


@dataclass
class Observation:
    """What the environment shows the agent after a reset or an action."""

    text: str
    """The next message the agent reads (the opening prompt after a reset)."""
    reward: float | None = None
    """The reward of the action just taken (None after a reset, or when it has none)."""
    done: bool = False
    """The episode is over: no further step is accepted."""
    info: dict[str, Any] = field(default_factory=dict)
    """JSON values about the step (``correct``, ``tests_passed``, ...), for metrics and rewards."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Observation:
        reward = data.get("reward")
        return cls(
            text=str(data["text"]),
            reward=None if reward is None else float(reward),
            done=bool(data.get("done", False)),
            info=dict(data.get("info") or {}),
        )


class Environment(Protocol):
    """One episode of an environment (see the module docstring)."""

    async def reset(self, item: Mapping[str, Any]) -> Observation: ...

    async def step(self, action: str) -> Observation: ...

    async def close(self) -> None: ...


class BadAction(ValueError):
    """An action the environment cannot take in its state; the message says why."""


class EnvUnavailable(RuntimeError):
    """The environment cannot be reached or lost the episode: the episode fails (masked)."""
