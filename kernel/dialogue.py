"""What a recipe's generate hook holds: the ``Agent`` it calls (``ctx.agents[name]``) and a
``Dialogue``, one agent's side of an episode, that recipes build their episodes from.

This is the recipe API, kept in the core layer: it imports no engine, trainer or torch, so a
recipe's generate module loads (and its episode logic can be read and tested) without the
training stack. The run hands each hook ``kernel.run.agents.AgentHandle`` objects, which sample from
the agent's engines; anything with the same methods (a scripted agent in a test) will do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kernel.conversation import Conversation
from kernel.sample import Sample, Status


class Reply(Protocol):
    """One sampled continuation, as an engine returns it."""

    output_ids: list[int]
    logprobs: list[float]
    weight_version: str | None

    @property
    def finish_type(self) -> str:
        """How it ended: "stop", "length" or "abort"."""
        ...


class Agent(Protocol):
    """One agent of a run, as a recipe calls it (``ctx.agents[name]``): the run hands it an
    ``AgentHandle`` (configured by an ``AgentSpec``), a test any object with these methods.
    Calls that arrive together are batched per model; a failed or aborted request raises
    ``kernel.rollout.EpisodeAborted`` (the rollout then samples the whole prompt group again
    later)."""

    name: str
    tokenizer: Any  # the agent's own HF tokenizer

    def conversation(self, system: str | None = None, **kwargs) -> Conversation:
        """A new token-exact dialogue in this agent's tokenizer and context budget."""
        ...

    async def generate(self, input_ids: list[int], sampling: dict[str, Any] | None = None) -> Reply:
        """One continuation of ``input_ids`` with the agent's sampling defaults, overridden by
        ``sampling`` (SGLang's sampling_params)."""
        ...

    async def generate_group(
        self, input_ids: list[int], n: int, sampling: dict[str, Any] | None = None
    ) -> list[Reply]:
        """``n`` continuations of one prompt."""
        ...

    async def generate_turn(
        self, conv: Conversation, sampling: dict[str, Any] | None = None, prefix: str = ""
    ) -> Reply | None:
        """The agent's next turn sampled into ``conv``, starting with ``prefix`` (given, not
        sampled: in its context, out of its loss); None when the context budget is spent
        (``conv.truncated`` is then set)."""
        ...

    async def generate_turns(
        self, convs: Sequence[Conversation], sampling: dict[str, Any] | None = None
    ) -> list[Reply | None]:
        """The next turn in each of several dialogues, as one request."""
        ...


class Dialogue:
    """One agent's side of an episode, the chat turn recipes are made of: its token-exact
    conversation (``conv``), the text of its last turn and how that turn ended.

    ``Dialogue(agent, system, first)`` opens it with an optional system prompt and first user
    message (``fits`` is False when that message does not fit the context budget).
    ``await d.speak()`` samples the agent's next turn (None once its context budget is spent);
    ``d.say(role, text)`` adds the other party's words or a tool's response (loss mask 0; False
    when it does not fit); ``d.sample(seed, turn, **metadata)`` is its training sample, with the
    kernel's one status rule (``Status.of_turn``), or None if it never spoke. Per-turn credit:
    ``d.sample(seed, turn, last_turn_only=True)`` right after a turn is a sample that trains
    only that turn, in its whole context, so each turn can carry its own reward (and, with
    ``advantage.group_by: prompt_agent_turn``, its own baseline).
    """

    def __init__(self, agent: Agent, system: str | None = None, first: str | None = None):
        self.agent, self.name = agent, agent.name
        self.conv = agent.conversation(system=system)
        self.fits = first is None or self.conv.add_message("user", first)  # the opening fit
        self.text = ""  # its last turn, decoded
        self.finish: str | None = None  # how its last turn ended; None until it has spoken
        self.turns = 0
        self.turn_start = 0  # where its last turn starts in ``conv.ids``
        self.reply: Reply | None = None  # the engine's reply of its last turn (ids, logprobs)

    async def speak(self, sampling: dict[str, Any] | None = None, prefix: str = "") -> str | None:
        """The agent's next turn as text, starting with ``prefix`` (given, not sampled: see
        ``Agent.generate_turn``); None when its context budget is spent."""
        start = len(self.conv.ids)
        result = await self.agent.generate_turn(self.conv, sampling, prefix)
        if result is None:
            return None
        self.turn_start, self.reply = start, result
        self.finish, self.turns = result.finish_type, self.turns + 1
        decoded = self.agent.tokenizer.decode(result.output_ids, skip_special_tokens=True)
        self.text = prefix + decoded
        return self.text

    def say(self, role: str, text: str) -> bool:
        """Someone else's words in this dialogue (not trained on); False when they do not fit
        (the dialogue is then truncated)."""
        return self.conv.add_message(role, text)

    def sample(
        self,
        seed: Sample,
        turn: int = 0,
        last_turn_only: bool = False,
        reward_only: bool = False,
        **metadata,
    ) -> Sample | None:
        """Its training sample (metadata: the seed's, ``role``, ``text`` of its last turn and
        ``metadata``), or None when it never spoke: nothing to train on. Two samples of one
        agent in one episode need distinct ``turn`` numbers. ``last_turn_only``: only its
        latest turn is trained (the turns before are context). ``reward_only``: when it never
        spoke, a sample without response tokens instead of None (its context so far as the
        prompt, ``text`` ""): it trains no token, but the reward hook pays it, it counts in its
        agent's metrics and stays in its advantage group, so the baseline of the episodes in
        which the agent spoke includes those in which it did not."""
        fields = seed.seed_fields()
        fields["metadata"].update(role=self.name, text=self.text, **metadata)
        if self.finish is None:
            if not reward_only:
                return None
            if not self.conv.ids:
                raise ValueError(
                    f"{self.name}: a reward-only sample needs the dialogue's opening (a system "
                    "prompt or first message) as its prompt"
                )
            return Sample(
                prompt_ids=list(self.conv.ids),
                response_ids=[],
                loss_mask=[],
                rollout_logprobs=[],
                agent=self.name,
                turn=turn,
                status=Status.COMPLETED,
                **fields,
            ).validate()
        status = Status.of_turn(self.finish)
        train_from = self.turn_start if last_turn_only else 0
        return self.conv.to_sample(
            train_from=train_from, agent=self.name, turn=turn, status=status, **fields
        )
