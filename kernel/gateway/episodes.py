"""An episode as the gateway records it: per agent, the token-exact dialogues its calls grew.

A program sends each call's whole message list, as OpenAI's API expects. The gateway keeps, per
(episode, agent), the dialogues ("threads") it has answered: each a ``kernel.dialogue.Dialogue``
(exact ids, loss mask, logprobs) and the messages as the client saw them, our replies included.
A call whose messages extend a thread's (the same messages, our replies echoed back, then new
ones) continues that thread: only the new messages are tokenized, and the earlier replies keep
the ids that were sampled. Any other call opens a new thread. Each thread the agent spoke in
becomes one training sample of the episode (its ``turn`` the thread's number).

Tools (``tools`` / ``tool_calls``) are written into the dialogue as Hermes-style text (the
format of Qwen2.5's template, which SGLang's and vLLM's ``hermes`` parsers read): the
definitions in the system message, a call as ``<tool_call>{"name", "arguments"}</tool_call>``
in the reply, so any chat template renders them.
"""

from __future__ import annotations

import copy
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from kernel.dialogue import Agent, Dialogue
from kernel.sample import Sample
from kernel.tags import find_tags

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


class BadRequest(ValueError):
    """A request the gateway cannot serve; ``param`` names the field (OpenAI's error shape)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


def text_of(content: Any, where: str) -> str:
    """A message's content as text: a string, or a list of text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for i, part in enumerate(content):
        if part.get("type") != "text":
            raise BadRequest(f"{where}.content[{i}]: only text parts are supported", where)
        parts.append(part["text"])
    return "".join(parts)


def _arguments(text: Any) -> Any:
    """Tool-call arguments compared by value: a JSON string parsed when it parses."""
    if isinstance(text, str):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A message's tool calls as ``{"name", "arguments"}``, the arguments by value."""
    return [
        {"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])}
        for c in message.get("tool_calls") or ()
    ]


def canonical(message: dict[str, Any], where: str) -> tuple:
    """What identifies a message when a client echoes it back (content, tool calls by name and
    argument values; their ids and formatting aside)."""
    calls = tuple(json.dumps(call, sort_keys=True) for call in _calls(message))
    return (message["role"], text_of(message.get("content"), where), calls)


def rendered(message: dict[str, Any], where: str) -> tuple[str, str]:
    """(role, text) a message enters a dialogue as: tool calls as Hermes text, a developer
    message as a system one."""
    role = "system" if message["role"] == "developer" else message["role"]
    text = text_of(message.get("content"), where)
    for call in _calls(message):
        text += f"{chr(10) if text else ''}<tool_call>\n{json.dumps(call)}\n</tool_call>"
    return role, text


def with_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list:
    """The messages with the tool definitions written into the system message (one is added
    first when there is none)."""
    if not tools:
        return list(messages)
    listing = "\n".join(json.dumps(t, sort_keys=True) for t in tools)
    block = TOOLS_HEADER + listing + TOOLS_FOOTER
    if messages and messages[0]["role"] in ("system", "developer"):
        first = dict(messages[0])
        first["content"] = text_of(first.get("content"), "messages[0]") + "\n\n" + block
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def parse_tool_calls(text: str, episode: str, n: int) -> tuple[str | None, list[dict]]:
    """(content outside the calls or None, the calls in OpenAI's shape) of a reply; a block
    that is not a JSON object with a name stays in the content."""
    calls, kept, last = [], [], 0
    for i, m in enumerate(find_tags(text, ["tool_call"])):
        try:
            body = json.loads(m.inner.strip())
            name, args = body["name"], body.get("arguments", {})
            if not isinstance(name, str):
                raise TypeError
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        kept.append(text[last : m.start])
        last = m.end
        arguments = args if isinstance(args, str) else json.dumps(args)
        calls.append(
            {
                "id": f"call_{episode}_{n}_{i}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    if not calls:
        return text, []
    content = ("".join(kept) + text[last:]).strip()
    return content or None, calls


@dataclass
class Thread:
    """One dialogue of an agent in an episode: its Dialogue and the messages the client saw."""

    dialogue: Dialogue
    seen: list[tuple] = field(default_factory=list)  # canonical messages, our replies included
    busy: bool = False  # a call is generating in it: a concurrent call opens another

    def fork(self) -> Thread:
        dialogue = copy.copy(self.dialogue)
        dialogue.conv = self.dialogue.conv.fork()
        return Thread(dialogue, list(self.seen))


@dataclass
class Episode:
    """One run of the program: its agents' threads, its rewards, and how it ended."""

    id: str
    agents: dict[str, Agent]
    seed: Sample | None = None  # the data row's sample the episode rolls out
    per_call: bool = False  # credit "call": each call's turn a sample of its own, when it ends
    threads: dict[str, list[Thread]] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)  # agent -> reward ("*": every agent)
    turns: list[tuple[str, Sample]] = field(default_factory=list)  # per call: (its id, sample)
    call_rewards: dict[str, float] = field(default_factory=dict)  # completion id -> reward
    aborted: str | None = None  # an engine aborted a call: the group is rolled out again
    closed: bool = False  # ended (or timed out): later calls get 404
    calls: int = 0
    pending: int = 0  # calls generating now
    ignored: int = 0  # calls whose own temperature or top_p was not used

    @staticmethod
    def new(agents: dict[str, Agent], seed: Sample | None, per_call: bool) -> Episode:
        return Episode(uuid.uuid4().hex[:16], agents, seed, per_call)

    def record_turn(self, completion_id: str, agent: str, thread: Thread) -> None:
        """Credit per call: the turn the call just sampled, as a sample that trains only it
        (its thread before it is context), numbered among the agent's turns."""
        if not self.per_call or self.seed is None:
            return
        turn = sum(s.agent == agent for _, s in self.turns)
        sample = thread.dialogue.sample(self.seed, turn=turn, last_turn_only=True)
        self.turns.append((completion_id, sample))

    def thread_for(self, agent: str, messages: list[dict[str, Any]]) -> tuple[Thread, int]:
        """The thread these messages continue (its messages a prefix of them, not generating
        now), or a new one; and how many of the messages are new to it."""
        wanted = [canonical(m, f"messages[{i}]") for i, m in enumerate(messages)]
        threads = self.threads.setdefault(agent, [])
        for t in reversed(threads):
            if t.busy or t.dialogue.conv.truncated or len(t.seen) >= len(wanted):
                continue
            if wanted[: len(t.seen)] == t.seen:
                return t, len(t.seen)
        thread = Thread(Dialogue(self.agents[agent]))
        threads.append(thread)
        return thread, 0

    def samples(self) -> list[Sample]:
        """Every thread an agent spoke in, as one sample (``turn``: its number among the
        agent's threads), or with credit per call every call's turn; its reward in
        ``metadata["gateway_reward"]``: the call's posted one, else its agent's, else the
        episode's (None: none, not trained)."""

        def reward(agent: str) -> float | None:
            return self.rewards.get(agent, self.rewards.get("*"))

        out = []
        for completion_id, s in self.turns:  # credit per call
            given = self.call_rewards.get(completion_id, reward(s.agent))
            s.metadata.update(gateway_reward=given, episode=self.id, call=completion_id)
            out.append(s)
        for agent, threads in ({} if self.per_call else self.threads).items():
            spoken = [t for t in threads if t.dialogue.finish is not None]
            for k, t in enumerate(spoken):
                out.append(
                    t.dialogue.sample(
                        self.seed, turn=k, gateway_reward=reward(agent), episode=self.id
                    )
                )
        if out:  # the episode's own figures, logged as episode/<key>
            threads = sum(len(t) for t in self.threads.values())
            figures = {"calls": self.calls, "threads": threads, "ignored_sampling": self.ignored}
            out[0].metadata["metrics"] = {k: float(v) for k, v in figures.items()}
        return out
