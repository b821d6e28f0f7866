"""The Megatron training backend: a Megatron-core GPTModel with the kernel's policy loss.

``MegatronTrainer`` is a ``kernel.train.trainer.Trainer`` beside ``TorchTrainer``: both run the
update of ``kernel.train.update`` (the same micro-batching, the same ``kernel.loss.policy_loss``
on the same per-token logprobs, the same normalisers and metrics). What is Megatron's own:

- the model is ``build_gpt_model`` + ``load_hf_weights`` (``kernel.train.megatron_model``) from
  the HF checkpoint folder, this rank's pipeline stage and tensor shard, wrapped in Megatron's
  ``DistributedDataParallel`` (gradients land in its contiguous fp32 ``main_grad`` buffers;
  overlap off, since overlapping uses CUDA streams);
- the forward runs the padded rows through Megatron (causal attention: right padding never
  reaches a real token); the temperature-scaled logprobs of the response tokens are
  ``kernel.train.update.response_logprobs``, exactly as in the torch backend;
- weights leave in HF names and layouts through ``kernel.sync.convert`` (shards gathered).

Parallelism (sizes from Megatron's ``parallel_state``; every rank calls every method):

- tensor parallel: every TP rank of a replica passes the same samples;
- data parallel (world / (TP x PP) replicas): each replica passes its own share
  (``kernel.train.batching.shard_samples``). The loss normaliser and the metrics are summed over
  the data-parallel group, and Megatron DDP averages the gradients over it in
  ``finalize_model_grads``, so one step equals one single-process step on the whole batch;
- pipeline parallel: ``forward_backward`` and ``compute_logprobs`` run Megatron's 1F1B schedule
  (``get_forward_backward_func``; activations and their gradients go stage to stage by p2p,
  gloo on CPU), the policy loss on the last stage, whose metrics then go to every stage; the
  tied embedding's gradients are summed over its first- and last-stage copies.

Optimiser (``MegatronTrainerConfig.optimizer``): ``torch`` is torch AdamW fed the DDP
``main_grad`` buffers (the update equals the torch backend's); ``megatron`` is Megatron's
``get_megatron_optimizer`` (Adam with decoupled weight decay on every parameter, its grad norm
and clipping); ``distributed`` is its distributed optimizer (gradients reduce-scattered, Adam
state and fp32 main weights sharded over the data-parallel ranks, weights all-gathered). All
three apply OptimConfig's schedule and skip an update whose gradient norm is not finite; on CPU
the Megatron ones run through ``kernel.train.megatron_cpu`` (patches 7 and 8).

Checkpoints (``save``/``load``): one file per (TP, PP) rank with its parameter shards, Adam
state and schedule, per-rank RNG files, per data-parallel rank Adam shards under the
distributed optimizer, and a manifest (parallel sizes, optimizer, step) written last; a
checkpoint loads only into the layout it was saved with (the data-parallel size may change
unless the optimizer state is sharded over it). ``save_hf`` writes an HF checkpoint.

Not supported: sequence packing (the local attention has no packed-row path), virtual
(interleaved) pipeline stages, context and expert parallelism.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from kernel.loss import LossConfig
from kernel.models import load_tokenizer
from kernel.sample import Sample
from kernel.sync.push import LocalBroadcaster
from kernel.train import update
from kernel.train.megatron_model import (
    MegatronModelConfig,
    build_gpt_model,
    export_hf_weights,
    load_hf_weights,
    megatron_parallel,
)
from kernel.train.optim import OptimConfig, build_optimizer, build_scheduler
from kernel.train.settings import MegatronTrainerConfig


class MegatronTrainer:
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
        temperature: float = 1.0,
        seed: int = 0,
    ):
        """``temperature``: the rollout's (logits are divided by it before the softmax);
        ``seed``: of Megatron's tensor-/data-parallel RNG streams and of the mini-batch
        shuffling (the run's seed)."""
        from megatron.core import parallel_state as ps

        update.configure(self, model_path, optim, loss, cfg, total_steps, temperature, seed)
        self._stack = contextlib.ExitStack()
        if not ps.model_parallel_is_initialized():
            self._stack.enter_context(
                megatron_parallel(cfg.tensor_parallel, cfg.pipeline_parallel, seed)
            )
        try:
            self._setup(total_steps)
        except BaseException:
            self._stack.close()  # leave no parallel state behind a failed constructor
            raise

    def _setup(self, total_steps: int) -> None:
        from megatron.core import parallel_state as ps
        from transformers import AutoConfig

        cfg, optim, loss = self.cfg, self.optim_cfg, self.loss_cfg
        sizes = {
            "tensor_parallel": ps.get_tensor_model_parallel_world_size(),
            "pipeline_parallel": ps.get_pipeline_model_parallel_world_size(),
        }
        for name, size in sizes.items():
            if getattr(cfg, name) != size:
                raise ValueError(
                    f"{name} is {getattr(cfg, name)} but parallel_state was initialised with {size}"
                )
        # The update sees the data-parallel replicas as its ranks (every TP / PP rank of one
        # replica holds the same samples); all_reduce reduces over their group.
        self.rank, self.world_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.autocast_dtype = torch.bfloat16 if optim.dtype == "bfloat16" else None
        self.share_prompts = False  # Megatron's GPTModel runs every sample whole
        self.step = 0
        self.last_updates: list[dict[str, float]] = []

        self.hf_config = AutoConfig.from_pretrained(self.model_path)
        self.mcfg = MegatronModelConfig(
            tensor_parallel=cfg.tensor_parallel,
            pipeline_parallel=cfg.pipeline_parallel,
            vocab_multiple=cfg.vocab_multiple,
            seed=self.seed,
        )
        self.module, self.arch = self._build()
        self.model = self._wrap_ddp(self.module)
        self.model.train()
        self.ref_model = None
        if loss.kl_coef > 0:
            self.ref_model = self._build()[0].eval().requires_grad_(False)

        if cfg.optimizer == "torch":
            self.optimizer, self.scheduler = build_optimizer(
                self.module.parameters(), optim, total_steps
            )
        else:
            self.optimizer, self.scheduler = self._megatron_optimizer(total_steps)

    # ---------------------------------------------------------------- set-up

    def _megatron_optimizer(self, total_steps: int):
        """Megatron's optimizer (plain or distributed) with OptimConfig's AdamW settings, and
        OptimConfig's schedule on the torch optimizer inside it (the one that holds the lr)."""
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        optim = self.optim_cfg
        ocfg = OptimizerConfig(
            optimizer="adam",  # decoupled_weight_decay (the default): torch AdamW's update
            lr=optim.lr,
            weight_decay=optim.weight_decay,
            adam_beta1=optim.betas[0],
            adam_beta2=optim.betas[1],
            adam_eps=1e-8,  # torch AdamW's
            clip_grad=optim.grad_clip,
            use_distributed_optimizer=self.cfg.optimizer == "distributed",
            params_dtype=torch.float32,
        )
        # config_overrides={}: every parameter decays, as under torch AdamW (Megatron's default
        # overrides exempt biases and norms).
        optimizer = get_megatron_optimizer(ocfg, [self.model], config_overrides={})
        (inner,) = self._torch_optimizers(optimizer)  # dense models: one chained optimizer
        return optimizer, build_scheduler(inner, optim, total_steps)

    def _torch_optimizers(self, optimizer=None) -> list:
        """The torch optimizers that hold the Adam state: ours, or those inside Megatron's
        (over this rank's shard of the main parameters, for the distributed optimizer)."""
        optimizer = optimizer or self.optimizer
        if isinstance(optimizer, torch.optim.Optimizer):
            return [optimizer]
        return [o.optimizer for o in getattr(optimizer, "chained_optimizers", [optimizer])]

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

        # Averages the gradients over the data-parallel group (like FSDP; forward_backward
        # multiplies the loss by the DP size to turn the average back into the global sum).
        ddp_cfg = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            use_distributed_optimizer=self.cfg.optimizer == "distributed",
        )
        return DistributedDataParallel(module.config, ddp_cfg, module)

    def close(self) -> None:
        """Tear down the parallel state this trainer initialised (if it did)."""
        self._stack.close()

    def all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """Sum (or max) of each value over the data-parallel ranks: the TP / PP ranks of one
        replica hold the same samples, so reducing over every rank would count them again."""
        from megatron.core import parallel_state as ps

        group = ps.get_data_parallel_group() if self.world_size > 1 else None
        return update.all_reduce(values, op, self.device, self.world_size, group)

    def grad_sync(self, last: bool) -> None:
        """Nothing to switch: with overlap off, Megatron's DDP reduces the gradients only in
        ``finish_grad_sync`` (optim_step)."""

    # ---------------------------------------------------------------- forward

    def logits(self, model, mb) -> Tensor:
        """Logits (N, V) at the positions predicting a response token, TP-gathered, with the
        vocab padding stripped."""
        dev = self.device
        with update.autocast(dev, self.autocast_dtype):
            logits = model(mb.input_ids.to(dev), mb.position_ids.to(dev), attention_mask=None)
        return self._response_logits(logits, mb)

    def _response_logits(self, logits: Tensor, mb) -> Tensor:
        """The model's output (B, L, V_pad / TP) -> logits (N, V) at ``mb``'s response
        positions, gathered over the tensor-parallel ranks, vocab padding stripped."""
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        if ps.get_tensor_model_parallel_world_size() > 1:
            logits = gather_from_tensor_model_parallel_region(logits)  # (B, L, V_pad)
        return logits[mb.keep.to(self.device)][:, : self.arch.vocab_size]  # (N, V)

    # ---------------------------------------------------------------- training

    def train_step(self, samples: list[Sample], version: int | None = None) -> dict[str, float]:
        """Train on this replica's ``samples`` (made by weights ``version``); global metrics
        (``kernel.train.update.train_step``)."""
        return update.train_step(self, samples, version)

    def optim_step(self) -> dict[str, float]:
        """Reduce the DDP gradient buffers, clip, step AdamW and the schedule, zero the buffers.

        ``finalize_model_grads`` is Megatron's end of a step: DDP's ``finish_grad_sync`` (the
        data-parallel average) and, under pipeline parallelism with tied embeddings, the sum of
        the embedding's gradients on the first stage and of its copy on the last.
        A non-finite gradient norm skips the update (the gradients are dropped).
        """
        from megatron.core.distributed import finalize_model_grads

        finalize_model_grads([self.model])
        if self.cfg.optimizer != "torch":
            return self._megatron_optim_step()
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

    def _megatron_optim_step(self) -> dict[str, float]:
        """Megatron's optimizer step (its grad norm, clipping and Adam), skipped like the
        torch path when the gradient norm is not finite (Megatron's fp32 optimizer would step
        on it: only a loss scaler checks for inf/nan there)."""
        self.optimizer.prepare_grads()  # main_grad -> the gradients the optimizer reads
        grad_norm = float(self.optimizer.get_grad_norm())
        lr = self.scheduler.get_last_lr()[0]
        if math.isfinite(grad_norm):
            ok, _, _ = self.optimizer.step()  # prepares again (idempotent), clips, steps
            assert ok, "Megatron's fp32 optimizer always steps"
            self.scheduler.step()
            self.step += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.model.zero_grad_buffer()
        return {"grad_norm": grad_norm, "lr": lr, "step": float(self.step)}

    def _grad_norm(self, params: list) -> float:
        """Global L2 norm of the gradients, counted as Megatron's clip_grads does: every
        parameter once (TP-replicated ones, like norms, on TP rank 0 only; the last stage's
        copy of tied embeddings not at all), squares summed over the model-parallel group."""
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
        from megatron.core.transformer.module import param_is_not_shared

        total = torch.zeros((), dtype=torch.float64, device=self.device)  # ()
        for p in params:
            if param_is_not_shared(p) and param_is_not_tensor_parallel_duplicate(p):
                total += p.grad.double().pow(2).sum()
        if dist.get_world_size(ps.get_model_parallel_group()) > 1:
            dist.all_reduce(total, group=ps.get_model_parallel_group())
        return float(total.sqrt())

    # ---------------------------------------------------------------- pipeline parallel

    def _pipelined(self) -> bool:
        from megatron.core import parallel_state as ps

        return ps.get_pipeline_model_parallel_world_size() > 1

    def _schedule(self, model, mbs: list, on_logits, forward_only: bool) -> None:
        """Run the micro-batches ``mbs`` through Megatron's pipeline schedule (1F1B): the
        first stage embeds, each stage sends its hidden states (L, B, H) on, and the last stage
        calls ``on_logits(mb, logits)`` with its logits (B, L, V_pad / TP) for a scalar loss,
        backpropagated through every stage unless ``forward_only``. Every stage passes the same
        ``mbs`` (every rank of a replica holds the same samples)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        dev, n = self.device, len(mbs)

        def forward_step(data_iterator, stage_model):
            mb = next(data_iterator)
            out = stage_model(mb.input_ids.to(dev), mb.position_ids.to(dev), attention_mask=None)
            # The schedule divides the loss by the number of micro-batches (a mean); ours is
            # already a share of the global normaliser, so multiply that back.
            return out, lambda logits: (on_logits(mb, logits) * n, {})

        shape = max((mb.input_ids.shape for mb in mbs), default=(1, 1))  # sent with the tensors
        with torch.no_grad() if forward_only else contextlib.nullcontext():
            get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=iter(mbs),
                model=[model],
                num_microbatches=n,
                seq_length=shape[1],
                micro_batch_size=shape[0],
                forward_only=forward_only,
            )

    def _from_last_stage(self, obj):
        """``obj`` as the last pipeline stage has it, on every stage."""
        from megatron.core import parallel_state as ps

        box = [obj]
        dist.broadcast_object_list(
            box,
            src=ps.get_pipeline_model_parallel_last_rank(),
            group=ps.get_pipeline_model_parallel_group(),
        )
        return box[0]

    def _pipeline_logprobs(self, model, mbs: list) -> list[Tensor]:
        """Per micro-batch of ``mbs``, the logprobs (S, R) of its response tokens, on the last
        stage (an empty list elsewhere)."""
        out: list[Tensor] = []

        def keep(mb, logits):
            lp, _ = update.response_logprobs(self, self._response_logits(logits, mb), mb)
            out.append(lp.detach())
            return lp.sum()

        if mbs:
            self._schedule(model, mbs, keep, forward_only=True)
        return out

    @torch.no_grad()
    def compute_logprobs(self, samples: list[Sample]) -> list[list[float]]:
        """The policy's logprob of every response token of each sample (same order as given).
        Every rank must call it (data-parallel ranks with their own samples)."""
        if not self._pipelined():
            return update.compute_logprobs(self, samples)
        todo = [i for i, s in enumerate(samples) if s.response_length > 0]
        mbs = update.microbatches(self, [samples[i] for i in todo])
        rows = [lp.float().cpu().tolist() for lp in self._pipeline_logprobs(self.model, mbs)]
        rows = self._from_last_stage(rows)
        out: list[list[float]] = [[] for _ in samples]
        for mb, lp in zip(mbs, rows, strict=True):
            for row, j in enumerate(mb.indices):
                out[todo[j]] = lp[row][: samples[todo[j]].response_length]
        return out

    def forward_backward(
        self,
        samples: list[Sample],
        old_logprobs: list[list[float]] | None = None,
        tis_cap: float | None = None,
    ) -> dict[str, float]:
        """``kernel.train.update.forward_backward`` (the same loss, normaliser and metrics);
        under pipeline parallelism through Megatron's schedule, see
        ``_pipeline_forward_backward``."""
        if not self._pipelined():
            return update.forward_backward(self, samples, old_logprobs, tis_cap)
        return self._pipeline_forward_backward(samples, old_logprobs, tis_cap)

    def _pipeline_forward_backward(
        self, samples: list[Sample], old_logprobs, tis_cap: float | None
    ) -> dict[str, float]:
        """The update's per-micro-batch loss (``update.microbatch_loss``), run on the last
        pipeline stage inside Megatron's schedule; its metric sums then go to every stage and
        are summed over the data-parallel ranks as usual."""
        t0 = time.perf_counter()
        lcfg, kept, mbs, n_tok, denom = update.begin(self, samples, tis_cap)
        refs = iter(self._pipeline_logprobs(self.ref_model, mbs) if self.ref_model else [])
        acc = update.Totals.of(samples, old_logprobs)

        def loss_of(mb, logits) -> Tensor:
            lp, ent = update.response_logprobs(
                self,
                self._response_logits(logits, mb),
                mb,
                entropy=True,
                entropy_grad=self.loss_cfg.entropy_coef > 0,
            )  # (S, R) each
            ref = next(refs) if self.ref_model is not None else None
            return update.microbatch_loss(self, lcfg, mb, kept, lp, ent, ref, denom, acc)

        if mbs:
            self._schedule(self.model, mbs, loss_of, forward_only=False)
        sums, acc.token_means, acc.ratio_max = self._from_last_stage(
            (dict(acc.sums), acc.token_means, acc.ratio_max)
        )
        acc.sums = defaultdict(float, sums)
        acc.sums["n_samples"], acc.sums["n_skipped"] = len(kept), len(samples) - len(kept)
        acc.sums["tokens"] = acc.sums["tokens_run"] = sum(mb.n_tokens for mb in mbs)
        acc.sums["slots"] = sum(mb.n_slots for mb in mbs)
        return update.finish(self, acc, n_tok, len(mbs), t0)

    # ---------------------------------------------------------------- weights

    def weight_broadcaster(self) -> LocalBroadcaster:
        """Rank 0 of the distributed weight sync: this process (kernel.sync.push)."""
        return LocalBroadcaster(self)

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
        every rank must call it (the shards are gathered), global rank 0 writes."""
        from safetensors.torch import save_file

        out = Path(out_dir)
        state = {k: v.contiguous() for k, v in self.hf_state_dict().items()}
        if _global_rank() == 0:
            out.mkdir(parents=True, exist_ok=True)
            save_file(state, out / "model.safetensors", metadata={"format": "pt"})
            self.hf_config.save_pretrained(out)
            gen = Path(self.model_path) / "generation_config.json"
            if gen.exists():
                shutil.copy(gen, out / gen.name)
            load_tokenizer(self.model_path).save_pretrained(out)
        _barrier()
        return out

    # ---------------------------------------------------------------- checkpoints

    def _parallel_sizes(self) -> dict[str, int]:
        from megatron.core import parallel_state as ps

        return {
            "tensor_parallel": ps.get_tensor_model_parallel_world_size(),
            "pipeline_parallel": ps.get_pipeline_model_parallel_world_size(),
            "data_parallel": ps.get_data_parallel_world_size(),
        }

    def _shard_file(self, ckpt: Path, dp: bool = False) -> Path:
        from megatron.core import parallel_state as ps

        tp, pp = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
        if dp:
            return ckpt / f"optimizer_tp{tp}_pp{pp}_dp{self.rank}.pt"
        return ckpt / f"shard_tp{tp}_pp{pp}.pt"

    def save(self, out_dir: str | Path) -> Path:
        """A training checkpoint; every rank must call it.

        One file per (TP rank, PP rank), written by data-parallel rank 0 (the replicas hold
        the same): this rank's parameter shards, Adam state and schedule; under the distributed
        optimizer the Adam state goes to one file per data-parallel rank instead (each holds a
        shard). One RNG file per global rank. ``MANIFEST`` (the parallel sizes, the optimizer
        and the step) is written last, by global rank 0, so a checkpoint with one is complete.
        """
        from megatron.core.tensor_parallel import get_cuda_rng_tracker

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        optimizers = [o.state_dict() for o in self._torch_optimizers()]
        sharded_optimizer = self.cfg.optimizer == "distributed"
        if self.rank == 0:
            state = {
                "model": {k: p.detach().cpu() for k, p in self.module.named_parameters()},
                "optimizer": None if sharded_optimizer else optimizers,
                "scheduler": self.scheduler.state_dict(),
            }
            torch.save(state, self._shard_file(out))
        if sharded_optimizer:  # each data-parallel rank holds its own shard of the Adam state
            torch.save(optimizers, self._shard_file(out, dp=True))
        rng = {"torch": torch.get_rng_state(), "tracker": get_cuda_rng_tracker().get_states()}
        torch.save(rng, out / f"rng_rank{_global_rank()}.pt")
        _barrier()
        if _global_rank() == 0:
            manifest = {
                "format": MANIFEST_FORMAT,
                "step": self.step,
                "optimizer": self.cfg.optimizer,
                **self._parallel_sizes(),
            }
            (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
        _barrier()
        return out

    def load(self, ckpt_dir: str | Path) -> None:
        """Restore a checkpoint written by ``save``; every rank must call it.

        The tensor- and pipeline-parallel sizes and the optimizer must be the ones it was saved
        with (the files hold shards of that layout); the data-parallel size may differ (the
        replicas are equal), except under the distributed optimizer (its state is sharded).
        """
        from megatron.core.tensor_parallel import get_cuda_rng_tracker

        ckpt = Path(ckpt_dir)
        if not (ckpt / MANIFEST).exists():
            raise FileNotFoundError(
                f"{ckpt}: not a MegatronTrainer checkpoint (no {MANIFEST}; an unfinished save "
                "has none)"
            )
        manifest = json.loads((ckpt / MANIFEST).read_text())
        if manifest.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"{ckpt / MANIFEST}: format is not {MANIFEST_FORMAT!r}")
        if manifest["optimizer"] != self.cfg.optimizer:
            raise ValueError(
                f"{ckpt}: saved with optimizer={manifest['optimizer']!r}, this trainer uses "
                f"optimizer={self.cfg.optimizer!r}"
            )
        sharded_optimizer = self.cfg.optimizer == "distributed"
        for name, size in self._parallel_sizes().items():
            if (name != "data_parallel" or sharded_optimizer) and manifest[name] != size:
                raise ValueError(
                    f"{ckpt}: saved with {name}={manifest[name]}, this trainer runs "
                    f"{name}={size}; load it with the parallel sizes it was saved with (or "
                    "start from its weights through save_hf)"
                )
        state = torch.load(self._shard_file(ckpt), map_location="cpu", weights_only=True)
        params = dict(self.module.named_parameters())
        if set(params) != set(state["model"]):
            raise ValueError(
                f"{self._shard_file(ckpt)}: parameters differ from the model: missing "
                f"{sorted(set(params) - set(state['model']))}, unexpected "
                f"{sorted(set(state['model']) - set(params))}"
            )
        with torch.no_grad():
            for name, p in params.items():
                if p.shape != state["model"][name].shape:
                    raise ValueError(
                        f"{self._shard_file(ckpt)}: {name} has shape "
                        f"{tuple(state['model'][name].shape)}, the model {tuple(p.shape)}"
                    )
                p.copy_(state["model"][name])
        optimizers = state["optimizer"]
        if sharded_optimizer:
            optimizers = torch.load(self._shard_file(ckpt, dp=True), weights_only=True)
        for o, o_state in zip(self._torch_optimizers(), optimizers, strict=True):
            o.load_state_dict(o_state)
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = manifest["step"]
        rng_file = ckpt / f"rng_rank{_global_rank()}.pt"
        if rng_file.exists():  # absent when the data-parallel size changed
            rng = torch.load(rng_file, weights_only=True)
            torch.set_rng_state(rng["torch"])
            get_cuda_rng_tracker().set_states(rng["tracker"])
        _barrier()


MANIFEST, MANIFEST_FORMAT = "megatron_checkpoint.json", "tandem-megatron-v1"


def _global_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
