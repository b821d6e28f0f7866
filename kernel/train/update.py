"""The policy update both training backends run: plain functions over a ``Policy``, the few
things a backend provides (its model's logits, a reduction over its data-parallel ranks, an
optimiser step). ``TorchTrainer`` and ``MegatronTrainer`` each call them; neither inherits
from the other.

One ``train_step`` trains on a step's batch of samples: ``ppo_epochs`` passes, each split
into ``num_minibatches`` shuffled mini-batches of one optimiser update each (one update by
default). Each update:

1. Keep the trainable samples (status COMPLETED/TRUNCATED, an advantage, a masked token).
2. Group them into micro-batches by a token budget (``kernel.train.batching``: samples that
   share their prompt run it once -- where the backend can --, else padded rows of similar
   length, or packed rows). Every rank runs the same number of micro-batches.
3. Per micro-batch: forward, logprobs of the response tokens at the rollout temperature,
   ``kernel.loss.policy_loss``, backward. Each micro-batch's loss is weighted by its share of
   the GLOBAL normaliser of the aggregation mode (masked tokens for token_mean, sequences with a
   masked token for seq_mean_*, 1 for seq_sum), counted over all ranks, times the world size
   that FSDP's (and Megatron DDP's) average over ranks divides by; so the gradient equals that
   of one big batch on one rank, whatever the budget and the world size.
4. The backend's ``optim_step``: clip the global gradient norm, AdamW, learning-rate schedule.

Old logprobs: with several updates per batch they are taken once, before the first update
(``loss.old_logprobs``: ``recompute`` with the current weights, or ``rollout``, the engine's),
so from the second update on the PPO ratio moves off 1 and the clip binds (``clipfrac``,
``ratio_mean``, ``ratio_max``, ``approx_kl``). With one update per batch the parameters that
would compute them in a separate pass are the very parameters of the training forward, so the
old logprobs are that forward's own, detached: the same numbers (up to nondeterministic
kernels) without a third of the compute; the ratio is then exactly 1. The engine's
``rollout_logprobs`` feed truncated importance sampling (``tis_cap``, or ``stale_tis_cap`` for
batches holding samples of older weights) and the logged ``logprob_diff``.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from kernel.loss import LossConfig, policy_loss
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


class Policy(Protocol):
    """What the update asks of a training backend (one rank of it)."""

    model: Any
    """The trained model (its forward is the backend's ``logits``)."""
    ref_model: Any
    """The frozen reference of the KL term, or None."""
    device: torch.device
    world_size: int
    """Data-parallel ranks: each passes its own share of the samples."""
    loss_cfg: LossConfig
    temperature: float
    """The rollout sampling temperature: logits are divided by it before the softmax."""
    seed: int
    """Seed of the mini-batch shuffling."""
    share_prompts: bool
    """Whether a micro-batch may run a shared prompt once (``batching.plan_shared``)."""
    step: int
    """Optimiser updates made so far."""
    last_updates: list[dict[str, float]]
    """The last train_step's metrics, one dict per update."""
    cfg: Any
    """The backend's settings: max_tokens_per_microbatch, pack_sequences, num_minibatches,
    ppo_epochs."""

    def logits(self, model: Any, mb: MicroBatch) -> Tensor:
        """Logits (N, V) at the N positions of ``mb`` that predict a response token."""

    def all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """The sum (or max) of each value over the data-parallel ranks."""

    def grad_sync(self, last: bool) -> None:
        """Called before each micro-batch's backward; ``last``: the update's last one."""

    def optim_step(self) -> dict[str, float]:
        """Clip, step, zero the gradients; returns grad_norm, lr and step."""

    def forward_backward(
        self, samples: list[Sample], old: list[list[float]] | None, tis_cap: float | None
    ) -> dict[str, float]:
        """Accumulate the gradient of the samples' loss (``forward_backward`` below, or the
        backend's own schedule)."""

    def compute_logprobs(self, samples: list[Sample]) -> list[list[float]]:
        """Each sample's response-token logprobs under the current weights."""


def trainable(s: Sample) -> bool:
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


@dataclass
class Totals:
    """forward_backward's metrics as they accumulate over micro-batches: additive sums, the
    keys among them that are masked-token sums, the largest ratio; and the old logprobs of the
    trainable samples (None: each forward's own)."""

    old: list[list[float]] | None = None
    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    token_means: set[str] = field(default_factory=lambda: {"logprob_mean"})
    ratio_max: float = 0.0

    @classmethod
    def of(cls, samples: list[Sample], old: list[list[float]] | None) -> Totals:
        """Empty totals whose old logprobs are ``old`` (one list per sample) restricted to the
        trainable samples, in their order."""
        if old is not None:
            if len(old) != len(samples):
                raise ValueError(f"old_logprobs has {len(old)} entries for {len(samples)} samples")
            old = [o for s, o in zip(samples, old, strict=True) if trainable(s)]
        return cls(old=old)


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


def all_reduce(
    values: list[float], op: str, device: torch.device, world_size: int, group=None
) -> list[float]:
    """Sum (or max) of each value over the ``world_size`` ranks of ``group`` (None: all), as
    floats."""
    if world_size == 1:
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=group)
    return t.tolist()


def configure(
    p: Policy,
    model_path: str,
    optim: Any,
    loss: LossConfig,
    cfg: Any,
    total_steps: int,
    temperature: float,
    seed: int,
) -> None:
    """Validate a trainer's sections before anything is loaded (ValueError names the field),
    then keep them on the trainer ``p``: model_path, optim_cfg, loss_cfg, cfg, temperature,
    seed."""
    optim.validate()
    loss.validate()
    cfg.validate()
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if not 0.0 < temperature < math.inf:
        raise ValueError(
            f"temperature (the rollout's, which the trainer's logprobs divide the logits by) "
            f"must be a finite number > 0, got {temperature}"
        )
    p.model_path, p.optim_cfg, p.loss_cfg, p.cfg = model_path, optim, loss, cfg
    p.temperature, p.seed = temperature, seed


def autocast(device: torch.device, dtype: torch.dtype | None):
    """bf16 autocast for forward and backward when ``dtype`` is set (weights stay fp32)."""
    return nullcontext() if dtype is None else torch.autocast(device_type=device.type, dtype=dtype)


# ---------------------------------------------------------------- forward


def microbatches(p: Policy, samples: list[Sample]) -> list[MicroBatch]:
    """Micro-batches of ``samples``, padded with dummies to the most any rank runs."""
    budget, pack = p.cfg.max_tokens_per_microbatch, p.cfg.pack_sequences
    distinct = len({tuple(s.prompt_ids) for s in samples})
    if p.share_prompts and distinct < len(samples):  # some prompt is shared
        groups = plan_shared(samples, budget)
        mbs = [collate_shared([samples[i] for i in g], g) for g in groups]
    else:
        lengths = [len(s.prompt_ids) + s.response_length for s in samples]
        groups = plan_microbatches(lengths, budget, pack)
        mbs = [collate([samples[i] for i in g], g, pack) for g in groups]
    n = int(p.all_reduce([len(mbs)], op="max")[0])
    return mbs + [dummy_microbatch() for _ in range(n - len(mbs))]


def response_logprobs(
    p: Policy, logits: Tensor, mb: MicroBatch, entropy: bool = False, entropy_grad: bool = False
) -> tuple[Tensor, Tensor | None]:
    """From the logits (N, V) of ``mb``'s response positions: the logprobs (S, R) of each
    sample's response tokens at the policy's temperature, and their entropy (S, R) if asked."""
    dev = p.device
    shape = tuple(mb.loss_mask.shape)
    index = (mb.seq.to(dev), mb.pos.to(dev))

    def per_sample(flat: Tensor) -> Tensor:  # (N,) -> (S, R), zeros past each response
        return flat.new_zeros(shape).index_put(index, flat)

    lp = per_sample(token_logprobs(logits, mb.targets.to(dev), p.temperature))
    ent = None
    if entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = per_sample(entropy_from_logits(logits, p.temperature))
    return lp, ent


@torch.no_grad()
def compute_logprobs(p: Policy, samples: list[Sample]) -> list[list[float]]:
    """The policy's logprob of every response token of each sample (same order as given).
    Under data parallelism every rank must call it (with its own samples)."""
    todo = [i for i, s in enumerate(samples) if s.response_length > 0]
    out: list[list[float]] = [[] for _ in samples]
    for mb in microbatches(p, [samples[i] for i in todo]):
        lp, _ = response_logprobs(p, p.logits(p.model, mb), mb)
        for row, j in enumerate(mb.indices):
            n = samples[todo[j]].response_length
            out[todo[j]] = lp[row, :n].float().cpu().tolist()
    return out


# ---------------------------------------------------------------- training


def train_step(p: Policy, samples: list[Sample], version: int | None = None) -> dict[str, float]:
    """Train on this rank's ``samples``: ``ppo_epochs`` passes of ``num_minibatches``
    optimizer updates each (one update by default); returns global metrics.

    ``version`` is the weight version being trained: samples whose oldest token was sampled
    by an older one are stale, and with ``loss.tis_cap`` unset they get truncated importance
    sampling at ``loss.stale_tis_cap`` (metric ``stale_samples``).

    With a critic (``p.critic``, ``advantage.estimator: gae``; ``kernel.train.critic``) the
    samples' per-token advantages come from it first, it trains on the same mini-batch
    schedule, and the policy trains only once ``critic.num_critic_only_steps`` have passed. A
    critic ``shared`` with the actor adds its value loss to each policy update instead
    (``JointValueLoss``).
    """
    cfg, lcfg = p.cfg, p.loss_cfg
    critic_metrics: dict[str, float] = {}
    critic = getattr(p, "critic", None)
    joint = None
    if critic is not None:
        waits = critic.policy_waits
        step, critic_metrics = critic.advantages(samples)
        if critic.shared and not waits:
            joint = JointValueLoss(critic, step)
        else:
            critic_metrics |= critic.train(step, minibatch_schedule(p, len(step.samples)))
        if waits:
            p.last_updates = []
            return critic_metrics | {"n_updates": 0.0, "n_samples": 0.0}
    n_stale = p.all_reduce([sum(version is not None and _stale(s, version) for s in samples)])[0]
    tis = lcfg.stale_tis_cap if lcfg.tis_cap is None and n_stale else None  # None: config's
    if cfg.num_minibatches == 1 and cfg.ppo_epochs == 1 and lcfg.old_logprobs == "recompute":
        # One update: the old logprobs are this forward's own, detached (module docstring).
        if joint is not None:
            joint.backward(samples)
        out = p.forward_backward(samples, None, tis)
        stepped = _step(p, out, joint)
        p.last_updates = [out] if stepped else []
        out = out | {"n_updates": float(stepped)}
    else:
        out = _ppo_updates(p, samples, tis, joint)
    if joint is not None:  # the value updates ran with the policy's
        critic_metrics |= joint.summary()
    return out | critic_metrics | {"stale_samples": n_stale}


class JointValueLoss:
    """A shared critic's value loss joined to the policy's updates: before each update's
    policy backward, ``value_coef`` x the value loss of the same samples is back-propagated
    into the actor's body and the head; the actor's optimizer then steps on the summed
    gradient (the joint loss's), the head's own optimizer after it."""

    def __init__(self, critic: Any, step: Any):
        self.critic, self.step = critic, step
        self.index = {id(s): i for i, s in enumerate(step.samples)}
        self.updates: list[dict[str, float]] = []
        self.metrics: dict[str, float] = {}

    def backward(self, samples: list[Sample]) -> None:
        part = [self.index[id(s)] for s in samples if id(s) in self.index]
        self.metrics = self.critic.accumulate(self.step, part, self.critic.cfg.value_coef)

    def stepped(self) -> None:
        self.updates.append(self.metrics | {"grad_norm": self.critic.optimizer_step()})

    def summary(self) -> dict[str, float]:
        return self.critic.summary(self.step, self.updates)


def _step(p: Policy, metrics: dict[str, float], joint: JointValueLoss | None) -> bool:
    """The optimizer step of one update, when it trained on some sample (with a joint value
    loss: the head's step too; without a policy sample, the value gradient is dropped)."""
    stepped = metrics["n_samples"] > 0  # global: every rank steps, or none does
    if stepped:
        metrics.update(p.optim_step())
        if joint is not None:
            joint.stepped()
    elif joint is not None:
        p.optimizer.zero_grad(set_to_none=True)
        joint.critic.optimizer.zero_grad(set_to_none=True)
    return stepped


def minibatch_schedule(p: Policy, n: int) -> list[list[int]]:
    """The updates of a step over ``n`` samples, as index lists: ``ppo_epochs`` passes of
    ``num_minibatches`` contiguous parts of a seeded shuffle (no shuffle with one part: its
    order changes nothing)."""
    cfg = p.cfg
    order = torch.Generator().manual_seed(p.seed * 1_000_003 + p.step)
    parts = []
    for _ in range(cfg.ppo_epochs):
        perm = list(range(n))
        if cfg.num_minibatches > 1:
            perm = torch.randperm(n, generator=order).tolist()
        parts += _split(perm, cfg.num_minibatches)
    return parts


def _ppo_updates(
    p: Policy, samples: list[Sample], tis_cap: float | None, joint: JointValueLoss | None = None
) -> dict[str, float]:
    """``ppo_epochs`` shuffled passes of ``num_minibatches`` updates, every one against the
    old logprobs taken before the first; each update's own metrics stay in
    ``last_updates``."""
    kept = [s for s in samples if trainable(s)]
    old = _old_logprobs(p, kept)  # before any update
    updates = []
    for part in minibatch_schedule(p, len(kept)):
        if joint is not None:
            joint.backward([kept[i] for i in part])
        metrics = p.forward_backward([kept[i] for i in part], [old[i] for i in part], tis_cap)
        if _step(p, metrics, joint):
            updates.append(metrics)
    p.last_updates = updates
    counts = [
        len(kept),
        len(samples) - len(kept),
        sum(len(s.prompt_ids) + s.response_length for s in kept),
        sum(sum(s.loss_mask) for s in kept),
    ]
    n, skipped, tokens, n_tok = p.all_reduce(counts)
    out = _merge_updates(updates) | {"n_samples": n, "n_skipped": skipped}
    return out | {"tokens": tokens, "loss_tokens": n_tok}


def _old_logprobs(p: Policy, kept: list[Sample]) -> list[list[float]]:
    """The old logprobs of the PPO ratio, per sample: the current weights' (recompute) or
    the engine's (rollout)."""
    if p.loss_cfg.old_logprobs == "recompute":
        return p.compute_logprobs(kept)
    missing = [s.key for s in kept if s.rollout_logprobs is None]
    if missing:
        raise ValueError(
            f"loss.old_logprobs is 'rollout' but sample(s) {missing[:3]} have no rollout_logprobs"
        )
    return [list(s.rollout_logprobs) for s in kept]


def forward_backward(
    p: Policy,
    samples: list[Sample],
    old_logprobs: list[list[float]] | None = None,
    tis_cap: float | None = None,
) -> dict[str, float]:
    """Accumulate the gradient of the batch's loss into the parameters (no optimiser step).

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
    lcfg, kept, mbs, n_tok, denom = begin(p, samples, tis_cap)
    acc = Totals.of(samples, old_logprobs)
    acc.sums["n_samples"], acc.sums["n_skipped"] = len(kept), len(samples) - len(kept)
    entropy_grad = p.loss_cfg.entropy_coef > 0
    for i, mb in enumerate(mbs):
        p.grad_sync(i == len(mbs) - 1)
        lp, ent = response_logprobs(
            p, p.logits(p.model, mb), mb, entropy=True, entropy_grad=entropy_grad
        )
        ref = None
        if p.ref_model is not None:
            with torch.no_grad():
                ref, _ = response_logprobs(p, p.logits(p.ref_model, mb), mb)
        microbatch_loss(p, lcfg, mb, kept, lp, ent, ref, denom, acc).backward()
        acc.sums["tokens"] += sum(
            len(kept[j].prompt_ids) + kept[j].response_length for j in mb.indices
        )
        acc.sums["tokens_run"] += mb.n_tokens
        acc.sums["slots"] += mb.n_slots
    return finish(p, acc, n_tok, len(mbs), t0)


def begin(p: Policy, samples: list[Sample], tis_cap: float | None = None):
    """The loss config of this batch (TIS capped at ``tis_cap``; None: loss.tis_cap's), the
    trainable samples (validated), their micro-batches (empty when no rank has a token to
    train on), the global count of loss tokens and the loss normaliser."""
    lcfg = p.loss_cfg if tis_cap is None else replace(p.loss_cfg, tis_cap=tis_cap)
    kept = [s.validate() for s in samples if trainable(s)]
    if lcfg.tis_cap is not None:
        for s in kept:
            if s.rollout_logprobs is None:
                raise ValueError(
                    f"sample {s.key}: tis_cap {lcfg.tis_cap} is set (TIS is on) but "
                    "rollout_logprobs is None"
                )
    mbs = microbatches(p, kept)
    n_tok, n_seq = p.all_reduce([sum(sum(s.loss_mask) for s in kept), len(kept)])
    denom = {"token_mean": n_tok, "seq_sum": 1.0}.get(lcfg.agg, n_seq)
    return lcfg, kept, mbs if n_tok > 0 else [], n_tok, denom


def microbatch_loss(
    p: Policy,
    lcfg: LossConfig,
    mb: MicroBatch,
    kept: list[Sample],
    lp: Tensor,
    ent: Tensor,
    ref: Tensor | None,
    denom: float,
    acc: Totals,
) -> Tensor:
    """The policy loss of micro-batch ``mb`` from its logprobs ``lp`` and entropies ``ent``
    (S, R) (and the reference model's, ``ref``); adds its metrics to ``acc``. Returns what
    to backpropagate: the loss times the micro-batch's share of the global normaliser,
    times the world size (FSDP and Megatron DDP average gradients over the ranks -- a divide
    factor of 1 would need PREMUL_SUM, which gloo lacks -- and the shares already make the
    global mean)."""
    sums, dev = acc.sums, p.device
    mb_samples = [kept[j] for j in mb.indices] or [None]  # None: a dummy row
    mask = mb.loss_mask.to(dev)  # (S, R)
    if any(s and isinstance(s.advantage, list) for s in mb_samples):  # per token (gae)
        adv = to_rows([s.advantage if s else [] for s in mb_samples], mb.max_response)  # (S, R)
    else:
        adv = torch.tensor([s.advantage if s else 0.0 for s in mb_samples])  # (S,)
    rollout = to_rows(
        [s.rollout_logprobs if s and s.rollout_logprobs else [] for s in mb_samples],
        mb.max_response,
    ).to(dev)  # (S, R)
    has_rollout = torch.tensor([bool(s and s.rollout_logprobs) for s in mb_samples])
    old = lp.detach()  # (S, R) one update per batch: this forward is the old policy
    if acc.old is not None:
        rows = [acc.old[j] for j in mb.indices] or [[]]
        old = to_rows(rows, mb.max_response).to(device=dev, dtype=lp.dtype)
    loss, m = policy_loss(
        lp,
        old,
        adv.to(dev),
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
        rmask = mask * has_rollout.to(dev)[:, None]  # (S, R)
        sums["diff_sum"] += float(((rollout - current).abs() * rmask).sum())
        sums["diff_tokens"] += float(rmask.sum())
    return loss * (weight * p.world_size)


def finish(p: Policy, acc: Totals, n_tok: float, n_microbatches: int, t0: float) -> dict:
    """forward_backward's metrics: the sums of ``acc`` summed over the ranks (ratio_max:
    the largest), token means divided by the loss tokens, logprob_diff and nonpad_frac
    derived."""
    keys = sorted(acc.sums)
    total = dict(zip(keys, p.all_reduce([acc.sums[k] for k in keys]), strict=True))
    diff_sum, diff_tokens = total.pop("diff_sum", 0.0), total.pop("diff_tokens", 0.0)
    slots = total.pop("slots", 0.0)
    out = {k: v / n_tok if k in acc.token_means else v for k, v in total.items()}
    if n_tok > 0:
        out["ratio_max"] = p.all_reduce([acc.ratio_max], op="max")[0]
    if diff_tokens > 0:
        out["logprob_diff"] = diff_sum / diff_tokens
    if slots > 0:
        out["nonpad_frac"] = out["tokens_run"] / slots
    out["loss_tokens"] = n_tok
    out["n_microbatches"] = float(n_microbatches)  # per rank, dummies included: the same
    out["time_s"] = time.perf_counter() - t0
    return out
