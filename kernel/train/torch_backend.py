"""The torch training backend: one HF causal LM, AdamW, the kernel's policy loss, FSDP2 for
data parallelism. The embedded default on CPU, and a single-node GPU backend.

The update itself (micro-batches by a token budget, the policy loss weighted by the global
normaliser, PPO epochs and mini-batches, old logprobs) is ``kernel.train.update``, shared with
the Megatron backend; this module provides the model, its forward, FSDP and the optimiser step.
Samples of one prompt group run their shared prompt once per micro-batch (``share_prompts``).

Precision: parameters, gradients and AdamW state stay float32; ``optim.dtype="bfloat16"`` runs
forward and backward under bf16 autocast (pure bf16 weights would round lr=1e-6 updates away).

Data parallel: when torch.distributed is initialised with world size > 1, the model (and the
reference model) are sharded with FSDP2 ``fully_shard`` (runs on CPU over gloo and on GPUs over
NCCL), one unit per decoder layer. Each rank passes its own share of the samples to
``train_step`` (``kernel.train.batching.shard_samples`` splits a global batch evenly).

LoRA (``adapters``: agent -> ``kernel.train.settings.LoraConfig``): the base is loaded once and
frozen, each agent trains an adapter of its own with an optimizer of its own: a step's samples
are split by agent and each agent's adapter is updated on its own samples alone. The KL
reference is the base itself (the adapters switched off), not a second copy. One rank only.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from kernel.advantages import AdvantageConfig
from kernel.loss import LossConfig
from kernel.models import cache_kwargs, load_causal_lm, load_tokenizer
from kernel.sample import Sample
from kernel.sync.push import LocalBroadcaster
from kernel.train import update
from kernel.train.batching import MicroBatch
from kernel.train.critic import Critic
from kernel.train.lora import Adapters
from kernel.train.optim import OptimConfig, build_optimizer
from kernel.train.settings import CriticConfig, LoraConfig, TorchTrainerConfig

BASE = "the base model"  # the KL reference of a LoRA trainer: its model with adapters off


def _full_attention_cache(model) -> bool:
    """Whether every layer of the model's KV cache is plain full attention (a shared prompt's
    cache is copied per sample and continued; sliding-window or recurrent layers are not)."""
    from transformers import DynamicCache

    try:
        layers = DynamicCache(config=model.config).layers
    except Exception:  # a model without a standard cache
        return False
    return {type(layer).__name__ for layer in layers} == {"DynamicLayer"}


def _rows_by_agent(samples: list[Sample]) -> dict[str | None, list[int]]:
    """LoRA: the samples' indices by agent (each agent's go through its own adapter)."""
    rows: dict[str | None, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        rows[s.agent].append(i)
    return rows


def resolve_device(name: str, rank: int = 0) -> torch.device:
    """The device a trainer setting names (auto: CUDA when there is one), for ``rank``."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank % max(1, torch.cuda.device_count())))
        name = f"cuda:{local}"
    device = torch.device(name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


class TorchTrainer:
    """Trains one HF causal LM with the kernel's policy loss; see the module docstring."""

    def __init__(
        self,
        model_path: str,
        optim: OptimConfig,
        loss: LossConfig,
        cfg: TorchTrainerConfig,
        total_steps: int,
        temperature: float = 1.0,
        seed: int = 0,
        critic: CriticConfig | None = None,
        advantage: AdvantageConfig | None = None,
        adapters: dict[str, LoraConfig] | None = None,
    ):
        """``temperature``: the rollout's, which logits are divided by before the softmax (so
        the trainer's logprobs are those of the distribution the engine sampled from);
        ``seed``: of the mini-batch shuffling (the run's seed); ``critic``: a value model
        trained beside the policy, whose GAE (``advantage``'s gamma, lam, eps and
        std_normalize) gives the advantages (``kernel.train.critic``); ``adapters``: train a
        LoRA adapter per agent named (its setting) over the frozen base instead of the whole
        model."""
        update.configure(self, model_path, optim, loss, cfg, total_steps, temperature, seed)
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if distributed else 0
        self.world_size = dist.get_world_size() if distributed else 1
        self.device = resolve_device(cfg.device, self.rank)
        self.autocast_dtype = torch.bfloat16 if optim.dtype == "bfloat16" else None
        self.step = 0
        self.last_updates: list[dict[str, float]] = []  # the last train_step's, per update

        self.model = self._load(model_path)
        self.lora = self._build_adapters(adapters, critic, optim, total_steps) if adapters else None
        self.share_prompts = (  # FSDP gathers weights per forward: ranks must run the same ones
            cfg.share_prompts
            and self.world_size == 1
            and not cfg.pack_sequences
            and not cfg.gradient_checkpointing
            and _full_attention_cache(self.model)
        )
        if cfg.gradient_checkpointing:
            # transformers 5 renamed it; pyproject allows >= 4.56, which has only the old name.
            enable = getattr(self.model, "activation_checkpointing_enable", None)
            (enable or self.model.gradient_checkpointing_enable)({"use_reentrant": False})
        self.model.train()
        self.ref_model = None
        if loss.kl_coef > 0:
            self.ref_model = BASE if self.lora else self._load(model_path).eval()
            if self.lora is None:
                self.ref_model.requires_grad_(False)
        if self.world_size > 1:
            self._shard(self.model)
            if self.ref_model is not None:
                self._shard(self.ref_model)

        if self.lora is not None:
            self._use(self.lora.names[0])
        else:  # the parameters as the optimizer holds them (FSDP's shards, once sharded)
            self.params = list(self.model.parameters())
            self.optimizer, self.scheduler = build_optimizer(self.params, optim, total_steps)
        self.critic = None if critic is None else self._build_critic(critic, advantage, model_path)

    # ---------------------------------------------------------------- set-up

    def _build_adapters(
        self,
        adapters: dict[str, LoraConfig],
        critic: CriticConfig | None,
        optim: OptimConfig,
        total_steps: int,
    ) -> Adapters:
        """LoRA adapters over ``self.model`` (which becomes the model with them in), one per
        agent named; they train on one rank, without a critic (ValueError otherwise)."""
        if self.world_size > 1 or critic is not None:
            raise ValueError(
                "lora: LoRA adapters train on one rank without a critic; this trainer has "
                f"{self.world_size} data-parallel ranks"
                + (" and a critic (advantage.estimator gae)" if critic else "")
            )
        lora = Adapters(self.model, adapters, optim, total_steps)
        self.model = lora.model
        return lora

    def _build_critic(
        self, critic: CriticConfig, advantage: AdvantageConfig | None, model_path: str
    ) -> Critic:
        """The value model trained beside the policy, on one rank (ValueError otherwise)."""
        if self.world_size > 1:
            raise ValueError(
                "critic (advantage.estimator gae): the critic trains on one rank; this "
                f"trainer has {self.world_size} data-parallel ranks"
            )
        return Critic(
            critic, advantage or AdvantageConfig(), model_path, self.device, self.cfg, self.model
        )

    def _load(self, path: str):
        model = load_causal_lm(path, dtype="float32", device=str(self.device))
        if self.cfg.attn_implementation is not None:
            model.set_attn_implementation(self.cfg.attn_implementation)
        return model

    def _shard(self, model) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(self.device.type, (self.world_size,))
        layer_classes = set(getattr(model, "_no_split_modules", None) or [])
        for module in model.modules():
            if type(module).__name__ in layer_classes:
                fully_shard(module, mesh=mesh)
        fully_shard(model, mesh=mesh)

    # ---------------------------------------------------------------- forward

    def logits(self, model, mb: MicroBatch) -> Tensor:
        """Logits (N, V) at the N positions that predict a response token."""
        if model is BASE:
            with self.model.disable_adapter():
                return self.logits(self.model, mb)
        if mb.prompts is not None:
            return self._shared_logits(model, mb)
        dev = self.device
        with update.autocast(self.device, self.autocast_dtype):
            out = model(
                input_ids=mb.input_ids.to(dev),
                attention_mask=None if mb.attention_mask is None else mb.attention_mask.to(dev),
                position_ids=mb.position_ids.to(dev),
                logits_to_keep=mb.keep.to(dev),  # only positions predicting a response token
                use_cache=False,  # a cache would also turn off transformers' packed-row masks
            )
        return out.logits  # (N, V)

    def _shared_logits(self, model, mb: MicroBatch) -> Tensor:
        """Logits (N, V) of a shared-prompt micro-batch: each distinct prompt once, then each
        sample's response as a continuation of its prompt's KV cache (gradients flow through
        the cache into the prompt's forward)."""
        from transformers import DynamicCache

        dev, p = self.device, mb.prompts
        rows = p.rows.to(dev)  # (S,)
        cache = DynamicCache(config=model.config)
        with update.autocast(self.device, self.autocast_dtype):
            out = model(
                input_ids=p.input_ids.to(dev),
                attention_mask=p.attention_mask.to(dev),
                position_ids=p.position_ids.to(dev),
                **cache_kwargs(model, cache),
                use_cache=True,
                logits_to_keep=1,
            )
            first = out.logits[:, -1][rows]  # (S, V): the prompt's last position, per sample
            if mb.input_ids.shape[1] == 0:  # every response is one token long
                return first
            cache.batch_select_indices(rows)  # each sample's copy of its prompt's keys/values
            out = model(
                input_ids=mb.input_ids.to(dev),
                attention_mask=mb.attention_mask.to(dev),
                position_ids=mb.position_ids.to(dev),
                **cache_kwargs(model, cache),
                use_cache=True,
                logits_to_keep=mb.keep.to(dev),
            )
        return torch.cat([first, out.logits])  # (N, V)

    def grad_sync(self, last: bool) -> None:
        """Under FSDP, reduce the gradients after an update's last micro-batch only."""
        if self.world_size > 1:
            self.model.set_requires_gradient_sync(last)

    def all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """Sum (or max) of each value over the ranks, as floats."""
        return update.all_reduce(values, op, self.device, self.world_size)

    # ---------------------------------------------------------------- training: kernel.train.update

    def train_step(self, samples: list[Sample], version: int | None = None) -> dict[str, float]:
        """Train on this rank's ``samples`` (made by weights ``version``); global metrics. With
        LoRA each agent's adapter trains on that agent's samples (metrics ``<agent>/...`` when
        there are several)."""
        if self.lora is None:
            return update.train_step(self, samples, version)
        by_agent = _rows_by_agent(samples)
        unknown = sorted(set(by_agent) - set(self.lora.names), key=str)
        if unknown:
            raise ValueError(
                f"samples of {unknown}, which have no LoRA adapter in this trainer "
                f"(adapters: {self.lora.names})"
            )
        metrics, updates = {}, []
        for name in self.lora.names:
            if name not in by_agent:
                continue
            self._use(name)
            out = update.train_step(self, [samples[i] for i in by_agent[name]], version)
            self.lora.steps[name] = self.step
            if out.get("n_updates"):
                self.lora.stepped.add(name)
            updates += self.last_updates
            scope = "" if len(self.lora.names) == 1 else f"{name}/"
            metrics |= {f"{scope}{k}": v for k, v in out.items()}
        self.last_updates = updates
        return metrics

    def _use(self, name: str) -> None:
        """Train adapter ``name`` next: it becomes the active one, its optimizer the one that
        steps."""
        self.lora.use(name)
        (self.optimizer, self.scheduler), self.params = (
            self.lora.optimizers[name],
            self.lora.params[name],
        )
        self.step = self.lora.steps[name]

    @contextmanager
    def _serving(self, agent: str | None):
        """The model as it serves ``agent``: its adapter, or the bare base for an agent without
        one (a frozen agent of a LoRA model)."""
        if self.lora is None:
            yield
        elif agent in self.lora.configs:
            active = self.lora.active
            self.lora.use(agent)
            try:
                yield
            finally:
                self.lora.use(active)
        else:
            with self.model.disable_adapter():
                yield

    def forward_backward(
        self,
        samples: list[Sample],
        old_logprobs: list[list[float]] | None = None,
        tis_cap: float | None = None,
    ) -> dict[str, float]:
        """Accumulate the gradient of the samples' loss (no optimiser step)."""
        return update.forward_backward(self, samples, old_logprobs, tis_cap)

    def compute_logprobs(self, samples: list[Sample]) -> list[list[float]]:
        """Each sample's response-token logprobs under the current weights (every rank calls
        it under data parallelism, with its own samples); with LoRA, under its agent's
        adapter."""
        if self.lora is None:
            return update.compute_logprobs(self, samples)
        out: list[list[float]] = [[] for _ in samples]
        for agent, rows in _rows_by_agent(samples).items():
            with self._serving(agent):
                scored = update.compute_logprobs(self, [samples[i] for i in rows])
            for i, lp in zip(rows, scored, strict=True):
                out[i] = lp
        return out

    def optim_step(self) -> dict[str, float]:
        """Clip the gradient norm, step AdamW and the schedule, zero the gradients.

        A non-finite gradient norm skips the update (the gradients are dropped).
        """
        max_norm = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        if hasattr(norm, "full_tensor"):  # a DTensor under FSDP
            norm = norm.full_tensor()
        grad_norm = float(norm)
        lr = self.scheduler.get_last_lr()[0]
        if math.isfinite(grad_norm):
            self.optimizer.step()
            self.scheduler.step()
            self.step += 1
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": grad_norm, "lr": lr, "step": float(self.step)}

    # ---------------------------------------------------------------- weights and checkpoints

    def weight_broadcaster(self):
        """Rank 0 of the distributed weight sync: this process (kernel.sync.push)."""
        return LocalBroadcaster(self)

    def named_parameters_for_sync(self, dtype: torch.dtype | None = None) -> Iterator[tuple]:
        """(HF name, full tensor) for every parameter, for weight sync to the engines.

        Under FSDP each tensor is gathered from its shards, so every rank must iterate.
        ``dtype`` casts (e.g. to the engine's bfloat16).
        """
        for name, p in self.model.named_parameters():
            t = p.detach()
            if hasattr(t, "full_tensor"):
                t = t.full_tensor()
            yield name, (t if dtype is None else t.to(dtype))

    def _options(self, **kwargs):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, **kwargs)

    def adapters_to_sync(self) -> list[str]:
        """The LoRA adapters that stepped since the last call, which a weight sync then sends;
        none for a full model."""
        if self.lora is None:
            return []
        names = [n for n in self.lora.names if n in self.lora.stepped]
        self.lora.stepped.clear()
        return names

    def adapter(self, name: str) -> tuple[dict, list[tuple[str, Tensor]]]:
        """LoRA adapter ``name``: its adapter_config.json and its tensors, as PEFT names them."""
        return self.lora.config_dict(name), list(self.lora.state_dict(name).items())

    def save_adapters(self, out_dir: str | Path, names: list[str]) -> dict[str, Path]:
        """LoRA adapters ``names`` as PEFT folders ``out_dir/<name>``, by name."""
        return self.lora.save(Path(out_dir), names)

    def save_hf(self, out_dir: str | Path) -> Path:
        """Save an HF checkpoint (config, safetensors, tokenizer) that any engine can load."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        if self.lora is not None:
            raise ValueError(
                "a LoRA trainer's weights are its adapters over the unchanged base: save them "
                "with save_adapters (a checkpoint holds them under adapters/)"
            )
        out = Path(out_dir)
        state = get_model_state_dict(self.model, options=self._options(cpu_offload=True))
        if self.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(out, state_dict=state)
            load_tokenizer(self.model_path).save_pretrained(out)
        self._barrier()
        return out

    def save(self, out_dir: str | Path) -> Path:
        """A training checkpoint: the HF checkpoint (with LoRA, the adapters alone, under
        ``adapters/``) plus optimiser, schedule, step and RNG."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        trainer_state = {"step": self.step, "world_size": self.world_size}
        if self.lora is not None:
            out = Path(out_dir)
            self.lora.save(out / "adapters")
            state = {"adapters": self.lora.optimizer_state()}
            trainer_state["adapter_steps"] = self.lora.steps
        else:
            out = self.save_hf(out_dir)
            optim_state = get_optimizer_state_dict(
                self.model, self.optimizer, options=self._options(cpu_offload=True)
            )
            state = {"optimizer": optim_state, "scheduler": self.scheduler.state_dict()}
        if self.rank == 0:
            torch.save(state, out / "optimizer.pt")
            (out / "trainer_state.json").write_text(json.dumps(trainer_state))
        rng = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        torch.save(rng, out / f"rng_rank{self.rank}.pt")
        if self.critic is not None:
            self.critic.save(out)
        self._barrier()
        return out

    def load(self, ckpt_dir: str | Path) -> None:
        """Restore a checkpoint written by ``save`` (any world size) into this trainer."""
        ckpt = Path(ckpt_dir)
        if self.lora is not None or (ckpt / "adapters").is_dir():
            self._load_adapters(ckpt)
        else:
            self._load_weights(ckpt)
        rng_file = ckpt / f"rng_rank{self.rank}.pt"
        if rng_file.exists():
            rng = torch.load(rng_file, weights_only=True)
            torch.set_rng_state(rng["torch"])
            if "cuda" in rng and self.device.type == "cuda":
                torch.cuda.set_rng_state(rng["cuda"], self.device)
        if self.critic is not None:
            self.critic.load(ckpt)
        self._barrier()

    def _load_adapters(self, ckpt: Path) -> None:
        """A LoRA checkpoint's adapters, their optimizers and steps (``save`` with LoRA)."""
        if self.lora is None:
            raise ValueError(
                f"{ckpt}: holds LoRA adapters (adapters/), but this trainer fine-tunes the "
                "whole model: resume with the run's lora settings"
            )
        if not (ckpt / "adapters").is_dir():
            raise ValueError(
                f"{ckpt}: holds the whole model's weights, but this trainer trains LoRA "
                "adapters: resume without lora (lora.rank 0)"
            )
        self.lora.load(ckpt / "adapters")
        state = torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True)
        self.lora.load_optimizer_state(state["adapters"])
        steps = json.loads((ckpt / "trainer_state.json").read_text())["adapter_steps"]
        self.lora.steps.update(steps)
        self.lora.stepped.clear()
        self._use(self.lora.names[0])

    def _load_weights(self, ckpt: Path) -> None:
        """The whole model's weights, optimizer state, schedule and step."""
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        files = sorted(ckpt.glob("*.safetensors"))
        if not files or not (ckpt / "optimizer.pt").exists():
            raise FileNotFoundError(
                f"{ckpt}: not a checkpoint written by TorchTrainer.save (needs *.safetensors "
                "and optimizer.pt)"
            )
        weights = {k: v for f in files for k, v in load_file(f).items()}
        shapes = {k: tuple(v.shape) for k, v in self.model.state_dict().items()}  # global shapes
        wrong = [
            f"{k}: {tuple(v.shape)} there, {shapes[k]} here"
            for k, v in weights.items()
            if k in shapes and tuple(v.shape) != shapes[k]
        ]
        if wrong:
            raise ValueError(
                f"{ckpt}: weights do not match the model ({self.model_path}): {len(wrong)} "
                f"tensors differ in shape, e.g. {wrong[:3]}; a checkpoint of another model?"
            )
        result = set_model_state_dict(self.model, weights, options=self._options(strict=False))
        if result.missing_keys or result.unexpected_keys:
            raise ValueError(
                f"{ckpt}: weights do not match the model: missing {result.missing_keys}, "
                f"unexpected {result.unexpected_keys}"
            )
        state = torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True)
        set_optimizer_state_dict(
            self.model, self.optimizer, state["optimizer"], options=self._options()
        )
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = json.loads((ckpt / "trainer_state.json").read_text())["step"]

    def _barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def close(self) -> None:
        """Nothing to free: the process group, if any, is the caller's."""
