"""Tests for kernel/loss.py: aggregation values, gradient signs and clipping, dual clip, KL
estimators, entropy bonus, truncated importance sampling, masking, and shape errors.

Every expected number is worked out by hand in the test from the inputs, in float64.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernel.loss import LossConfig, aggregate, kl_penalty, policy_loss

F64 = torch.float64


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


def one_token(log_ratio: float, adv: float, cfg: LossConfig) -> tuple[float, float]:
    """Loss and d loss / d logprob for one token with the given log ratio and advantage."""
    lp = t([[log_ratio]]).requires_grad_()
    loss, _ = policy_loss(lp, t([[0.0]]), t([adv]), t([[1.0]]), cfg)
    loss.backward()
    return loss.item(), lp.grad.item()


# --- aggregation -------------------------------------------------------------------------------

X = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
M = [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
AGG_EXPECTED = {
    "token_mean": (1 + 2 + 4) / 3,  # masked tokens 1, 2 | 4
    "seq_mean_token_mean": ((1 + 2) / 2 + 4 / 1) / 2,  # 1.5 and 4 -> 2.75
    "seq_mean_token_sum": ((1 + 2) + 4) / 2,  # 3 and 4 -> 3.5
    "seq_sum": 1 + 2 + 4,
    "seq_mean_token_sum_norm": ((1 + 2) / 4 + 4 / 4) / 2,  # max_len = 4 -> 0.875
}


@pytest.mark.parametrize("agg", list(AGG_EXPECTED))
def test_aggregate_values(agg):
    assert aggregate(t(X), t(M), agg, max_len=4).item() == pytest.approx(AGG_EXPECTED[agg])


@pytest.mark.parametrize("agg", list(AGG_EXPECTED))
def test_policy_loss_values_per_agg(agg):
    # On policy (ratio 1) the PPO term is -A per token, so the loss is aggregate(-A).
    lp = t([[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.1]])
    loss, metrics = policy_loss(lp, lp.clone(), t(X), t(M), LossConfig(agg=agg, max_len=4))
    assert loss.item() == pytest.approx(-AGG_EXPECTED[agg])
    assert metrics["pg_loss"] == pytest.approx(-AGG_EXPECTED[agg])
    assert metrics["ratio_mean"] == pytest.approx(1.0)
    assert metrics["clipfrac"] == 0.0


def test_aggregate_row_means_skip_fully_masked_rows():
    x = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    m = t([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    # Rows 0 and 2 count; row 1 is empty and must not halve the mean.
    assert aggregate(x, m, "seq_mean_token_mean").item() == pytest.approx((1.5 + 7.0) / 2)
    assert aggregate(x, m, "seq_mean_token_sum").item() == pytest.approx((3.0 + 7.0) / 2)


def test_aggregate_ignores_nan_and_inf_in_padding():
    x = t([[1.0, math.nan], [4.0, math.inf]])
    m = torch.tensor([[True, False], [True, False]])
    assert aggregate(x, m, "token_mean").item() == pytest.approx(2.5)


def test_aggregate_needs_max_len_for_dr_grpo():
    with pytest.raises(ValueError, match="max_len"):
        aggregate(t(X), t(M), "seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="agg"):
        aggregate(t(X), t(M), "mean")


# --- gradients and clipping --------------------------------------------------------------------


def test_gradient_sign_follows_advantage():
    cfg = LossConfig()
    # loss = -A * r, d/d logprob = -A * r; at r = 1 that is -A.
    assert one_token(0.0, 1.0, cfg) == pytest.approx((-1.0, -1.0))
    assert one_token(0.0, -1.0, cfg) == pytest.approx((1.0, 1.0))
    # Inside the clip range, r = 1.1: loss -2 * 1.1, gradient -2 * 1.1.
    assert one_token(math.log(1.1), 2.0, cfg) == pytest.approx((-2.2, -2.2))


def test_clip_zeroes_gradient_only_on_the_advantage_side():
    cfg = LossConfig(clip_low=0.2, clip_high=0.2)
    # A > 0, r = 1.5 > 1.2: loss is -1 * 1.2, a constant -> gradient exactly 0.
    loss, grad = one_token(math.log(1.5), 1.0, cfg)
    assert loss == pytest.approx(-1.2) and grad == 0.0
    # A > 0, r = 0.5 < 0.8: max(-0.5, -0.8) = -0.5, unclipped, gradient -0.5.
    assert one_token(math.log(0.5), 1.0, cfg) == pytest.approx((-0.5, -0.5))
    # A < 0, r = 0.5 < 0.8: max(0.5, 0.8) = 0.8, a constant -> gradient 0.
    loss, grad = one_token(math.log(0.5), -1.0, cfg)
    assert loss == pytest.approx(0.8) and grad == 0.0
    # A < 0, r = 1.5 > 1.2: max(1.5, 1.2) = 1.5, unclipped, gradient 1.5.
    assert one_token(math.log(1.5), -1.0, cfg) == pytest.approx((1.5, 1.5))


def test_clip_higher_moves_the_right_edge_only():
    sym, dapo = LossConfig(0.2, 0.2), LossConfig(clip_low=0.2, clip_high=0.28)
    # r = 1.25 with A = 1: clipped at 1.2 symmetrically, inside 1.28 with clip-higher.
    assert one_token(math.log(1.25), 1.0, sym) == pytest.approx((-1.2, 0.0))
    assert one_token(math.log(1.25), 1.0, dapo) == pytest.approx((-1.25, -1.25))
    # r = 1.3 > 1.28: clipped at 1.28 with zero gradient.
    loss, grad = one_token(math.log(1.3), 1.0, dapo)
    assert loss == pytest.approx(-1.28) and grad == 0.0
    # The left edge stays at 0.8: A = -1, r = 0.75 clipped (0.8), r = 0.85 not.
    loss, grad = one_token(math.log(0.75), -1.0, dapo)
    assert loss == pytest.approx(0.8) and grad == 0.0
    assert one_token(math.log(0.85), -1.0, dapo) == pytest.approx((0.85, 0.85))


def test_dual_clip_caps_negative_advantage_loss():
    plain, dual = LossConfig(), LossConfig(dual_clip=3.0)
    # A = -2, r = 5: PPO gives max(10, 2 * 1.2) = 10; dual clip caps at -3 * -2 = 6, grad 0.
    assert one_token(math.log(5.0), -2.0, plain) == pytest.approx((10.0, 10.0))
    loss, grad = one_token(math.log(5.0), -2.0, dual)
    assert loss == pytest.approx(6.0) and grad == 0.0
    # A = -2, r = 2: 4 < 6, so the dual clip leaves it alone: loss 4, gradient 2 * 2.
    assert one_token(math.log(2.0), -2.0, dual) == pytest.approx((4.0, 4.0))
    # A > 0 is untouched by the dual clip: r = 5, A = 2 -> -2 * 1.2.
    assert one_token(math.log(5.0), 2.0, dual) == pytest.approx((-2.4, 0.0))


def test_clip_fractions_and_ratio_metrics():
    # Four tokens: clipped (A>0, r=1.5), unclipped (A>0, r=0.5), dual-clipped (A<0, r=5),
    # clipped (A<0, r=0.5); a fifth, clipped-looking token is masked out.
    lp = t([[math.log(1.5), math.log(0.5), math.log(5.0), math.log(0.5), math.log(9.0)]])
    adv = t([[1.0, 1.0, -1.0, -1.0, 1.0]])
    mask = t([[1, 1, 1, 1, 0]])
    _, m = policy_loss(lp, torch.zeros_like(lp), adv, mask, LossConfig(dual_clip=3.0))
    assert m["clipfrac"] == pytest.approx(2 / 4)
    assert m["dual_clipfrac"] == pytest.approx(1 / 4)
    assert m["ratio_mean"] == pytest.approx((1.5 + 0.5 + 5.0 + 0.5) / 4)
    assert m["ratio_max"] == pytest.approx(5.0)  # the masked token's r = 9 does not count
    # approx_kl = mean(r - 1 - log r) over the four tokens.
    want = sum(r - 1 - math.log(r) for r in (1.5, 0.5, 5.0, 0.5)) / 4
    assert m["approx_kl"] == pytest.approx(want)


# --- KL, entropy, TIS --------------------------------------------------------------------------

LOG_R = [0.5, -0.5, 0.0]  # log pi - log ref per token


@pytest.mark.parametrize(
    ("estimator", "per_token"),
    [
        ("k1", [0.5, -0.5, 0.0]),
        ("k2", [0.5 * 0.25, 0.5 * 0.25, 0.0]),
        ("k3", [math.exp(-0.5) - 1 + 0.5, math.exp(0.5) - 1 - 0.5, 0.0]),  # 0.10653, 0.14872
    ],
)
def test_kl_estimators(estimator, per_token):
    ref = t([[-1.0, -1.0, -1.0]])
    lp = (ref + t([LOG_R])).requires_grad_()
    assert kl_penalty(lp, ref, estimator)[0].tolist() == pytest.approx(per_token)
    # Zero advantage leaves only the KL term: loss = 0.1 * token mean of the estimate.
    cfg = LossConfig(kl_coef=0.1, kl_estimator=estimator)
    loss, m = policy_loss(lp, lp.detach(), t([0.0]), t([[1, 1, 1]]), cfg, ref_logprobs=ref)
    assert loss.item() == pytest.approx(0.1 * sum(per_token) / 3)
    assert m["kl"] == pytest.approx(sum(per_token) / 3)
    if estimator == "k3":
        # d k3 / d log_r = 1 - exp(-log_r)
        loss.backward()
        want = [0.1 * (1 - math.exp(-x)) / 3 for x in LOG_R]
        assert lp.grad[0].tolist() == pytest.approx(want)


def test_k3_is_never_negative_while_k1_can_be():
    log_r = torch.linspace(-5, 5, 101, dtype=F64).unsqueeze(0)  # (1, 101), includes 0
    k3 = kl_penalty(log_r, torch.zeros_like(log_r), "k3")
    # linspace's middle point is ~1e-16, not 0: the naive formula rounds to a negative there.
    assert (k3 >= 0).all()
    assert (k3[log_r.abs() > 1e-3] > 0).all()
    assert kl_penalty(t([[0.0]]), t([[0.0]]), "k3").item() == 0.0
    assert (kl_penalty(log_r, torch.zeros_like(log_r), "k1") < 0).any()


def test_entropy_bonus_lowers_the_loss():
    lp = t([[-1.0, -2.0]])
    ent = t([[1.0, 2.0]]).requires_grad_()
    cfg = LossConfig(entropy_coef=0.01)
    loss, m = policy_loss(lp, lp, t([0.0]), t([[1, 1]]), cfg, entropy=ent)
    assert loss.item() == pytest.approx(-0.01 * (1.0 + 2.0) / 2)
    assert m["entropy"] == pytest.approx(1.5)
    loss.backward()
    assert ent.grad[0].tolist() == pytest.approx([-0.01 / 2, -0.01 / 2])  # more entropy, less loss


def test_truncated_importance_sampling():
    lp = t([[-1.0, -1.0, -1.0]]).requires_grad_()
    rollout = lp.detach() - t([[math.log(0.5), math.log(1.5), math.log(4.0)]])
    cfg = LossConfig(tis_cap=2.0)
    loss, m = policy_loss(lp, lp.detach(), t([1.0]), t([[1, 1, 1]]), cfg, rollout_logprobs=rollout)
    w = [0.5, 1.5, 2.0]  # exp(old - rollout) = 0.5, 1.5, 4 -> capped at 2
    assert loss.item() == pytest.approx(-sum(w) / 3)  # pg = -A * r * w, r = 1, A = 1
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-x / 3 for x in w])  # the weight is detached
    assert m["tis_weight_mean"] == pytest.approx(sum(w) / 3)
    assert m["tis_clipfrac"] == pytest.approx(1 / 3)
    # Without a cap, rollout logprobs are ignored.
    no_cap = LossConfig()
    loss, m = policy_loss(lp, lp, t([1.0]), t([[1, 1, 1]]), no_cap, rollout_logprobs=rollout)
    assert loss.item() == pytest.approx(-1.0) and "tis_weight_mean" not in m


# --- masking -----------------------------------------------------------------------------------

FULL = LossConfig(
    dual_clip=3.0, kl_coef=0.1, entropy_coef=0.01, tis_cap=2.0, max_len=4, clip_high=0.28
)


def full_inputs(mask):
    lp = t([[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.1]]).requires_grad_()
    ent = t([[1.0, 0.5, 0.2], [0.3, 0.9, 1.2]]).requires_grad_()
    extra = {"ref_logprobs": lp.detach() - 0.3, "entropy": ent}
    extra["rollout_logprobs"] = lp.detach() + 0.2
    return lp, ent, (lp, lp.detach() - 0.1, t([1.0, -2.0]), t(mask)), extra


@pytest.mark.parametrize("agg", list(AGG_EXPECTED))
def test_all_zero_mask_gives_zero_loss_and_zero_gradient(agg):
    lp, ent, args, extra = full_inputs([[0, 0, 0], [0, 0, 0]])
    cfg = LossConfig(**{**FULL.__dict__, "agg": agg})
    loss, m = policy_loss(*args, cfg, **extra)
    loss.backward()
    assert loss.item() == 0.0
    assert (lp.grad == 0).all() and (ent.grad == 0).all()
    assert all(math.isfinite(v) for v in m.values())


def test_garbage_in_masked_positions_changes_nothing():
    mask = [[1, 1, 0], [1, 0, 0]]
    lp, ent, args, extra = full_inputs(mask)
    clean, m_clean = policy_loss(*args, FULL, **extra)
    clean.backward()

    pad = torch.tensor([[False, False, True], [False, True, True]])
    # Leaves that themselves hold the junk, so a NaN in the backward would reach their .grad.
    lp2 = lp.detach().masked_fill(pad, -math.inf).requires_grad_()  # padding is often -inf
    ent2 = ent.detach().masked_fill(pad, math.nan).requires_grad_()
    _, old, adv, msk = args
    dirty, m_dirty = policy_loss(
        lp2,
        old.masked_fill(pad, math.nan),
        adv.unsqueeze(-1).expand(2, 3).masked_fill(pad, math.nan),  # (B, T) form
        msk,
        FULL,
        ref_logprobs=extra["ref_logprobs"].masked_fill(pad, -math.inf),
        entropy=ent2,
        rollout_logprobs=extra["rollout_logprobs"].masked_fill(pad, math.inf),
    )
    dirty.backward()
    assert dirty.item() == pytest.approx(clean.item())
    assert m_dirty == pytest.approx(m_clean)
    for got, want in ((lp2.grad, lp.grad), (ent2.grad, ent.grad)):
        assert torch.isfinite(got).all()
        assert torch.allclose(got, want)
        assert (got[pad] == 0).all()
    assert (lp.grad[~pad] != 0).all()  # the check above is not comparing zeros with zeros


# --- errors ------------------------------------------------------------------------------------


def test_shape_errors_name_the_tensor():
    lp, mask = torch.zeros(2, 3), torch.ones(2, 3)
    cfg = LossConfig()
    with pytest.raises(ValueError, match=r"old_logprobs has shape \(2, 4\)"):
        policy_loss(lp, torch.zeros(2, 4), torch.zeros(2), mask, cfg)
    with pytest.raises(ValueError, match=r"loss_mask has shape \(3, 2\)"):
        policy_loss(lp, lp, torch.zeros(2), torch.ones(3, 2), cfg)
    with pytest.raises(ValueError, match=r"advantages has shape \(3,\)"):
        policy_loss(lp, lp, torch.zeros(3), mask, cfg)
    with pytest.raises(ValueError, match=r"logprobs must be \(B, T\), got shape \(6,\)"):
        policy_loss(torch.zeros(6), torch.zeros(6), torch.zeros(6), torch.ones(6), cfg)
    with pytest.raises(ValueError, match=r"entropy has shape \(2, 2\)"):
        policy_loss(lp, lp, torch.zeros(2), mask, cfg, entropy=torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"per_token \(2, 3\) and mask \(2,\)"):
        aggregate(lp, torch.ones(2))


def test_missing_inputs_for_enabled_terms():
    lp, mask, adv = torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(lp, lp, adv, mask, LossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(lp, lp, adv, mask, LossConfig(entropy_coef=0.1))
    with pytest.raises(ValueError, match="rollout_logprobs"):
        policy_loss(lp, lp, adv, mask, LossConfig(tis_cap=2.0))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("clip_low", 1.0),
        ("clip_low", -0.1),
        ("clip_high", -0.1),
        ("dual_clip", 1.0),
        ("agg", "mean"),
        ("max_len", 0),
        ("kl_coef", -1.0),
        ("kl_estimator", "k4"),
        ("entropy_coef", -0.1),
        ("tis_cap", 0.0),
    ],
)
def test_config_validate_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        LossConfig(**{field: value}).validate()
    LossConfig().validate()


def test_dr_grpo_needs_max_len():
    with pytest.raises(ValueError, match="max_len"):
        LossConfig(agg="seq_mean_token_sum_norm").validate()
