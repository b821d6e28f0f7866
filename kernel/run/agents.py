"""Agents: who plays what (``AgentSpec``: which model, shared or its own, trained or frozen, with
which overrides), and the handles a recipe's generate hook calls.

``ctx.agents[name]`` is an ``AgentHandle``, the run's ``kernel.dialogue.Agent``: it samples from
the agent's engines (a router URL or embedded servers, round-robin across them) with the
agent's default sampling parameters, and builds token-exact dialogues with the agent's own
tokenizer (``kernel.conversation``). An engine that aborts a request (weight update in abort
mode, shutdown) raises ``EpisodeAborted``; the RolloutManager then requeues the whole prompt
group. The engines themselves are a model's ``kernel.engine.pool.EnginePool``. Recipes build
their episodes from ``kernel.dialogue.Dialogue`` over these handles.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from kernel.conversation import Conversation
from kernel.engine.batcher import RequestBatcher
from kernel.engine.pool import EnginePool
from kernel.rollout import EPISODE_TOKENS, EpisodeAborted
from kernel.train.settings import BACKENDS


def parse_version(version: str | None) -> int | None:
    """Engine weight versions are strings on the wire; the kernel counts them as ints."""
    try:
        return int(version) if version is not None else None
    except ValueError:
        return None


OVERRIDABLE = ("rollout", "optim", "loss", "trainer", "engine", "resources", "lora")
"""The sections an agent's spec overrides (a dict each: field -> value). Every field of them is
per agent (``rollout``, ``lora``) or per model (the rest, set on the agent that owns the model):
the run plan resolves it with the agent's or model's other settings and the run reads it from
there (tests/test_agent_overrides.py reads each back), except the fields below."""
PER_AGENT = ("rollout", "lora")
"""The sections an agent sharing a model sets for itself; the others are its model's, set on
the agent that owns the model."""
RUN_WIDE: dict[str, dict[str, str]] = {
    "rollout": {
        "concurrency": "it bounds the episodes in flight, and one episode plays every agent",
        "timeout_s": "it bounds one episode, every agent's turns in it together",
        "over_sample": "a step keeps or carries whole prompt groups, every agent's samples",
        "leftover": "a step keeps or carries whole prompt groups, every agent's samples",
    },
}
"""Per section, the fields only the run's own section sets (field -> why): an agent's spec
that sets one is refused at validation, naming ``agents[NAME].SECTION.FIELD``."""
REMOTE: dict[str, tuple[str, ...] | None] = {
    "rollout": None,  # every field not run-wide: the agent's sampling, done from this job
    "engine": ("request_timeout_s", "api_key", "batch_window_ms"),  # this job's client of them
}
"""What a remote agent's spec may set per section (None: every field); the job that plays it
trains, serves and places its model, so the rest belongs in that job's settings."""


@dataclass
class AgentSpec:
    """One agent of the run as configured: which model plays it, how it is served and trained.
    At run time the agent is an ``AgentHandle`` built from this spec, which recipes see as a
    ``kernel.dialogue.Agent``.

    Agents that share a model (``share_model_with``) share its trainer, engines and weight
    versions (Dr.MAS LLM sharing); the others each get their own (heterogeneous families
    allowed). In ``TrainConfig.agents`` a bare name is shorthand for a spec that shares the first
    agent's model, so ``agents: [solver, rewriter, selector]`` is one model playing three roles.
    """

    name: str
    """Name the recipe calls it by (ctx.agents[name]) and that tags its samples."""
    model: str | None = None
    """HF model path or name of this agent's own model (None: the run's --model)."""
    share_model_with: str | None = None
    """Another agent whose model, trainer and engines this agent uses (None: its own)."""
    tokenizer: str | None = None
    """Tokenizer path of this agent's model (None: the model's own)."""
    chat_template: str | None = None
    """Chat template (Jinja text, or a path to a .jinja file) that replaces the tokenizer's for
    this agent's dialogues (None: the tokenizer's own)."""
    trainable: bool = True
    """False freezes the agent: it is served and rolled out, never trained or synced."""
    update_every: int = 1
    """Train this agent's model every k steps (its samples in between are dropped)."""
    backend: str = "torch"
    """Training backend of this agent's model: torch or megatron."""
    rollout: dict[str, Any] = field(default_factory=dict)
    """Overrides of the run's rollout section for this agent, also on a shared model: its
    sampling (temperature, top_p) and lengths (max_response_len, max_context_len).
    concurrency, timeout_s, over_sample and leftover are run-wide (one episode plays every
    agent): refused here."""
    optim: dict[str, Any] = field(default_factory=dict)
    """Overrides of the run's optim section for this agent's model, every field (lr,
    weight_decay, betas, warm-up and decay, grad_clip, dtype): its trainer's."""
    loss: dict[str, Any] = field(default_factory=dict)
    """Overrides of the run's loss section for this agent's model, every field (clips, agg,
    kl_coef, TIS caps, ...): its trainer's."""
    trainer: dict[str, Any] = field(default_factory=dict)
    """Overrides of the run's trainer section for this agent's model, every field of its
    backend's settings (torch: max_tokens_per_microbatch, ppo_epochs, device, ...; megatron:
    tensor_parallel, pipeline_parallel, ...). The run's one critic (critic.scope run) follows
    the first trained model's."""
    engine: dict[str, Any] = field(default_factory=dict)
    """Overrides of the run's engine section for this agent's model, every field (urls,
    router_url, num_engines, device, ...): every model has its own engines. The LoRA fields
    add to what the model's adapters need (max_lora_rank at least their largest rank)."""
    resources: dict[str, Any] = field(default_factory=dict)
    """Placement of this agent's model on a cluster (GPUs for training and inference,
    colocation, parallel sizes), every field per model; see kernel.run.resources.ResourceConfig
    and `kernel launch`."""
    remote: bool = False
    """Played by another Tandem job (kernel.run.jobs; queue.url): this job runs no model for it,
    sends its turns to that job's engines and commits its samples for that job to train on."""
    lora: dict[str, Any] = field(default_factory=dict)
    """Overrides of the run's lora section (rank, alpha, dropout, target_modules, path), every
    field per agent. On the agent that owns a model, rank > 0 makes every trainable agent of
    that model train a LoRA adapter of its own over the frozen base; on an agent sharing a
    model, its own adapter's settings. With path, rank, alpha, dropout and target_modules are
    the folder's: a different value given beside it is refused."""

    def validate(self) -> AgentSpec:
        where = f"agents[{self.name!r}]"
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"agents: name must be letters, digits, - or _, got {self.name!r}")
        if self.update_every < 1:
            raise ValueError(f"{where}.update_every must be >= 1, got {self.update_every}")
        if self.backend not in BACKENDS:
            raise ValueError(f"{where}.backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.remote and (self.share_model_with or not self.trainable):
            raise ValueError(
                f"{where}.remote: the agent is trained (or frozen, with or without LoRA) by its "
                "own job; share_model_with and trainable belong in that job's settings"
            )
        self._check_overrides(where)
        return self

    def _check_overrides(self, where: str) -> None:
        """Refuse an override the run would not read for this agent: a run-wide field
        (``RUN_WIDE``), one of the model a remote agent's job runs (``REMOTE``), or one of the
        model an agent sharing it does not own (all but ``PER_AGENT``)."""
        for section, why in RUN_WIDE.items():
            for key in getattr(self, section):
                if key in why:
                    raise ValueError(
                        f"{where}.{section}.{key}: {section}.{key} is run-wide ({why[key]}): "
                        f"set the run's {section}.{key} instead"
                    )
        if self.remote:
            theirs = [k for k in ("update_every", "backend") if getattr(self, k) != _DEFAULTS[k]]
            for section in OVERRIDABLE:
                allowed = REMOTE.get(section, ())
                theirs += [
                    f"{section}.{k}"
                    for k in getattr(self, section)
                    if allowed is not None and k not in allowed
                ]
            if theirs:
                raise ValueError(
                    f"{', '.join(f'{where}.{k}' for k in theirs)}: the agent is remote (the job "
                    "that plays it trains, serves and places its model): set "
                    f"{'it' if len(theirs) == 1 else 'them'} in that job's settings"
                )
        if self.share_model_with is not None:
            # sampling and adapter settings are per agent even on a shared model (PER_AGENT); the
            # rest belong to the model
            own = [k for k in ("model", "tokenizer") if getattr(self, k)]
            own += [k for k in ("update_every", "backend") if getattr(self, k) != _DEFAULTS[k]]
            own += [
                f"{section}.{k}"
                for section in OVERRIDABLE
                if section not in PER_AGENT
                for k in getattr(self, section)
            ]
            if own:
                raise ValueError(
                    f"{', '.join(f'{where}.{k}' for k in own)}: {where} shares the model of "
                    f"{self.share_model_with!r}, so {'it' if len(own) == 1 else 'they'} must be "
                    f"set on {self.share_model_with!r}"
                )


_DEFAULTS = {"update_every": 1, "backend": "torch"}


def agent_specs(agents: list) -> list[AgentSpec]:
    """Normalise ``TrainConfig.agents`` (names, specs or dicts) and check the sharing graph."""
    if not agents:
        raise ValueError("agents is empty: name at least one agent")
    agents = [spec_from_dict(i, a) if isinstance(a, dict) else a for i, a in enumerate(agents)]
    first = agents[0] if isinstance(agents[0], str) else agents[0].name
    specs = [
        AgentSpec(a, share_model_with=None if a == first else first) if isinstance(a, str) else a
        for a in agents
    ]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"agents must have distinct names, got {names}")
    by_name = {s.name: s for s in specs}
    for s in specs:
        s.validate()
        other = by_name.get(s.share_model_with) if s.share_model_with else s
        if other is None:
            raise ValueError(
                f"agents[{s.name!r}].share_model_with names {s.share_model_with!r}, "
                f"which is not an agent of this run ({names})"
            )
        if other.remote and other is not s:
            raise ValueError(
                f"agents[{s.name!r}] shares the model of {other.name!r}, which another job plays "
                "(remote): a remote agent's model is that job's"
            )
        if other.share_model_with is not None:
            raise ValueError(
                f"agents[{s.name!r}] shares with {other.name!r}, which itself shares with "
                f"{other.share_model_with!r}: share with {other.share_model_with!r} directly"
            )
    return specs


SECTIONS = tuple(f.name for f in fields(AgentSpec) if str(f.type).startswith("dict"))
"""An AgentSpec's sections: the fields that hold settings by key (rollout, optim, ...)."""


def with_settings(agents: list, settings: list[str]) -> list:
    """``agents`` (``TrainConfig.agents``) with the CLI's ``--agent NAME.FIELD=VALUE`` settings
    applied, in order: ``alice.backend=megatron``, ``alice.resources.train_gpus=4``,
    ``alice.trainer={tensor_parallel: 2}``. VALUE is read as YAML (``4`` an int, ``true`` a
    bool, ``{...}`` a mapping); a dotted FIELD sets one key of a section, a whole section
    replaces it. A bare name becomes its spec first (sharing the first agent's model, as bare
    names do). The result is validated like any spec; a setting without ``=``, an agent the run
    does not have, or a FIELD that is not a section is refused naming the flag."""
    if not settings:
        return agents
    first = _name_of(agents[0])
    specs = [_as_dict(a, first) for a in agents]
    by_name = {d["name"]: d for d in specs}
    for item in settings:
        where = f"--agent {item}"
        path, eq, text = item.partition("=")
        name, dot, key = path.partition(".")
        if not eq or not dot or not key:
            raise ValueError(f"{where}: give NAME.FIELD=VALUE (e.g. alice.backend=megatron)")
        if name not in by_name:
            raise ValueError(f"{where}: no agent {name!r} in this run ({list(by_name)})")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"{where}: VALUE is not YAML ({e.problem})") from None
        *sections, last = key.split(".")
        if sections and sections[0] not in SECTIONS:
            raise ValueError(f"{where}: {sections[0]!r} is not a section (those are {SECTIONS})")
        target = by_name[name]
        for k in sections:
            target = target.setdefault(k, {})
            if not isinstance(target, dict):
                raise ValueError(f"{where}: agents[{name!r}].{k} is not a section")
        target[last] = value
    return specs


def _name_of(agent) -> str:
    """The name of one entry of ``TrainConfig.agents``: a bare name, a dict or a spec."""
    if isinstance(agent, str):
        return agent
    return agent["name"] if isinstance(agent, dict) else agent.name


def _as_dict(agent, first: str) -> dict[str, Any]:
    """One entry of ``TrainConfig.agents`` as a spec dict: a bare name as the spec it stands for
    (sharing ``first``'s model unless it is ``first``), a spec as its fields."""
    if isinstance(agent, str):
        return {"name": agent} | ({} if agent == first else {"share_model_with": first})
    if isinstance(agent, AgentSpec):
        return asdict(agent)
    return copy.deepcopy(agent)


def spec_from_dict(i: int, value: dict[str, Any]) -> AgentSpec:
    """Agent ``i`` given as a dict (as the CLI and YAML leave a spec that did not parse): an
    unknown key or an ill-typed value fails naming the agent and the key."""
    valid = [f.name for f in fields(AgentSpec)]
    unknown = [repr(k) for k in value if k not in valid]
    if unknown:
        raise ValueError(
            f"agents[{i}]: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"valid keys: {', '.join(valid)}"
        )
    try:
        return TypeAdapter(AgentSpec).validate_python(value)
    except ValidationError as e:
        errors = [f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()]
        raise ValueError(f"agents[{i}]: {'; '.join(errors)}") from None


def model_groups(specs: list[AgentSpec]) -> dict[str, list[AgentSpec]]:
    """Owner agent name -> the specs of every agent its model plays (owner first)."""
    groups: dict[str, list[AgentSpec]] = {}
    for s in specs:
        groups.setdefault(s.share_model_with or s.name, []).append(s)
    for owner, members in groups.items():
        members.sort(key=lambda s: s.name != owner)
    return groups


@dataclass
class AgentHandle:
    """What a recipe calls to make one agent speak: the run's ``kernel.dialogue.Agent``
    (``ctx.agents[name]``), built from the agent's ``AgentSpec`` and its model's engines.

    Calls are batched per model (``kernel.engine.batcher.RequestBatcher``): the episodes of a
    rollout that ask at the same time go to the engine as one request, the samples of one prompt
    as one prompt with ``n``. A recipe just awaits ``generate`` / ``generate_turn`` per episode;
    ``generate_group`` and ``generate_turns`` say the same in one call."""

    name: str
    clients: list  # EngineClient per engine (or one router)
    tokenizer: Any
    sampling: dict[str, Any]  # default sampling params (temperature, top_p, ...)
    max_response_len: int
    max_context_len: int
    pool: EnginePool | None = None  # set: a failed engine is taken out and the request retried
    batcher: Any = None  # RequestBatcher shared by the agents of one model (None: one of its own)
    lora_path: str | None = None  # the LoRA adapter the engines serve this agent with (None: base)

    def __post_init__(self) -> None:
        if not self.clients:
            raise ValueError(f"agent {self.name!r} has no engines")
        if self.batcher is None:
            self.batcher = RequestBatcher(self.clients, self.pool)

    async def generate(self, input_ids: list[int], sampling: dict[str, Any] | None = None):
        """Sample one continuation of ``input_ids``; raises EpisodeAborted if aborted, or if no
        engine could serve it (the prompt group is then rolled out again later)."""
        params = {"max_new_tokens": self.max_response_len, **self.sampling, **(sampling or {})}
        try:
            result = await self.batcher.submit(input_ids, params, lora_path=self.lora_path)
        except EpisodeAborted as e:
            raise EpisodeAborted(f"agent {self.name!r}: {e}") from e
        if (count := EPISODE_TOKENS.get()) is not None:  # a partial rollout's episode
            count[0] += len(result.output_ids)
        return result

    async def generate_group(
        self, input_ids: list[int], n: int, sampling: dict[str, Any] | None = None
    ) -> list:
        """``n`` samples of one prompt, as one request with ``sampling_params.n``."""
        return list(await asyncio.gather(*(self.generate(input_ids, sampling) for _ in range(n))))

    def conversation(self, system: str | None = None, **kwargs) -> Conversation:
        """A new token-exact dialogue in this agent's tokenizer and context budget."""
        return Conversation(self.tokenizer, self.max_context_len, system=system, **kwargs)

    async def generate_turn(
        self, conv: Conversation, sampling: dict[str, Any] | None = None, prefix: str = ""
    ):
        """Sample this agent's next turn into ``conv``, the turn starting with ``prefix`` (text
        it is given, not sampled: in its context, out of its loss); returns the engine result,
        or None when the context budget is exhausted (``conv.truncated`` is then set). A
        ``max_new_tokens`` in ``sampling`` caps the turn below its budget, never above."""
        forced = self.tokenizer(prefix, add_special_tokens=False)["input_ids"] if prefix else []
        sampling = dict(sampling or {})
        budget = conv.max_new_tokens_for_turn(self.max_response_len, len(forced))
        max_new = min(budget, sampling.pop("max_new_tokens", budget))
        if max_new <= 0:
            return None
        result = await self.generate(
            conv.assistant_prompt_ids(forced), {**sampling, "max_new_tokens": max_new}
        )
        version = parse_version(result.weight_version)
        conv.add_generation(result.output_ids, result.logprobs, version, prefix=forced)
        return result

    async def generate_turns(
        self, convs: list[Conversation], sampling: dict[str, Any] | None = None
    ) -> list:
        """This agent's next turn in each of several dialogues (a group's episodes, turn by
        turn), as one request; a result per dialogue (None where its budget is exhausted)."""
        return list(await asyncio.gather(*(self.generate_turn(c, sampling) for c in convs)))
