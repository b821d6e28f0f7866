"""Sample and Status: the one record that flows from the data buffer through rollout, reward,
advantages and training.

A Sample is one agent's contribution to one episode: the exact prompt token ids, the exact
sampled response ids (never re-tokenized), a loss mask over the response (1 on the agent's own
sampled tokens, 0 on template, tool and partner tokens), and the logprobs the engine reported
when it sampled them. Recipe-specific data goes in ``metadata``; a field joins the dataclass
only when the kernel itself reads it. All invariants are checked in ``Sample.validate``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):
    """Where a sample stands. Only COMPLETED and TRUNCATED samples are trained on."""

    PENDING = "pending"  # made by the buffer, not yet rolled out
    COMPLETED = "completed"  # the episode ended normally (stop token, final answer)
    TRUNCATED = "truncated"  # hit max_response_len or max_context_len; still trainable
    ABORTED = "aborted"  # the engine aborted it (weight update, shutdown); goes back to the buffer
    FAILED = "failed"  # the generate hook raised or timed out; masked out of the loss

    @property
    def trainable(self) -> bool:
        return self in (Status.COMPLETED, Status.TRUNCATED)

    @classmethod
    def of_turn(cls, finish_type: str | None) -> Status:
        """The status of a sample whose last turn ended so (the engine's finish reason): a
        stop token or string completes it, anything else (``length``) truncates it. Aborted
        turns never get here: they raise EpisodeAborted and the group is rolled out again."""
        return cls.COMPLETED if finish_type == "stop" else cls.TRUNCATED


class SampleError(ValueError):
    """A sample broke one of its invariants; the message names the sample and the field."""


@dataclass
class Sample:
    """One agent's tokens of one episode, with everything training needs."""

    prompt: Any = None  # the raw prompt as read from the data (str or chat messages)
    label: Any = None  # the ground truth for the reward, if the data has one
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # len == response_length
    rollout_logprobs: list[float] | None = None  # len == response_length when present
    agent: str = "default"
    group_id: int = 0  # one prompt group: every sample rolled out from the same data row
    index: int = 0  # the episode's index within its group (0..n-1)
    turn: int = 0  # the agent's turn within the episode, for per-turn advantage grouping
    status: Status = Status.PENDING
    raw_reward: float | None = None  # what the recipe's reward function returned
    reward: float | None = None  # after the kernel's weighting; what advantages are computed from
    advantage: float | list[float] | None = None  # list: per response token (gae)
    weight_versions: list[int] = field(default_factory=list)  # engine version per generation call
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def response_length(self) -> int:
        return len(self.response_ids)

    @property
    def key(self) -> str:
        """Unique within a run: prompt group, episode, agent and turn."""
        return f"g{self.group_id}/e{self.index}/{self.agent}/t{self.turn}"

    def seed_fields(self) -> dict[str, Any]:
        """What an episode's samples inherit from the buffer's seed sample: prompt, label,
        prompt group, episode index and a copy of the metadata (for ``Conversation.to_sample``
        or ``Sample(**...)``)."""
        return {
            "prompt": self.prompt,
            "label": self.label,
            "group_id": self.group_id,
            "index": self.index,
            "metadata": dict(self.metadata),
        }

    def state(self) -> dict[str, Any]:
        """Its fields as JSON-ready values (metadata values JSON cannot hold become text), as a
        checkpoint or a queue between jobs keeps it (``from_state`` reads it back)."""
        return json.loads(
            json.dumps({**dataclasses.asdict(self), "status": self.status.value}, default=str)
        )

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Sample:
        return cls(**{**state, "status": Status(state["status"])})

    def validate(self) -> Sample:
        """Check every invariant in one place; raise SampleError naming the sample and field."""

        def fail(msg: str) -> None:
            raise SampleError(f"sample {self.key}: {msg}")

        if not isinstance(self.status, Status):
            fail(f"status must be a Status, got {self.status!r}")
        if len(self.loss_mask) != self.response_length:
            fail(f"len(loss_mask)={len(self.loss_mask)} != response_length={self.response_length}")
        if any(m not in (0, 1) for m in self.loss_mask):
            fail("loss_mask must hold only 0 and 1")
        if self.rollout_logprobs is not None and len(self.rollout_logprobs) != self.response_length:
            fail(
                f"len(rollout_logprobs)={len(self.rollout_logprobs)} "
                f"!= response_length={self.response_length}"
            )
        if self.status.trainable and not self.prompt_ids:
            fail("a trainable sample needs prompt_ids")
        for name in ("prompt_ids", "response_ids"):
            ids = getattr(self, name)
            if any((not isinstance(t, int)) or t < 0 for t in ids):
                fail(f"{name} must be non-negative ints")
        if self.index < 0 or self.turn < 0:
            fail("index and turn must be >= 0")
        return self
