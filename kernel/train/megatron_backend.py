"""The Megatron training backend: a Megatron-core GPTModel with the kernel's policy loss.

``MegatronTrainer`` has the surface the loop uses on ``TorchTrainer`` (``train_step``,
``compute_logprobs``, ``named_parameters_for_sync``, ``save_hf``) and inherits its whole
micro-batching and loss path (``forward_backward``: the same ``kernel.loss.policy_loss`` on the
same per-token logprobs, the same normalisers and metrics). Only what differs is overridden:

- the model is ``build_gpt_model`` + ``load_hf_weights`` (``kernel.train.megatron_model``) from
  the HF checkpoint folder, wrapped in Megatron's ``DistributedDataParallel`` (gradients land in
  its contiguous fp32 ``main_grad`` buffers; overlap off, since overlapping uses CUDA streams);
- the forward runs the padded rows through Megatron (causal attention: right padding never
  reaches a real token) and takes the temperature-scaled logprobs of the response tokens with
  ``kernel.train.logprobs.token_logprobs``, exactly as the torch backend does;
- weights leave in HF names and layouts through ``kernel.sync.convert`` (TP shards gathered).

Optimiser: torch AdamW over the model parameters, fed the DDP ``main_grad`` buffers. This is the
CPU fallback: Megatron's ``get_megatron_optimizer`` hard-codes ``device="cuda"`` (optimizer.py,
clip_grads.py) and is not patched here; with the same OptimConfig the update equals the torch
backend's.

Scope: tensor parallelism works (every TP rank passes the same samples); pipeline parallelism
(needs Megatron's schedules) and data parallelism > 1 are refused with a clear error.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from kernel.loss import LossConfig
from kernel.models import load_tokenizer
from kernel.train.megatron_model import (
    MegatronModelConfig,
    build_gpt_model,
    export_hf_weights,
    load_hf_weights,
    megatron_parallel,
)
from kernel.train.optim import OptimConfig, build_optimizer
from kernel.train.torch_backend import TorchTrainer


@dataclass
class MegatronTrainerConfig:
    """Megatron training backend: model layout, micro-batching and temperature (the optimiser
    is set by OptimConfig, the loss by LossConfig)."""

    tensor_parallel: int = 1
    """Tensor-parallel size (must divide the key/value heads and the ffn size)."""
    max_tokens_per_microbatch: int = 8192
    """Token budget of one micro-batch of right-padded rows (rows x padded length)."""
    temperature: float = 1.0
    """The rollout sampling temperature: logits are divided by it before the softmax."""
    vocab_multiple: int = 128
    """Pad the vocab to a multiple of this times tensor_parallel (stripped on export)."""
    seed: int = 1234
    """Seed of Megatron's tensor-/data-parallel RNG streams."""

    @property
    def pack_sequences(self) -> bool:
        """Always False: the local (non-TE) attention has no packed-row path, rows are
        padded."""
        return False

    def validate(self) -> MegatronTrainerConfig:
        """Raise ValueError naming the first field with a bad value."""
        for name in ("tensor_parallel", "max_tokens_per_microbatch", "vocab_multiple"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.temperature < math.inf:
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature}")
        return self


class MegatronTrainer(TorchTrainer):
    """Trains a Megatron GPTModel built from an HF checkpoint; see the module docstring.

    If Megatron's ``parallel_state`` is not initialised, the trainer initialises it (and a
    one-process gloo group) itself; ``close()`` tears that down again.
    """

    def __init__(
        self,
        model_path: str,
        optim: OptimConfig,
        loss: LossConfig,
        cfg: MegatronTrainerConfig,
        total_steps: int,
    ):
        from megatron.core import parallel_state as ps

        self._set_config(model_path, optim, loss, cfg, total_steps)
        self._stack = contextlib.ExitStack()
        if not ps.model_parallel_is_initialized():
            self._stack.enter_context(megatron_parallel(cfg.tensor_parallel, 1, cfg.seed))
        try:
            self._setup(total_steps)
        except BaseException:
            self._stack.close()  # leave no parallel state behind a failed constructor
            raise

    def _setup(self, total_steps: int) -> None:
        from megatron.core import parallel_state as ps
        from transformers import AutoConfig

        cfg, optim, loss = self.cfg, self.optim_cfg, self.loss_cfg
        if ps.get_tensor_model_parallel_world_size() != cfg.tensor_parallel:
            raise ValueError(
                f"tensor_parallel is {cfg.tensor_parallel} but parallel_state was initialised "
                f"with {ps.get_tensor_model_parallel_world_size()}"
            )
        if ps.get_pipeline_model_parallel_world_size() > 1:
            raise ValueError("pipeline parallelism is not supported by MegatronTrainer yet")
        if ps.get_data_parallel_world_size() > 1:
            raise ValueError("data parallelism > 1 is not supported by MegatronTrainer yet")
        # Every TP rank holds the same samples: the inherited loss path needs no all-reduce.
        self.rank, self.world_size = 0, 1
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.autocast_dtype = torch.bfloat16 if optim.dtype == "bfloat16" else None
        self.step = 0

        self.hf_config = AutoConfig.from_pretrained(self.model_path)
        self.mcfg = MegatronModelConfig(
            tensor_parallel=cfg.tensor_parallel,
            vocab_multiple=cfg.vocab_multiple,
            seed=cfg.seed,
        )
        self.module, self.arch = self._build()
        self.model = self._wrap_ddp(self.module)
        self.model.train()
        self.ref_model = None
        if loss.kl_coef > 0:
            self.ref_model = self._build()[0].eval().requires_grad_(False)

        self.optimizer, self.scheduler = build_optimizer(
            self.module.parameters(), optim, total_steps
        )

    # ---------------------------------------------------------------- set-up

    def _build(self):
        from safetensors.torch import load_file

        model, arch = build_gpt_model(self.hf_config, self.mcfg)
        files = sorted(Path(self.model_path).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{self.model_path}: no *.safetensors weights")
        hf_state = {k: v for f in files for k, v in load_file(f).items()}
        load_hf_weights(model, hf_state, arch)
        return model.to(self.device), arch

    def _wrap_ddp(self, module):
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        ddp_cfg = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False
        )
        return DistributedDataParallel(module.config, ddp_cfg, module)

    def close(self) -> None:
        """Tear down the parallel state this trainer initialised (if it did)."""
        self._stack.close()

    # ---------------------------------------------------------------- forward

    def _logits(self, model, mb) -> Tensor:
        """Logits (N, V) at the positions predicting a response token, TP-gathered, with the
        vocab padding stripped (the rest of ``_forward`` is TorchTrainer's)."""
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        dev = self.device
        with self._autocast():
            logits = model(mb.input_ids.to(dev), mb.position_ids.to(dev), attention_mask=None)
        if ps.get_tensor_model_parallel_world_size() > 1:
            logits = gather_from_tensor_model_parallel_region(logits)  # (B, L, V_pad)
        return logits[mb.keep.to(dev)][:, : self.arch.vocab_size]  # (N, V)

    # ---------------------------------------------------------------- training

    def optim_step(self) -> dict[str, float]:
        """Reduce the DDP gradient buffers, clip, step AdamW and the schedule, zero the buffers.

        A non-finite gradient norm skips the update (the gradients are dropped).
        """
        self.model.finish_grad_sync()
        params = [p for p in self.module.parameters() if p.requires_grad]
        for p in params:  # DDP accumulated into main_grad (fp32); AdamW reads .grad
            p.grad = p.main_grad.to(p.dtype)
        max_norm = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else math.inf
        grad_norm = self._grad_norm(params)
        if math.isfinite(grad_norm) and grad_norm > max_norm:
            torch._foreach_mul_([p.grad for p in params], max_norm / (grad_norm + 1e-6))
        lr = self.scheduler.get_last_lr()[0]
        if math.isfinite(grad_norm):
            self.optimizer.step()
            self.scheduler.step()
            self.step += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.model.zero_grad_buffer()
        return {"grad_norm": grad_norm, "lr": lr, "step": float(self.step)}

    def _grad_norm(self, params: list) -> float:
        """Global L2 norm of the gradients: TP-sharded parameters' squares are summed over
        the tensor-parallel group, replicated ones (norms) counted once."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        sharded = [p.grad for p in params if getattr(p, "tensor_model_parallel", False)]
        replicated = [p.grad for p in params if not getattr(p, "tensor_model_parallel", False)]

        def sq(grads: list) -> Tensor:  # () float64
            return sum(
                (g.double().pow(2).sum() for g in grads), torch.zeros((), dtype=torch.float64)
            )

        total = sq(sharded)
        if ps.get_tensor_model_parallel_world_size() > 1:
            dist.all_reduce(total, group=ps.get_tensor_model_parallel_group())
        return float((total + sq(replicated)).sqrt())

    # ---------------------------------------------------------------- weights

    def hf_state_dict(self) -> dict[str, Tensor]:
        """The full HF state dict (TP shards gathered, vocab padding stripped)."""
        return export_hf_weights(self.module, self.arch)

    def named_parameters_for_sync(self, dtype: torch.dtype | None = None) -> Iterator[tuple]:
        """(HF name, full tensor) for every weight, for weight sync to the engines. Every TP
        rank must iterate (the shards are gathered collectively)."""
        for name, t in self.hf_state_dict().items():
            yield name, (t if dtype is None else t.to(dtype))

    def save_hf(self, out_dir: str | Path) -> Path:
        """Save an HF checkpoint (config, safetensors, tokenizer) that any engine can load;
        every TP rank must call it (the shards are gathered), TP rank 0 writes."""
        from megatron.core import parallel_state as ps
        from safetensors.torch import save_file

        out = Path(out_dir)
        state = {k: v.contiguous() for k, v in self.hf_state_dict().items()}

        if ps.get_tensor_model_parallel_rank() == 0:
            out.mkdir(parents=True, exist_ok=True)
            save_file(state, out / "model.safetensors", metadata={"format": "pt"})
            self.hf_config.save_pretrained(out)
            gen = Path(self.model_path) / "generation_config.json"
            if gen.exists():
                shutil.copy(gen, out / gen.name)
            load_tokenizer(self.model_path).save_pretrained(out)
        return out

    def save(self, out_dir: str | Path) -> Path:
        raise NotImplementedError("MegatronTrainer has no training checkpoints yet (save_hf)")

    def load(self, ckpt_dir: str | Path) -> None:
        raise NotImplementedError("MegatronTrainer has no training checkpoints yet")
