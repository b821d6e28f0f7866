"""What the loop and the weight sync ask of a trainer (``Trainer``), and the one place a
training backend is chosen: ``backend_config`` turns the backend's name into its settings, and
``build_trainer`` builds the trainer those settings belong to.

Backends: ``torch`` (``TorchTrainer``: one HF model, FSDP2 across ranks) and ``megatron``
(``MegatronTrainer``: Megatron-core TP/PP/DP), side by side: each provides its model's forward,
reductions and optimiser step, and both run the update of ``kernel.train.update``. A
``RayTrainer`` (kernel.train.ray_trainer) is a trainer too: it runs one of them per Ray actor,
each rank built here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from kernel.advantages import AdvantageConfig
from kernel.loss import LossConfig
from kernel.sample import Sample
from kernel.train.megatron_backend import MegatronTrainer
from kernel.train.optim import OptimConfig
from kernel.train.settings import (
    CRITIC_BACKEND_ERROR,
    CriticConfig,
    LoraConfig,
    MegatronTrainerConfig,
)
from kernel.train.torch_backend import TorchTrainer


class Trainer(Protocol):
    """A model under training, on one process or across ranks."""

    def train_step(self, samples: list[Sample], version: int | None = None) -> dict[str, float]:
        """Train on one step's samples (made by weights ``version``, older ones are stale)."""

    def compute_logprobs(self, samples: list[Sample]) -> list[list[float]]:
        """Each sample's response-token logprobs under the current weights (sync checks)."""

    def named_parameters_for_sync(self, dtype: Any = None) -> Iterator[tuple[str, Any]]:
        """The full weights in HF names, bucket by bucket, for a push to the engines."""

    def weight_broadcaster(self) -> Any:
        """This process's end of the distributed weight sync (kernel.sync.push)."""

    def save_hf(self, out_dir: str | Path) -> Path:
        """The weights as an HF folder (disk weight sync of a full model)."""

    def save(self, out_dir: str | Path) -> Path:
        """A checkpoint: weights, optimiser, schedule, RNG."""

    def load(self, ckpt_dir: str | Path) -> None:
        """Resume from ``save``'s folder."""

    def close(self) -> None:
        """Free the process groups and workers it holds."""


def build_trainer(
    model_path: str,
    optim: OptimConfig,
    loss: LossConfig,
    settings: Any,
    total_steps: int,
    temperature: float = 1.0,
    seed: int = 0,
    critic: CriticConfig | None = None,
    advantage: AdvantageConfig | None = None,
    adapters: dict[str, LoraConfig] | None = None,
) -> Trainer:
    """The trainer of one model in this process (one rank of it when torch.distributed is
    initialised); ``settings``, made by ``backend_config``, say which backend. ``temperature``
    is the agent's rollout temperature (the trainer's logprobs divide the logits by it),
    ``seed`` the run's; ``critic`` (with ``advantage``'s GAE settings) adds a value model
    (``kernel.train.critic``: torch backend only); ``adapters`` (agent -> LoRA setting) trains
    a LoRA adapter per agent instead of the whole model (torch backend only)."""
    if isinstance(settings, MegatronTrainerConfig):
        if critic is not None:
            raise ValueError(CRITIC_BACKEND_ERROR)
        if adapters:
            raise ValueError("LoRA adapters train on the torch backend only")
        return MegatronTrainer(model_path, optim, loss, settings, total_steps, temperature, seed)
    args = (model_path, optim, loss, settings, total_steps, temperature, seed)
    return TorchTrainer(*args, critic=critic, advantage=advantage, adapters=adapters)
