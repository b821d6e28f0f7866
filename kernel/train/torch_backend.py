"""The torch training backend: one HF causal LM, AdamW, the kernel's policy loss, FSDP2 for
data parallelism. The embedded default on CPU, and a single-node GPU backend.

One ``train_step`` is one optimiser update on a batch of samples:

1. Keep the trainable samples (status COMPLETED/TRUNCATED, an advantage, a masked token).
2. Group them into micro-batches by a token budget (``kernel.train.batching``: samples that
   share their prompt run it once -- the default --, else padded rows of similar length, or
   packed rows). Every rank runs the same number of micro-batches.
3. Per micro-batch: forward, logprobs of the response tokens at the rollout temperature,
   ``kernel.loss.policy_loss``, backward. Each micro-batch's loss is weighted by its share of
   the GLOBAL normaliser of the aggregation mode (masked tokens for token_mean, sequences with a
   masked token for seq_mean_*, 1 for seq_sum), counted over all ranks, times the world size
   that FSDP's average over ranks divides by; so the gradient equals that of one big batch on
   one rank, whatever the budget and the world size.
4. Clip the global gradient norm, AdamW step, learning-rate schedule.

Old logprobs: there is one update per step, so the parameters that would compute the old
logprobs in a separate pass before the update are the very parameters of the training forward.
The old logprobs are therefore that forward's logprobs, detached: the same numbers as
``compute_logprobs`` before the update (exactly, up to nondeterministic kernels), without a
third of the compute. The ratio is 1 in the loss and the update is exactly on-policy w.r.t. the
trainer; the engine's ``rollout_logprobs`` feed truncated importance sampling (``tis_cap``) and
the logged ``logprob_diff``.

Precision: parameters, gradients and AdamW state stay float32; ``optim.dtype="bfloat16"`` runs
forward and backward under bf16 autocast (pure bf16 weights would round lr=1e-6 updates away).

Data parallel: when torch.distributed is initialised with world size > 1, the model (and the
reference model) are sharded with FSDP2 ``fully_shard`` (runs on CPU over gloo and on GPUs over
NCCL), one unit per decoder layer. Each rank passes its own share of the samples to
``train_step`` (``kernel.train.batching.shard_samples`` splits a global batch evenly).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from kernel.loss import LossConfig, policy_loss
from kernel.models import load_causal_lm, load_tokenizer
from kernel.sample import Sample
from kernel.train.batching import (
    MicroBatch,
    collate,
    collate_shared,
    dummy_microbatch,
    plan_microbatches,
    plan_shared,
    to_rows,
)
from kernel.train.logprobs import entropy_from_logits, token_logprobs
from kernel.train.optim import OptimConfig, build_optimizer


@dataclass
class TorchTrainerConfig:
    """Torch training backend: micro-batching, packing, temperature, memory and device (the
    optimiser is set by OptimConfig, the loss by LossConfig)."""

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
    temperature: float = 1.0
    """The rollout sampling temperature: logits are divided by it before the softmax, so the
    trainer's logprobs are those of the distribution the engine sampled from."""
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
        if not 0.0 < self.temperature < math.inf:
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature}")
        if self.device != "auto" and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        return self


def _trainable(s: Sample) -> bool:
    return s.status.trainable and s.advantage is not None and any(s.loss_mask)


def _full_attention_cache(model) -> bool:
    """Whether every layer of the model's KV cache is plain full attention (a shared prompt's
    cache is copied per sample and continued; sliding-window or recurrent layers are not)."""
    from transformers import DynamicCache

    try:
        layers = DynamicCache(config=model.config).layers
    except Exception:  # a model without a standard cache
        return False
    return {type(layer).__name__ for layer in layers} == {"DynamicLayer"}


def _resolve_device(name: str, rank: int) -> torch.device:
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
    ):
        self._set_config(model_path, optim, loss, cfg, total_steps)
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if distributed else 0
        self.world_size = dist.get_world_size() if distributed else 1
        self.device = _resolve_device(cfg.device, self.rank)
        self.autocast_dtype = torch.bfloat16 if optim.dtype == "bfloat16" else None
        self.step = 0

        self.model = self._load(model_path)
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
            self.ref_model = self._load(model_path).eval().requires_grad_(False)
        if self.world_size > 1:
            self._shard(self.model)
            if self.ref_model is not None:
                self._shard(self.ref_model)

        self.optimizer, self.scheduler = build_optimizer(
            self.model.parameters(), optim, total_steps
        )

    # ---------------------------------------------------------------- set-up

    def _set_config(self, model_path, optim: OptimConfig, loss: LossConfig, cfg, total_steps):
        """Validate every section before anything is loaded, then keep them."""
        optim.validate()
        loss.validate()
        cfg.validate()
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {total_steps}")
        self.model_path, self.optim_cfg, self.loss_cfg, self.cfg = model_path, optim, loss, cfg

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

    def _autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """Sum (or max) of each value over ranks, as floats."""
        if self.world_size == 1:
            return [float(v) for v in values]
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return t.tolist()

    # ---------------------------------------------------------------- forward

    def _plan(self, samples: list[Sample]) -> list[MicroBatch]:
        """Micro-batches of ``samples``, padded with dummies to the most any rank runs."""
        budget, pack = self.cfg.max_tokens_per_microbatch, self.cfg.pack_sequences
        distinct = len({tuple(s.prompt_ids) for s in samples})
        if self.share_prompts and distinct < len(samples):  # some prompt is shared
            groups = plan_shared(samples, budget)
            mbs = [collate_shared([samples[i] for i in g], g) for g in groups]
        else:
            lengths = [len(s.prompt_ids) + s.response_length for s in samples]
            groups = plan_microbatches(lengths, budget, pack)
            mbs = [collate([samples[i] for i in g], g, pack) for g in groups]
        n = int(self._all_reduce([len(mbs)], op="max")[0])
        return mbs + [dummy_microbatch() for _ in range(n - len(mbs))]

    def _logits(self, model, mb: MicroBatch) -> Tensor:
        """Logits (N, V) at the N positions that predict a response token."""
        if mb.prompts is not None:
            return self._shared_logits(model, mb)
        dev = self.device
        with self._autocast():
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
        with self._autocast():
            out = model(
                input_ids=p.input_ids.to(dev),
                attention_mask=p.attention_mask.to(dev),
                position_ids=p.position_ids.to(dev),
                past_key_values=cache,
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
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=mb.keep.to(dev),
            )
        return torch.cat([first, out.logits])  # (N, V)

    def _forward(
        self, model, mb: MicroBatch, entropy: bool = False, entropy_grad: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Logprobs (S, R) of each sample's response tokens, and their entropy (S, R) if asked."""
        dev = self.device
        logits = self._logits(model, mb)  # (N, V)
        shape = tuple(mb.loss_mask.shape)
        index = (mb.seq.to(dev), mb.pos.to(dev))

        def per_sample(flat: Tensor) -> Tensor:  # (N,) -> (S, R), zeros past each response
            return flat.new_zeros(shape).index_put(index, flat)

        lp = per_sample(token_logprobs(logits, mb.targets.to(dev), self.cfg.temperature))
        ent = None
        if entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent = per_sample(entropy_from_logits(logits, self.cfg.temperature))
        return lp, ent

    @torch.no_grad()
    def compute_logprobs(self, samples: list[Sample]) -> list[list[float]]:
        """The policy's logprob of every response token of each sample (same order as given).

        Under data parallelism every rank must call it (with its own samples).
        """
        todo = [i for i, s in enumerate(samples) if s.response_length > 0]
        out: list[list[float]] = [[] for _ in samples]
        for mb in self._plan([samples[i] for i in todo]):
            lp, _ = self._forward(self.model, mb)
            for row, j in enumerate(mb.indices):
                n = samples[todo[j]].response_length
                out[todo[j]] = lp[row, :n].float().cpu().tolist()
        return out

    # ---------------------------------------------------------------- training

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        """One optimiser update on this rank's ``samples``; returns global metrics."""
        metrics = self.forward_backward(samples)
        if metrics["n_samples"] > 0:
            metrics.update(self.optim_step())
        return metrics

    def forward_backward(self, samples: list[Sample]) -> dict[str, float]:
        """Accumulate the gradient of the batch's loss into ``.grad`` (no optimiser step).

        Metrics: loss, the policy_loss metrics (pg_loss, ratio_mean, clip_frac, approx_kl, kl,
        entropy, tis_*), logprob_mean (trainer logprobs of the trained tokens), logprob_diff
        (mean |rollout - trainer| logprob, when rollout logprobs are given), n_samples,
        n_skipped, tokens (of the samples), tokens_run (the real tokens the model ran: fewer than
        tokens when prompts are shared), loss_tokens, n_microbatches, nonpad_frac (the share of
        micro-batch token slots holding real tokens) and time_s. All are over every rank.
        """
        t0 = time.perf_counter()
        kept, plan, n_tok, denom = self._begin(samples)
        sums: dict[str, float] = defaultdict(float)  # additive over micro-batches and ranks
        token_means: set[str] = {"logprob_mean"}  # of these, sums over masked tokens
        sums["n_samples"], sums["n_skipped"] = len(kept), len(samples) - len(kept)
        for i, mb in enumerate(plan):
            if self.world_size > 1:  # FSDP reduces the gradients after the last one only
                self.model.set_requires_gradient_sync(i == len(plan) - 1)
            lp, ent = self._forward(
                self.model, mb, entropy=True, entropy_grad=self.loss_cfg.entropy_coef > 0
            )
            ref = None
            if self.ref_model is not None:
                with torch.no_grad():
                    ref, _ = self._forward(self.ref_model, mb)
            self._microbatch_loss(mb, kept, lp, ent, ref, denom, sums, token_means).backward()
            sums["tokens"] += sum(
                len(kept[j].prompt_ids) + kept[j].response_length for j in mb.indices
            )
            sums["tokens_run"] += mb.n_tokens
            sums["slots"] += mb.n_slots
        return self._finish(sums, token_means, n_tok, len(plan), t0)

    def _begin(self, samples: list[Sample]) -> tuple[list[Sample], list, float, float]:
        """The trainable samples (validated), their micro-batch plan (empty when no rank has a
        token to train on), the global count of loss tokens and the loss normaliser."""
        lcfg = self.loss_cfg
        kept = [s.validate() for s in samples if _trainable(s)]
        if lcfg.tis_cap is not None:
            for s in kept:
                if s.rollout_logprobs is None:
                    raise ValueError(f"sample {s.key}: tis_cap is set but rollout_logprobs is None")
        plan = self._plan(kept)
        n_tok, n_seq = self._all_reduce([sum(sum(s.loss_mask) for s in kept), sum(1 for _ in kept)])
        denom = {"token_mean": n_tok, "seq_sum": 1.0}.get(lcfg.agg, n_seq)
        return kept, plan if n_tok > 0 else [], n_tok, denom

    def _microbatch_loss(
        self, mb, kept, lp: Tensor, ent: Tensor, ref, denom: float, sums: dict, token_means: set
    ) -> Tensor:
        """The policy loss of micro-batch ``mb`` from its logprobs ``lp`` and entropies ``ent``
        (S, R) (and the reference model's, ``ref``); adds its metric sums to ``sums``. Returns
        what to backpropagate: the loss times the micro-batch's share of the global normaliser,
        times the world size (FSDP and Megatron DDP average gradients over the ranks -- a divide
        factor of 1 would need PREMUL_SUM, which gloo lacks -- and the shares already make the
        global mean)."""
        lcfg = self.loss_cfg
        mb_samples = [kept[j] for j in mb.indices] or [None]  # None: a dummy row
        mask = mb.loss_mask.to(self.device)  # (S, R)
        adv = torch.tensor([s.advantage if s else 0.0 for s in mb_samples])  # (S,)
        rollout = to_rows(
            [s.rollout_logprobs if s and s.rollout_logprobs else [] for s in mb_samples],
            mb.max_response,
        ).to(self.device)  # (S, R)
        has_rollout = torch.tensor([bool(s and s.rollout_logprobs) for s in mb_samples])
        loss, m = policy_loss(
            lp,
            lp.detach(),
            adv.to(self.device),
            mask,
            lcfg,
            ref_logprobs=ref,
            entropy=ent,
            rollout_logprobs=rollout if lcfg.tis_cap is not None else None,
        )
        # The micro-batch's share of the global normaliser (seq_sum: every share is 1).
        count = {"token_mean": mask.sum(), "seq_sum": 1.0}.get(lcfg.agg, (mask.sum(-1) > 0).sum())
        weight = float(count) / denom
        with torch.no_grad():
            n_mask = float(mask.sum())
            sums["loss"] += float(loss) * weight
            sums["pg_loss"] += m.pop("pg_loss") * weight
            for k, v in m.items():  # masked-token means, turned back into sums
                sums[k] += v * n_mask
                token_means.add(k)
            old = lp.detach()  # (S, R)
            sums["logprob_mean"] += float((old * mask).sum())
            rmask = mask * has_rollout.to(self.device)[:, None]  # (S, R)
            sums["diff_sum"] += float(((rollout - old).abs() * rmask).sum())
            sums["diff_tokens"] += float(rmask.sum())
        return loss * (weight * self.world_size)

    def _finish(
        self, sums: dict, token_means: set, n_tok: float, n_microbatches: int, t0: float
    ) -> dict[str, float]:
        """forward_backward's metrics: ``sums`` summed over the ranks, token means divided by
        the loss tokens, logprob_diff and nonpad_frac derived."""
        keys = sorted(sums)
        total = dict(zip(keys, self._all_reduce([sums[k] for k in keys]), strict=True))
        diff_sum, diff_tokens = total.pop("diff_sum", 0.0), total.pop("diff_tokens", 0.0)
        slots = total.pop("slots", 0.0)
        out = {k: v / n_tok if k in token_means else v for k, v in total.items()}
        if diff_tokens > 0:
            out["logprob_diff"] = diff_sum / diff_tokens
        if slots > 0:
            out["nonpad_frac"] = out["tokens_run"] / slots
        out["loss_tokens"] = n_tok
        out["n_microbatches"] = float(n_microbatches)  # per rank, dummies included: the same
        out["time_s"] = time.perf_counter() - t0
        return out

    def optim_step(self) -> dict[str, float]:
        """Clip the gradient norm, step AdamW and the schedule, zero the gradients.

        A non-finite gradient norm skips the update (the gradients are dropped).
        """
        max_norm = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
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
        from kernel.sync.push import LocalBroadcaster

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

    def save_hf(self, out_dir: str | Path) -> Path:
        """Save an HF checkpoint (config, safetensors, tokenizer) that any engine can load."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        out = Path(out_dir)
        state = get_model_state_dict(self.model, options=self._options(cpu_offload=True))
        if self.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(out, state_dict=state)
            load_tokenizer(self.model_path).save_pretrained(out)
        self._barrier()
        return out

    def save(self, out_dir: str | Path) -> Path:
        """A training checkpoint: the HF checkpoint plus optimiser, schedule, step and RNG."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        out = self.save_hf(out_dir)
        optim_state = get_optimizer_state_dict(
            self.model, self.optimizer, options=self._options(cpu_offload=True)
        )
        if self.rank == 0:
            torch.save(
                {"optimizer": optim_state, "scheduler": self.scheduler.state_dict()},
                out / "optimizer.pt",
            )
            (out / "trainer_state.json").write_text(
                json.dumps({"step": self.step, "world_size": self.world_size})
            )
        rng = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        torch.save(rng, out / f"rng_rank{self.rank}.pt")
        self._barrier()
        return out

    def load(self, ckpt_dir: str | Path) -> None:
        """Restore a checkpoint written by ``save`` (any world size) into this trainer."""
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        ckpt = Path(ckpt_dir)
        files = sorted(ckpt.glob("*.safetensors"))
        if not files or not (ckpt / "optimizer.pt").exists():
            raise FileNotFoundError(
                f"{ckpt}: not a checkpoint written by TorchTrainer.save (needs *.safetensors "
                "and optimizer.pt)"
            )
        weights = {k: v for f in files for k, v in load_file(f).items()}
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
        rng_file = ckpt / f"rng_rank{self.rank}.pt"
        if rng_file.exists():
            rng = torch.load(rng_file, weights_only=True)
            torch.set_rng_state(rng["torch"])
            if "cuda" in rng and self.device.type == "cuda":
                torch.cuda.set_rng_state(rng["cuda"], self.device)
        self._barrier()

    def _barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()
