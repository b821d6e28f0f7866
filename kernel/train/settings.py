"""The trainer's settings, apart from the code that trains: ``TorchTrainerConfig`` and
``MegatronTrainerConfig`` (the two backends), ``LoraConfig``, ``CriticConfig``, ``RayConfig``,
the backends' names and ``backend_config``, the one place a backend's settings are chosen.
Importing them imports neither torch nor a backend, so a command that only reads or checks a
config (``kernel train --help``, ``kernel config``) does not wait for torch to load (as
kernel/engine/settings.py keeps fastapi out of what configures a server).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BACKENDS = ("torch", "megatron")
CRITIC_BACKEND_ERROR = (
    "advantage.estimator gae trains a critic, which only the torch backend has; give the "
    "trained agents backend torch, or pick a critic-free estimator for megatron"
)


def backend_config(backend: str, base: TorchTrainerConfig) -> Any:
    """The trainer settings of ``backend``: the run's trainer section, or the Megatron one with
    the fields both share (micro-batch budget, mini-batches, epochs) taken from it."""
    if backend == "torch":
        return base
    if backend == "megatron":
        return MegatronTrainerConfig(
            max_tokens_per_microbatch=base.max_tokens_per_microbatch,
            num_minibatches=base.num_minibatches,
            ppo_epochs=base.ppo_epochs,
        )
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


@dataclass
class TorchTrainerConfig:
    """Torch training backend: micro-batching, packing, memory and device (the optimiser is
    set by OptimConfig, the loss by LossConfig, the temperature by the agent's rollout)."""

    max_tokens_per_microbatch: int = 8192
    """Token budget of one micro-batch (rows x padded length, or one packed row); sets how many
    samples run together. A longer sequence runs alone."""
    share_prompts: bool = True
    """Samples with equal prompt ids (the n samples of a prompt group) run the prompt once per
    micro-batch: its KV cache, computed with gradients, is continued by each sample's response.
    The same loss and gradient as running each sample whole, with n - 1 fewer copies of every
    prompt. Needs a full-attention KV cache and one rank (under FSDP every rank must run the
    same forwards); off with pack_sequences or gradient_checkpointing (HF drops the cache
    there). Where it is off, samples run whole."""
    pack_sequences: bool = False
    """Pack sequences into one row (position ids restart per sequence, no cross-attention)
    instead of right-padding rows of similar length. No padding at all, but only varlen kernels
    (attn_implementation=flash_attention_2) skip the masked-out attention blocks; sdpa and eager
    compute attention over the whole row."""
    num_minibatches: int = 1
    """Optimizer updates per epoch over a step's batch: the batch is shuffled (with ``seed``)
    and split into this many mini-batches, one update each. More than one update per batch
    (this or ppo_epochs > 1) makes the PPO ratio move off 1, so the clip can bind."""
    ppo_epochs: int = 1
    """Passes over a step's batch (each num_minibatches updates, reshuffled). The old
    logprobs of the ratio are taken once, before the first update (loss.old_logprobs)."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass: less memory, more compute."""
    device: str = "auto"
    """cpu, cuda, cuda:N, or auto (this rank's GPU when there is one, else cpu)."""
    attn_implementation: str | None = None
    """Attention kernel (sdpa, eager, flash_attention_2, ...); None keeps transformers' default."""

    def validate(self) -> TorchTrainerConfig:
        """Raise ValueError naming the first field with a bad value."""
        if self.max_tokens_per_microbatch < 1:
            raise ValueError(
                f"max_tokens_per_microbatch must be >= 1, got {self.max_tokens_per_microbatch}"
            )
        if self.num_minibatches < 1 or self.ppo_epochs < 1:
            raise ValueError(
                f"num_minibatches and ppo_epochs must be >= 1, got {self.num_minibatches} and "
                f"{self.ppo_epochs}"
            )
        if self.device != "auto" and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        return self


OPTIMIZERS = ("torch", "megatron", "distributed")
"""Megatron backend optimizers (MegatronTrainerConfig.optimizer)."""


@dataclass
class MegatronTrainerConfig:
    """Megatron training backend: model layout and micro-batching (the optimiser is set by
    OptimConfig, the loss by LossConfig, the temperature by the agent's rollout)."""

    tensor_parallel: int = 1
    """Tensor-parallel size (must divide the key/value heads and the ffn size)."""
    pipeline_parallel: int = 1
    """Pipeline-parallel size (must divide the number of layers). The data-parallel size is
    what is left: world size / (tensor_parallel x pipeline_parallel)."""
    max_tokens_per_microbatch: int = 8192
    """Token budget of one micro-batch of right-padded rows (rows x padded length)."""
    num_minibatches: int = 1
    """Optimizer updates per pass over a step's batch (as TorchTrainerConfig)."""
    ppo_epochs: int = 1
    """Passes over a step's batch (as TorchTrainerConfig)."""
    vocab_multiple: int = 128
    """Pad the vocab to a multiple of this times tensor_parallel (stripped on export)."""
    optimizer: str = "torch"
    """torch: torch AdamW fed Megatron DDP's gradient buffers; megatron: Megatron's own
    optimizer (get_megatron_optimizer, Adam); distributed: Megatron's distributed optimizer
    (Adam state and gradient reduction sharded over the data-parallel ranks)."""

    @property
    def pack_sequences(self) -> bool:
        """Always False: the local (non-TE) attention has no packed-row path, rows are
        padded."""
        return False

    def validate(self) -> MegatronTrainerConfig:
        """Raise ValueError naming the first field with a bad value."""
        names = ("tensor_parallel", "pipeline_parallel", "max_tokens_per_microbatch")
        for name in (*names, "vocab_multiple", "num_minibatches", "ppo_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        return self


# The attention and MLP projections of Llama-, Qwen- and Mistral-style models (SmolLM2's too).
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraConfig:
    """LoRA adapters instead of full fine-tuning (rank 0: full fine-tuning, the default)."""

    rank: int = 0
    """Rank of each adapter's A and B matrices; 0 trains every weight of the model instead."""
    alpha: float = 32.0
    """Scale: an adapter's update is multiplied by alpha / rank (32 at any rank, as "LoRA
    without regret" recommends; LoRA usually wants a learning rate ~10x full fine-tuning's)."""
    dropout: float = 0.0
    """Dropout on an adapter's input while training. 0 keeps the trainer's logprobs those the
    engines serve (the post-sync check compares them)."""
    target_modules: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))
    """Names of the Linear layers that get an adapter (default: every attention and MLP
    projection of Llama/Qwen-style models)."""
    path: str | None = None
    """A PEFT adapter folder (adapter_config.json, adapter_model.safetensors), e.g. a
    checkpoint's ``trainers/<owner>/adapters/<agent>``: a trainable agent's adapter starts from
    it, a frozen agent is served with it. Its rank, alpha and targets are the folder's."""

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def validate(self) -> LoraConfig:
        if self.rank < 0:
            raise ValueError(f"lora.rank must be >= 0 (0: full fine-tuning), got {self.rank}")
        if self.enabled:
            if not self.alpha > 0:
                raise ValueError(f"lora.alpha must be > 0, got {self.alpha}")
            if not 0 <= self.dropout < 1:
                raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
            if not self.target_modules or not all(self.target_modules):
                raise ValueError(
                    f"lora.target_modules must name Linear layers, got {self.target_modules}"
                )
        return self

    def resolved(self, where: str) -> LoraConfig:
        """This setting with ``path``'s own rank, alpha, dropout and targets (unchanged without
        a path); a ValueError names ``where`` and the file when the folder is no adapter."""
        if self.path is None:
            return self
        file = Path(self.path) / "adapter_config.json"
        try:
            saved = json.loads(file.read_text())
            return LoraConfig(
                rank=int(saved["r"]),
                alpha=float(saved["lora_alpha"]),
                dropout=float(saved.get("lora_dropout") or 0.0),
                target_modules=sorted(saved["target_modules"]),
                path=self.path,
            ).validate()
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{where}.path: {file} is no PEFT LoRA adapter ({e})") from None

    def peft_config(self):
        """This setting as peft's ``LoraConfig``."""
        from peft import LoraConfig as PeftLoraConfig

        return PeftLoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
        )


@dataclass
class CriticConfig:
    """The value model of ``advantage.estimator: gae`` (one per trained model)."""

    model: str | None = None
    """HF causal LM whose body, with a new scalar head, is the critic; None: the trained
    model's own starting weights (a separate copy). It reads the trained model's token ids, so
    it must have the same tokenizer (checked at start-up)"""
    lr: float = 1e-5
    """AdamW learning rate of the critic (constant)"""
    value_clip: float = 0.2
    """PPO value clipping: a value moves at most this far from the step's old value before the
    loss stops rewarding it (the larger of the clipped and unclipped errors counts); 0: off"""
    grad_clip: float = 1.0
    """clip the critic's gradient norm to this; 0: off"""
    num_critic_only_steps: int = 0
    """the first steps train the critic alone (the policy waits for sensible values)"""
    shared: bool = False
    """a value head on the actor itself, reading its hidden states (CoMLRL's
    ``use_separate_critic: false``): no second model in memory, and the value loss trains the
    actor's body too; False: a separate value model (``model``)"""
    value_coef: float = 0.6
    """with ``shared``: the weight of the value loss in the actor's joint loss (CoMLRL's
    ``value_loss_coef``, whose default this is)"""
    centralized: bool = False
    """MAPPO: the critic also reads each sample's ``metadata["global_state"]`` (text the
    recipe's generate sets: what the other agents saw and this one did not), before the
    agent's own dialogue; False: IPPO, each critic sees only its agent's view"""
    scope: str = "model"
    """model: one critic per trained model (IPPO; MAPPO with ``centralized``); run: ONE critic
    for every trained model of the run (CoMLRL's MAAC), trained on all their returns each step
    in the driver, its per-token advantages handed to each model's trainer (every trained
    model must share the critic's tokenizer)"""

    def validate(self) -> CriticConfig:
        if self.scope not in ("model", "run"):
            raise ValueError(f"critic.scope must be model or run, got {self.scope!r}")
        if self.scope == "run" and self.shared:
            raise ValueError(
                "critic.scope run is one value model for every agent; critic.shared puts a "
                "value head on one actor: set one of them"
            )
        if self.scope == "run" and self.num_critic_only_steps:
            raise ValueError(
                "critic.num_critic_only_steps: a warm-up of the run's one critic "
                "(critic.scope run) is not supported yet; use critic.scope model for it"
            )
        if self.shared and self.model is not None:
            raise ValueError(
                f"critic.model ({self.model!r}) names a separate value model, and critic.shared "
                "puts the value head on the actor: set one of them"
            )
        for name in ("lr", "value_clip", "grad_clip", "value_coef"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"critic.{name} must be a finite number >= 0, got {value!r}")
        if self.lr <= 0:
            raise ValueError(f"critic.lr must be > 0, got {self.lr}")
        if self.num_critic_only_steps < 0:
            raise ValueError(
                f"critic.num_critic_only_steps must be >= 0, got {self.num_critic_only_steps}"
            )
        return self


@dataclass
class RayConfig:
    """Training on Ray: each trainable model's trainer is a RayTrainer of actors."""

    enabled: bool = False
    """Train every model with Ray actors (one torch.distributed rank each) instead of in the
    driver process; the engines, rollouts and weight sync stay as they are."""
    address: str = "local"
    """Ray to use: 'local' starts one on this machine (127.0.0.1, auth off), 'auto' or
    ray://HOST:PORT joins a running cluster."""
    ranks: int = 1
    """Trainer ranks (actors) per model; an agent's resources.train_gpus overrides it."""
    num_cpus_per_rank: float = 0.0
    """CPUs Ray reserves for each actor."""
    num_gpus_per_rank: float = 0.0
    """GPUs Ray reserves for each actor (1 on GPU nodes: NCCL; 0: CPU and gloo)."""

    def validate(self) -> RayConfig:
        if self.ranks < 1:
            raise ValueError(f"ray.ranks must be >= 1, got {self.ranks}")
        if self.num_cpus_per_rank < 0 or self.num_gpus_per_rank < 0:
            raise ValueError("ray.num_cpus_per_rank and ray.num_gpus_per_rank must be >= 0")
        return self

    def start(self) -> bool:
        """Start or join Ray unless it runs in this process already; True if this call did."""
        import ray

        if ray.is_initialized():
            return False
        if self.address == "local":
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local instance
            ray.init(
                address="local",
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                log_to_driver=False,
            )
        else:
            ray.init(address=self.address, log_to_driver=False)
        return True
