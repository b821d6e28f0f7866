"""Policy loss per token: PPO clipped surrogate (asymmetric and dual clip), KL to a reference,
entropy bonus, truncated importance sampling, and the aggregation of tokens into one scalar.

Pure torch, no model code: the trainer computes logprobs (and entropy) for the response tokens
and hands them here together with the numbers collected at rollout time. Both training backends
call this one function, so the loss the torch and Megatron backends optimise is the same.

Every input is per token, shape (B, T), where T indexes response positions and ``loss_mask``
(0/1) marks the agent's own sampled tokens. Masked-out positions may hold anything (padding,
-inf, NaN): they are selected away with ``torch.where`` (never multiplied by 0, which keeps a
NaN), so they contribute nothing to the loss, its gradient, or the metrics. Only ``logprobs``
and ``entropy`` carry gradient; the old, reference and rollout logprobs and the advantages are
detached.

Sign conventions, with ``log_r = logprobs - old_logprobs`` and ``r = exp(log_r)``:

- PPO: ``pg = max(-A * r, -A * clamp(r, 1 - clip_low, 1 + clip_high))``.
- Dual clip (Ye et al. 2020), for A < 0 only: ``pg = min(pg, -dual_clip * A)``, which bounds
  the loss of a token whose ratio has run far above 1 on a negative advantage.
- Truncated importance sampling: ``pg *= w``, ``w = min(exp(old_logprobs - rollout_logprobs),
  tis_cap)``, detached. It corrects for the rollout engine's logprobs differing from the
  trainer's (different kernels, precision) or for rollouts one weight version behind.
- KL to the reference, with ``log_r = logprobs - ref_logprobs`` (r = pi / pi_ref), the tokens
  sampled from pi: k1 = log_r, k2 = 0.5 * log_r**2, k3 = exp(-log_r) - 1 + log_r (Schulman,
  "Approximating KL divergence"; k3 is unbiased for KL(pi || pi_ref) and never negative).
  ``loss += kl_coef * kl``.
- Entropy bonus: ``loss -= entropy_coef * entropy``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

Tensor = Any
"""A ``torch.Tensor``. torch is imported in the functions that compute, so the CLI reads this
module's config for its flags without waiting for it; not imported for the annotation, even
under TYPE_CHECKING, whose blocks the CLI's parser runs (kernel/buffer.py's ``Dataset``)."""

AggMode = Literal[
    "token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_sum", "seq_mean_token_sum_norm"
]
AGG_MODES: tuple[str, ...] = AggMode.__args__
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")


@dataclass
class LossConfig:
    """How the per-token policy loss is built and aggregated."""

    clip_low: float = 0.2
    """PPO clip below 1: the ratio is clamped at 1 - clip_low."""
    clip_high: float = 0.2
    """PPO clip above 1: the ratio is clamped at 1 + clip_high (DAPO clip-higher: e.g. 0.28)."""
    dual_clip: float | None = None
    """Dual-clip bound c > 1: for A < 0 the loss is capped at -c * A (e.g. 3.0); None: off."""
    agg: AggMode = "token_mean"
    """How tokens become one scalar: token_mean, seq_mean_token_mean, seq_mean_token_sum,
    seq_sum, or seq_mean_token_sum_norm (Dr.GRPO: token sum / max_len, mean over sequences)."""
    max_len: int | None = None
    """Constant normaliser for agg=seq_mean_token_sum_norm, usually the max response length."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the reference policy; 0 turns it off."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator: k1 (log r), k2 (0.5 log^2 r) or k3 (1/r - 1 + log r), r = pi / pi_ref."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss); 0 turns it off."""
    tis_cap: float | None = None
    """Truncated importance sampling cap C on exp(old - rollout logprobs); None: off (but see
    stale_tis_cap)."""
    stale_tis_cap: float | None = 2.0
    """The TIS cap used when tis_cap is None and a training batch holds samples rolled out by
    weights older than the ones it trains (a frozen or slower agent's kept rollouts, async
    mode); None: no TIS for them either."""
    old_logprobs: Literal["recompute", "rollout"] = "recompute"
    """Where the PPO ratio's old logprobs come from when a batch takes several updates
    (trainer.num_minibatches or trainer.ppo_epochs > 1): recompute (the trainer's current
    weights, once, before the first update) or rollout (the engine's sampled logprobs, as
    slime allows). With one update per batch they are that update's own forward, detached."""

    def validate(self) -> None:
        """Raise ValueError naming the first field with a bad value."""
        if not 0.0 <= self.clip_low < 1.0:
            raise ValueError(f"clip_low must be in [0, 1), got {self.clip_low}")
        if not 0.0 <= self.clip_high < math.inf:
            raise ValueError(f"clip_high must be a finite number >= 0, got {self.clip_high}")
        if self.dual_clip is not None and not 1.0 < self.dual_clip < math.inf:
            raise ValueError(f"dual_clip must be None or a finite number > 1, got {self.dual_clip}")
        if self.agg not in AGG_MODES:
            raise ValueError(f"agg must be one of {AGG_MODES}, got {self.agg!r}")
        if self.max_len is not None and self.max_len <= 0:
            raise ValueError(f"max_len must be None or > 0, got {self.max_len}")
        if self.agg == "seq_mean_token_sum_norm" and self.max_len is None:
            raise ValueError("max_len must be set when agg='seq_mean_token_sum_norm'")
        if not 0.0 <= self.kl_coef < math.inf:
            raise ValueError(f"kl_coef must be a finite number >= 0, got {self.kl_coef}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}"
            )
        if not 0.0 <= self.entropy_coef < math.inf:
            raise ValueError(f"entropy_coef must be a finite number >= 0, got {self.entropy_coef}")
        for name in ("tis_cap", "stale_tis_cap"):
            cap = getattr(self, name)
            if cap is not None and not 0.0 < cap < math.inf:
                raise ValueError(f"{name} must be None or a finite number > 0, got {cap}")
        if self.old_logprobs not in ("recompute", "rollout"):
            raise ValueError(
                f"old_logprobs must be 'recompute' or 'rollout', got {self.old_logprobs!r}"
            )


def aggregate(
    per_token: Tensor, mask: Tensor, agg: str = "token_mean", max_len: int | None = None
) -> Tensor:
    """Reduce a (B, T) per-token loss to a scalar over the tokens where ``mask`` is 1.

    token_mean: sum over all masked tokens / their count (long answers weigh more).
    seq_mean_token_mean: each row's token mean, then the mean over rows.
    seq_mean_token_sum: each row's token sum, then the mean over rows.
    seq_sum: the sum over all masked tokens (no normalisation).
    seq_mean_token_sum_norm: each row's token sum / max_len, then the mean over rows (Dr.GRPO).

    The "mean over rows" counts only rows with at least one masked token, so a failed sample that
    is masked out entirely does not dilute the others. An all-zero mask gives 0, not NaN.
    """
    import torch

    if per_token.dim() != 2 or per_token.shape != mask.shape:
        raise ValueError(
            f"per_token {tuple(per_token.shape)} and mask {tuple(mask.shape)} must both be (B, T)"
        )
    mask = mask.to(per_token.dtype)
    # where, not multiply: 0 * inf or 0 * NaN at a padded position would poison the sum.
    x = torch.where(mask != 0, per_token * mask, torch.zeros_like(per_token))  # (B, T)
    if agg == "token_mean":
        return x.sum() / mask.sum().clamp(min=1.0)
    if agg == "seq_sum":
        return x.sum()
    row_tokens = mask.sum(dim=-1)  # (B,)
    if agg == "seq_mean_token_mean":
        per_row = x.sum(dim=-1) / row_tokens.clamp(min=1.0)  # (B,)
    elif agg == "seq_mean_token_sum":
        per_row = x.sum(dim=-1)  # (B,)
    elif agg == "seq_mean_token_sum_norm":
        if max_len is None or max_len <= 0:
            raise ValueError(f"max_len must be > 0 for agg='{agg}', got {max_len}")
        per_row = x.sum(dim=-1) / max_len  # (B,)
    else:
        raise ValueError(f"agg must be one of {AGG_MODES}, got {agg!r}")
    n_rows = (row_tokens > 0).sum().clamp(min=1)
    return per_row.sum() / n_rows


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token KL(pi || pi_ref) estimate from tokens sampled from pi; log r = log pi - log ref."""
    import torch

    log_r = logprobs - ref_logprobs  # (B, T)
    if estimator == "k1":
        return log_r
    if estimator == "k2":
        return 0.5 * log_r.square()
    if estimator == "k3":
        # expm1 and the clamp: near log_r = 0 the naive exp(-x) - 1 + x rounds below zero.
        return (torch.expm1(-log_r) + log_r).clamp(min=0.0)
    raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def _check_shapes(logprobs: Tensor, advantages: Tensor, others: dict[str, Tensor | None]) -> None:
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be (B, T), got shape {tuple(logprobs.shape)}")
    bt = tuple(logprobs.shape)
    for name, t in others.items():
        if t is not None and tuple(t.shape) != bt:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but logprobs has shape {bt}; both must be "
                "(B, T)"
            )
    if tuple(advantages.shape) not in ((bt[0],), bt):
        raise ValueError(
            f"advantages has shape {tuple(advantages.shape)}; with logprobs of shape {bt} it "
            f"must be ({bt[0]},) or {bt}"
        )


def _check_inputs(
    logprobs: Tensor, advantages: Tensor, others: dict[str, Tensor | None], cfg: LossConfig
) -> None:
    """Raise ValueError for a tensor of the wrong shape, or for one ``cfg`` needs but lacks."""
    _check_shapes(logprobs, advantages, others)
    if cfg.kl_coef > 0 and others["ref_logprobs"] is None:
        raise ValueError("ref_logprobs is required when kl_coef > 0")
    if cfg.entropy_coef > 0 and others["entropy"] is None:
        raise ValueError("entropy is required when entropy_coef > 0")
    if cfg.tis_cap is not None and others["rollout_logprobs"] is None:
        raise ValueError("rollout_logprobs is required when tis_cap is set")


def _masked(t: Tensor, on: Tensor) -> Tensor:
    """``t`` with zeros where ``on`` is False, both (B, T)."""
    import torch

    # Zeroing the inputs (not just the outputs) keeps inf/NaN padding out of the backward.
    return torch.where(on, t, torch.zeros_like(t))


@dataclass
class _PolicyTerm:
    """The policy term per token and what the metrics read of it; every tensor (B, T)."""

    log_ratio: Tensor  # logprobs - old_logprobs, masked
    ratio: Tensor  # exp(log_ratio)
    pg: Tensor  # the clipped surrogate (dual-clipped, TIS-weighted when on)
    clipped: Tensor  # bool: the PPO clip set the loss
    dual_clipped: Tensor | None  # bool: the dual clip did; None when off
    tis_w: Tensor | None  # the TIS weight, capped; None when off
    tis_raw: Tensor | None  # the TIS weight before the cap; None when off


def _policy_term(
    logprobs: Tensor,
    old_logprobs: Tensor,
    adv: Tensor,
    on: Tensor,
    cfg: LossConfig,
    rollout_logprobs: Tensor | None,
) -> _PolicyTerm:
    """PPO's clipped surrogate per token (asymmetric clip, then the dual clip for A < 0), times
    the truncated importance weight when ``cfg.tis_cap`` is set. ``adv``: (B, T), masked."""
    import torch

    log_ratio = _masked(logprobs - old_logprobs.detach(), on)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    surr = -adv * ratio  # (B, T)
    surr_clipped = -adv * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)  # (B, T)
    pg = torch.maximum(surr, surr_clipped)  # (B, T)
    clipped = on & (surr_clipped > surr)  # (B, T)
    dual_clipped = None
    if cfg.dual_clip is not None:
        bound = -cfg.dual_clip * adv  # (B, T)
        dual_clipped = on & (adv < 0) & (pg > bound)  # (B, T)
        pg = torch.where(adv < 0, torch.minimum(pg, bound), pg)  # (B, T)

    tis_w = tis_raw = None
    if cfg.tis_cap is not None:
        assert rollout_logprobs is not None
        log_w = _masked(old_logprobs.detach() - rollout_logprobs.detach(), on)  # (B, T)
        tis_raw = torch.exp(log_w)  # (B, T)
        tis_w = tis_raw.clamp(max=cfg.tis_cap)  # (B, T)
        pg = pg * tis_w
    return _PolicyTerm(log_ratio, ratio, pg, clipped, dual_clipped, tis_w, tis_raw)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    cfg: LossConfig,
    *,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    rollout_logprobs: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The scalar loss to minimise, and metrics as python floats.

    Shapes: ``advantages`` is (B,) (one per sequence, broadcast over tokens) or (B, T); all other
    tensors are (B, T). ``ref_logprobs`` is needed when ``cfg.kl_coef > 0``, ``entropy`` when
    ``cfg.entropy_coef > 0``, ``rollout_logprobs`` when ``cfg.tis_cap`` is set; given otherwise,
    they only feed the metrics (rollout_logprobs is then ignored).

    Metrics: pg_loss (the policy term, TIS-weighted, aggregated like the loss); ratio_mean and
    ratio_max (over masked tokens);
    clipfrac (fraction of masked tokens where the PPO clip set the loss, so their gradient is 0);
    dual_clipfrac (same for the dual clip, when on); approx_kl (KL(old || new), k3 estimator);
    kl (mean reference KL with cfg.kl_estimator, when ref_logprobs given); entropy (when given);
    tis_weight_mean and tis_clipfrac (when TIS is on). All but pg_loss and ratio_max are masked
    token means.
    """
    import torch

    cfg.validate()
    others = {
        "old_logprobs": old_logprobs,
        "loss_mask": loss_mask,
        "ref_logprobs": ref_logprobs,
        "entropy": entropy,
        "rollout_logprobs": rollout_logprobs,
    }
    _check_inputs(logprobs, advantages, others, cfg)

    on = loss_mask != 0  # (B, T)
    mask = loss_mask.to(logprobs.dtype)  # (B, T)
    adv = advantages.detach().to(logprobs.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand_as(logprobs)  # (B,) -> (B, T)
    adv = _masked(adv, on)  # (B, T)
    term = _policy_term(logprobs, old_logprobs, adv, on, cfg, rollout_logprobs)

    per_token = term.pg  # (B, T)
    kl = None
    if ref_logprobs is not None:
        kl = kl_penalty(_masked(logprobs, on), _masked(ref_logprobs.detach(), on), cfg.kl_estimator)
        if cfg.kl_coef > 0:
            per_token = per_token + cfg.kl_coef * kl
    if entropy is not None and cfg.entropy_coef > 0:
        per_token = per_token - cfg.entropy_coef * entropy

    loss = aggregate(per_token, mask, cfg.agg, cfg.max_len)
    with torch.no_grad():
        metrics = _loss_metrics(term, kl, entropy, on, mask, cfg)
    return loss, metrics


def _loss_metrics(
    term: _PolicyTerm,
    kl: Tensor | None,
    entropy: Tensor | None,
    on: Tensor,
    mask: Tensor,
    cfg: LossConfig,
) -> dict[str, float]:
    """policy_loss's metrics (its docstring names them); ``on`` and ``mask``: (B, T)."""
    import torch

    n = mask.sum().clamp(min=1.0)

    def mean(t: Tensor) -> float:
        return float((_masked(t, on) * mask).sum() / n)

    ratio = term.ratio
    metrics = {
        "pg_loss": float(aggregate(term.pg, mask, cfg.agg, cfg.max_len)),
        "ratio_mean": mean(ratio),
        "ratio_max": float(torch.where(on, ratio, torch.zeros_like(ratio)).max())
        if bool(on.any())
        else 0.0,
        "clipfrac": mean(term.clipped.to(mask.dtype)),
        # KL(old || new) from tokens sampled by old: rho = new/old, k3 = rho - 1 - log rho.
        "approx_kl": mean(ratio - 1.0 - term.log_ratio),
    }
    if term.dual_clipped is not None:
        metrics["dual_clipfrac"] = mean(term.dual_clipped.to(mask.dtype))
    if kl is not None:
        metrics["kl"] = mean(kl)
    if entropy is not None:
        metrics["entropy"] = mean(entropy)
    if term.tis_w is not None and term.tis_raw is not None:
        metrics["tis_weight_mean"] = mean(term.tis_w)
        metrics["tis_clipfrac"] = mean((term.tis_raw > cfg.tis_cap).to(mask.dtype))
    return metrics
