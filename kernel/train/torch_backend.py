"""The torch training backend: one HF causal LM, AdamW, the kernel's policy loss, FSDP2 for
data parallelism. The embedded default on CPU, and a single-node GPU backend.

One ``train_step`` trains on a step's batch of samples: ``ppo_epochs`` passes, each split
into ``num_minibatches`` shuffled mini-batches of one optimiser update each (one update by
default). Each update:

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

Old logprobs: with several updates per batch they are taken once, before the first update
(``loss.old_logprobs``: ``recompute`` with the current weights, or ``rollout``, the engine's),
so from the second update on the PPO ratio moves off 1 and the clip binds (``clipfrac``,
``ratio_mean``, ``ratio_max``, ``approx_kl``). With one update per batch the parameters that
would compute them in a separate pass are the very parameters of the training forward, so the
old logprobs are that forward's own, detached: the same numbers (up to nondeterministic
kernels) without a third of the compute; the ratio is then exactly 1. The engine's
``rollout_logprobs`` feed truncated importance sampling (``tis_cap``, or ``stale_tis_cap`` for
batches holding samples of older weights) and the logged ``logprob_diff``.

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
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from kernel.loss import LossConfig, policy_loss
from kernel.models import load_causal_lm, load_tokenizer
from kernel.sample import Sample
from kernel.sync.push import LocalBroadcaster
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
    num_minibatches: int = 1
    """Optimizer updates per epoch over a step's batch: the batch is shuffled (with ``seed``)
    and split into this many mini-batches, one update each. More than one update per batch
    (this or ppo_epochs > 1) makes the PPO ratio move off 1, so the clip can bind."""
    ppo_epochs: int = 1
    """Passes over a step's batch (each num_minibatches updates, reshuffled). The old
    logprobs of the ratio are taken once, before the first update (loss.old_logprobs)."""
    seed: int = 0
    """Seed of the mini-batch shuffling (the loop sets the run's seed)."""
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
        if self.num_minibatches < 1 or self.ppo_epochs < 1:
            raise ValueError(
                f"num_minibatches and ppo_epochs must be >= 1, got {self.num_minibatches} and "
                f"{self.ppo_epochs}"
            )
        if not 0.0 < self.temperature < math.inf:
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature}")
        if self.device != "auto" and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        return self


def _trainable(s: Sample) -> bool:
    return s.status.trainable and s.advantage is not None and any(s.loss_mask)


def _stale(s: Sample, version: int) -> bool:
    """Whether some token of ``s`` was sampled by weights older than ``version``."""
    return bool(s.weight_versions) and min(s.weight_versions) < version


def _split(items: list, n: int) -> list[list]:
    """``items`` in ``n`` contiguous parts whose sizes differ by at most one (some may be
    empty when there are fewer items than parts: every rank still runs n updates)."""
    size, extra = divmod(len(items), n)
    bounds = [i * size + min(i, extra) for i in range(n + 1)]
    return [items[bounds[i] : bounds[i + 1]] for i in range(n)]


def _aligned(samples: list[Sample], old: list[list[float]] | None) -> list | None:
    """``old`` (one list per sample) restricted to the trainable samples, in their order."""
    if old is None:
        return None
    if len(old) != len(samples):
        raise ValueError(f"old_logprobs has {len(old)} entries for {len(samples)} samples")
    return [o for s, o in zip(samples, old, strict=True) if _trainable(s)]


@dataclass
class _Totals:
    """forward_backward's metrics as they accumulate over micro-batches: additive sums, the
    keys among them that are masked-token sums, the largest ratio; and the old logprobs of the
    trainable samples (None: each forward's own)."""

    old: list[list[float]] | None = None
    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    token_means: set[str] = field(default_factory=lambda: {"logprob_mean"})
    ratio_max: float = 0.0


_WORK_SUMS = ("tokens_run", "n_microbatches", "time_s")  # the work of every update adds up


def _merge_updates(updates: list[dict[str, float]]) -> dict[str, float]:
    """One step's metrics from its updates' (in order): work summed, ratio_max the largest,
    lr and step the last, everything else the mean over the updates; ``n_updates`` counts
    them. (The batch's own counts, n_samples and tokens, are the caller's.)"""
    keys = {k for u in updates for k in u}
    out = {}
    for k in keys:
        values = [u[k] for u in updates if k in u]
        if k in _WORK_SUMS:
            out[k] = sum(values)
        elif k == "ratio_max":
            out[k] = max(values)
        elif k in ("lr", "step"):
            out[k] = values[-1]
        else:
            out[k] = sum(values) / len(values)
    out["n_updates"] = float(len(updates))
    return out


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
        self.last_updates: list[dict[str, float]] = []  # the last train_step's, per update

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

    def train_step(self, samples: list[Sample], version: int | None = None) -> dict[str, float]:
        """Train on this rank's ``samples``: ``ppo_epochs`` passes of ``num_minibatches``
        optimizer updates each (one update by default); returns global metrics.

        ``version`` is the weight version being trained: samples whose oldest token was sampled
        by an older one are stale, and with ``loss.tis_cap`` unset they get truncated importance
        sampling at ``loss.stale_tis_cap`` (metric ``stale_samples``).
        """
        cfg, lcfg = self.cfg, self.loss_cfg
        n_stale = self._all_reduce(
            [sum(version is not None and _stale(s, version) for s in samples)]
        )[0]
        tis = lcfg.stale_tis_cap if lcfg.tis_cap is None and n_stale else None  # None: config's
        if cfg.num_minibatches == 1 and cfg.ppo_epochs == 1 and lcfg.old_logprobs == "recompute":
            # One update: the old logprobs are this forward's own, detached (module docstring).
            metrics = self.forward_backward(samples, tis_cap=tis)
            stepped = metrics["n_samples"] > 0
            if stepped:
                metrics.update(self.optim_step())
            self.last_updates = [metrics] if stepped else []
            return metrics | {"n_updates": float(stepped), "stale_samples": n_stale}
        return self._ppo_updates(samples, tis) | {"stale_samples": n_stale}

    def _ppo_updates(self, samples: list[Sample], tis_cap: float | None) -> dict[str, float]:
        """``ppo_epochs`` shuffled passes of ``num_minibatches`` updates, every one against the
        old logprobs taken before the first; each update's own metrics stay in
        ``last_updates``."""
        cfg = self.cfg
        kept = [s for s in samples if _trainable(s)]
        old = self._old_logprobs(kept)  # before any update
        order = torch.Generator().manual_seed(cfg.seed * 1_000_003 + self.step)
        updates = []
        for _ in range(cfg.ppo_epochs):
            perm = list(range(len(kept)))  # one mini-batch: its order changes nothing
            if cfg.num_minibatches > 1:
                perm = torch.randperm(len(kept), generator=order).tolist()
            for part in _split(perm, cfg.num_minibatches):
                metrics = self.forward_backward(
                    [kept[i] for i in part], [old[i] for i in part], tis_cap=tis_cap
                )
                if metrics["n_samples"] > 0:  # global: every rank steps, or none does
                    metrics.update(self.optim_step())
                    updates.append(metrics)
        self.last_updates = updates
        counts = [
            len(kept),
            len(samples) - len(kept),
            sum(len(s.prompt_ids) + s.response_length for s in kept),
            sum(sum(s.loss_mask) for s in kept),
        ]
        n, skipped, tokens, n_tok = self._all_reduce(counts)
        out = _merge_updates(updates) | {"n_samples": n, "n_skipped": skipped}
        return out | {"tokens": tokens, "loss_tokens": n_tok}

    def _old_logprobs(self, kept: list[Sample]) -> list[list[float]]:
        """The old logprobs of the PPO ratio, per sample: the current weights' (recompute) or
        the engine's (rollout)."""
        if self.loss_cfg.old_logprobs == "recompute":
            return self.compute_logprobs(kept)
        missing = [s.key for s in kept if s.rollout_logprobs is None]
        if missing:
            raise ValueError(
                f"loss.old_logprobs is 'rollout' but sample(s) {missing[:3]} have no "
                "rollout_logprobs"
            )
        return [list(s.rollout_logprobs) for s in kept]

    def forward_backward(
        self,
        samples: list[Sample],
        old_logprobs: list[list[float]] | None = None,
        tis_cap: float | None = None,
    ) -> dict[str, float]:
        """Accumulate the gradient of the batch's loss into ``.grad`` (no optimiser step).

        ``old_logprobs`` (one list per sample, over its response tokens) are the PPO ratio's
        denominator; None: this forward's own logprobs, detached (ratio 1). ``tis_cap`` caps
        truncated importance sampling against the rollout logprobs (None: loss.tis_cap).

        Metrics: loss, the policy_loss metrics (pg_loss, ratio_mean, ratio_max, clipfrac,
        approx_kl, kl, entropy, tis_*), logprob_mean (trainer logprobs of the trained tokens),
        logprob_diff (mean |rollout - trainer| logprob, when rollout logprobs are given),
        n_samples, n_skipped, tokens (of the samples), tokens_run (the real tokens the model
        ran: fewer than tokens when prompts are shared), loss_tokens, n_microbatches,
        nonpad_frac (the share of micro-batch token slots holding real tokens) and time_s. All
        are over every rank.
        """
        t0 = time.perf_counter()
        kept, plan, n_tok, denom = self._begin(samples, tis_cap)
        acc = _Totals(old=_aligned(samples, old_logprobs))
        acc.sums["n_samples"], acc.sums["n_skipped"] = len(kept), len(samples) - len(kept)
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
            self._microbatch_loss(mb, kept, lp, ent, ref, denom, acc).backward()
            acc.sums["tokens"] += sum(
                len(kept[j].prompt_ids) + kept[j].response_length for j in mb.indices
            )
            acc.sums["tokens_run"] += mb.n_tokens
            acc.sums["slots"] += mb.n_slots
        return self._finish(acc, n_tok, len(plan), t0)

    def _begin(self, samples: list[Sample], tis_cap: float | None = None):
        """The trainable samples (validated), their micro-batch plan (empty when no rank has a
        token to train on), the global count of loss tokens and the loss normaliser; the loss
        config of this batch caps TIS at ``tis_cap`` (None: loss.tis_cap's)."""
        lcfg = self.loss_cfg
        if tis_cap is not None:
            lcfg = replace(lcfg, tis_cap=tis_cap)
        self._batch_loss = lcfg
        kept = [s.validate() for s in samples if _trainable(s)]
        if lcfg.tis_cap is not None:
            for s in kept:
                if s.rollout_logprobs is None:
                    raise ValueError(
                        f"sample {s.key}: tis_cap {lcfg.tis_cap} is set (TIS is on) but "
                        "rollout_logprobs is None"
                    )
        plan = self._plan(kept)
        n_tok, n_seq = self._all_reduce([sum(sum(s.loss_mask) for s in kept), sum(1 for _ in kept)])
        denom = {"token_mean": n_tok, "seq_sum": 1.0}.get(lcfg.agg, n_seq)
        return kept, plan if n_tok > 0 else [], n_tok, denom

    def _microbatch_loss(
        self, mb, kept, lp: Tensor, ent: Tensor, ref, denom: float, acc: _Totals
    ) -> Tensor:
        """The policy loss of micro-batch ``mb`` from its logprobs ``lp`` and entropies ``ent``
        (S, R) (and the reference model's, ``ref``); adds its metrics to ``acc``. Returns what
        to backpropagate: the loss times the micro-batch's share of the global normaliser,
        times the world size (FSDP and Megatron DDP average gradients over the ranks -- a divide
        factor of 1 would need PREMUL_SUM, which gloo lacks -- and the shares already make the
        global mean)."""
        lcfg, sums = self._batch_loss, acc.sums
        mb_samples = [kept[j] for j in mb.indices] or [None]  # None: a dummy row
        mask = mb.loss_mask.to(self.device)  # (S, R)
        adv = torch.tensor([s.advantage if s else 0.0 for s in mb_samples])  # (S,)
        rollout = to_rows(
            [s.rollout_logprobs if s and s.rollout_logprobs else [] for s in mb_samples],
            mb.max_response,
        ).to(self.device)  # (S, R)
        has_rollout = torch.tensor([bool(s and s.rollout_logprobs) for s in mb_samples])
        old = lp.detach()  # (S, R) one update per batch: this forward is the old policy
        if acc.old is not None:
            rows = [acc.old[j] for j in mb.indices] or [[]]
            old = to_rows(rows, mb.max_response).to(device=self.device, dtype=lp.dtype)
        loss, m = policy_loss(
            lp,
            old,
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
            acc.ratio_max = max(acc.ratio_max, m.pop("ratio_max"))
            for k, v in m.items():  # masked-token means, turned back into sums
                sums[k] += v * n_mask
                acc.token_means.add(k)
            current = lp.detach()  # (S, R)
            sums["logprob_mean"] += float((current * mask).sum())
            rmask = mask * has_rollout.to(self.device)[:, None]  # (S, R)
            sums["diff_sum"] += float(((rollout - current).abs() * rmask).sum())
            sums["diff_tokens"] += float(rmask.sum())
        return loss * (weight * self.world_size)

    def _finish(self, acc: _Totals, n_tok: float, n_microbatches: int, t0: float) -> dict:
        """forward_backward's metrics: the sums of ``acc`` summed over the ranks (ratio_max:
        the largest), token means divided by the loss tokens, logprob_diff and nonpad_frac
        derived."""
        keys = sorted(acc.sums)
        total = dict(zip(keys, self._all_reduce([acc.sums[k] for k in keys]), strict=True))
        diff_sum, diff_tokens = total.pop("diff_sum", 0.0), total.pop("diff_tokens", 0.0)
        slots = total.pop("slots", 0.0)
        out = {k: v / n_tok if k in acc.token_means else v for k, v in total.items()}
        if n_tok > 0:
            out["ratio_max"] = self._all_reduce([acc.ratio_max], op="max")[0]
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
