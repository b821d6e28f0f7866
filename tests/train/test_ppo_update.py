"""The PPO update schedule both trainers run (kernel/train/update.py): several mini-batch
updates per batch against old logprobs taken once, the clip decision token by token, the
metrics, and TIS for stale samples. Tiny real model, CPU."""

from __future__ import annotations

import math

import pytest
import torch

from kernel.loss import LossConfig
from kernel.train import update
from kernel.train.optim import OptimConfig
from kernel.train.settings import TorchTrainerConfig
from kernel.train.torch_backend import TorchTrainer

LR = 5e-3  # large on purpose: one update moves the ratios of the next beyond a small clip


@pytest.fixture(params=["torch", "megatron"])
def trainer(request, char_model_dir):
    """``trainer(loss=None, seed=0, **trainer_cfg)`` builds a trainer of the backend under test
    on the tiny char model (Megatron: one process, TP=1, over gloo); every one is closed after."""
    made = []
    if request.param == "megatron":
        pytest.importorskip("megatron.core")
        from kernel.train.megatron_backend import MegatronTrainer
        from kernel.train.settings import MegatronTrainerConfig

        cls, cfg_cls = MegatronTrainer, MegatronTrainerConfig
    else:
        cls, cfg_cls = TorchTrainer, TorchTrainerConfig

    def make(loss: LossConfig | None = None, seed: int = 0, **cfg):
        torch.manual_seed(0)
        t = cls(
            char_model_dir,
            OptimConfig(lr=LR),
            loss or LossConfig(),
            cfg_cls(max_tokens_per_microbatch=64, **cfg),
            total_steps=10,
            seed=seed,
        )
        made.append(t)
        return t

    yield make
    for t in reversed(made):  # the first Megatron trainer set up the parallel state
        t.close()


def params(t) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in t.named_parameters_for_sync()}


def test_one_minibatch_one_epoch_through_the_ppo_path_equals_the_single_update(
    trainer, make_samples
):
    samples = make_samples(12, seed=3)
    fast = trainer()
    fast.train_step(samples)  # today's update: old logprobs = the forward's own, detached
    general = trainer()
    # old logprobs recomputed first, then one update
    m = update._ppo_updates(general, samples, None)
    assert m["n_updates"] == 1 and m["n_samples"] == 12
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and m["clipfrac"] == 0.0
    expected = params(fast)
    for name, p in params(general).items():
        torch.testing.assert_close(p, expected[name], rtol=0, atol=1e-7, msg=name)


def test_two_epochs_match_a_hand_computed_second_update(trainer, make_samples):
    samples = make_samples(12, seed=4)
    loss = LossConfig(clip_low=0.02, clip_high=0.02)
    t = trainer(loss, ppo_epochs=2)
    old = t.compute_logprobs(samples)  # before any update (as the trainer takes them)
    metrics = t.train_step(samples)
    assert metrics["n_updates"] == 2 and len(t.last_updates) == 2
    first, second = t.last_updates

    # The first update is on-policy: ratio 1, nothing clipped.
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and first["clipfrac"] == 0.0
    # The second runs on the weights after one update: the same update made by hand.
    ref = trainer(loss, ppo_epochs=1)
    ref.train_step(samples)
    new = ref.compute_logprobs(samples)
    pg_sum = clipped = n = 0.0
    ratios = []
    for s, o, lp in zip(samples, old, new, strict=True):
        for k, on in enumerate(s.loss_mask):
            if not on:
                continue
            r = math.exp(lp[k] - o[k])
            a = s.advantage
            surr, surr_clip = -a * r, -a * min(max(r, 1 - 0.02), 1 + 0.02)
            pg_sum += max(surr, surr_clip)
            clipped += surr_clip > surr  # the clip set this token's loss: its gradient is 0
            ratios.append(r)
            n += 1
    assert clipped > 0  # the case is one where the clip binds
    assert second["pg_loss"] == pytest.approx(pg_sum / n, rel=1e-4, abs=1e-6)  # token_mean
    # one token is 1/n ~ 0.017 of it: float32 sums blur the fraction by ~1e-8, never a token
    assert second["clipfrac"] == pytest.approx(clipped / n, abs=1e-6)
    assert second["ratio_mean"] == pytest.approx(sum(ratios) / n, rel=1e-5)
    assert second["ratio_max"] == pytest.approx(max(ratios), rel=1e-5)
    assert second["approx_kl"] > 0
    # the step's metrics: the mean over the updates, ratio_max the largest, work summed
    assert metrics["clipfrac"] == pytest.approx((first["clipfrac"] + second["clipfrac"]) / 2)
    assert metrics["ratio_max"] == pytest.approx(max(first["ratio_max"], second["ratio_max"]))
    assert metrics["time_s"] == pytest.approx(first["time_s"] + second["time_s"])
    assert metrics["n_samples"] == 12 and metrics["step"] == 2


def test_minibatches_split_the_batch_and_shuffle_with_the_seed(trainer, make_samples):
    samples = make_samples(10, seed=5)
    a = trainer(num_minibatches=3, seed=7)
    m = a.train_step(samples)
    assert m["n_updates"] == 3 and m["step"] == 3
    assert sorted(u["n_samples"] for u in a.last_updates) == [3, 3, 4]
    assert m["n_samples"] == 10 and m["tokens"] == sum(
        len(s.prompt_ids) + s.response_length for s in samples
    )
    b = trainer(num_minibatches=3, seed=7)
    b.train_step(samples)
    for name, p in params(b).items():  # the same seed: the same mini-batches, the same update
        torch.testing.assert_close(p, params(a)[name], rtol=0, atol=0, msg=name)
    c = trainer(num_minibatches=3, seed=8)
    c.train_step(samples)
    assert any(not torch.equal(p, params(a)[n]) for n, p in params(c).items())


def test_old_logprobs_from_the_rollout(trainer, make_samples):
    samples = make_samples(8, seed=6)
    t = trainer(LossConfig(old_logprobs="rollout"))
    m = t.train_step(samples)  # one update, ratio against the engine's logprobs: not 1
    assert m["n_updates"] == 1 and abs(m["ratio_mean"] - 1.0) > 1e-3
    samples[2].rollout_logprobs = None
    with pytest.raises(ValueError, match="old_logprobs is 'rollout'"):
        t.train_step(samples)


def test_stale_samples_get_tis_and_fresh_ones_do_not(trainer, make_samples):
    samples = make_samples(8, seed=7)
    for s in samples:
        s.weight_versions = [3]
    t = trainer()
    fresh = t.train_step(samples, version=3)
    assert fresh["stale_samples"] == 0 and "tis_weight_mean" not in fresh
    samples[0].weight_versions = [2]  # sampled one version behind the trained weights
    stale = t.train_step(samples, version=3)
    assert stale["stale_samples"] == 1
    # TIS at loss.stale_tis_cap over the batch: the rollout logprobs (~log 1/100) are not
    # the trainer's, so the weights are not 1
    assert stale["tis_weight_mean"] != pytest.approx(1.0, abs=1e-3)
    off = trainer(LossConfig(stale_tis_cap=None))
    assert "tis_weight_mean" not in off.train_step(samples, version=3)


def test_update_schedule_settings_are_validated(trainer):
    with pytest.raises(ValueError, match="ppo_epochs must be >= 1"):
        trainer(ppo_epochs=0)
    with pytest.raises(ValueError, match="old_logprobs must be"):
        trainer(LossConfig(old_logprobs="engine"))
    with pytest.raises(ValueError, match="stale_tis_cap must be None or a finite number > 0"):
        trainer(LossConfig(stale_tis_cap=0.0))
