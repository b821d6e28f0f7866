"""Tests for kernel/train/torch_backend.py on a tiny real model (CPU, float32 unless said).

Gradient accumulation and packing are checked against a plain reference computation written
out here (one right-padded batch, one forward, kernel.loss.policy_loss, one backward), so the
trainer's micro-batching, weighting and packing must reproduce it to float rounding.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from kernel.loss import AGG_MODES, LossConfig, policy_loss
from kernel.sample import Sample, Status
from kernel.train.logprobs import entropy_from_logits, token_logprobs
from kernel.train.optim import OptimConfig
from kernel.train.settings import TorchTrainerConfig
from kernel.train.torch_backend import TorchTrainer

TEMPERATURE = 0.7


def params(trainer: TorchTrainer) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in trainer.named_parameters_for_sync()}


def reference_grads(model_dir, samples: list[Sample], cfg: LossConfig) -> dict[str, torch.Tensor]:
    """Gradient of the loss on one right-padded batch of the trainable samples, no trainer."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    kept = [s for s in samples if s.status.trainable and s.advantage is not None]
    seqs = [s.prompt_ids + s.response_ids for s in kept]
    width, r_max = max(map(len, seqs)), max(s.response_length for s in kept)
    ids = torch.tensor([x + [0] * (width - len(x)) for x in seqs])  # (B, L)
    attn = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in seqs])  # (B, L)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]  # (B, L-1, V)
    lp_all = token_logprobs(logits, ids[:, 1:], TEMPERATURE)  # (B, L-1)
    ent_all = entropy_from_logits(logits, TEMPERATURE)  # (B, L-1)

    def responses(x):  # (B, L-1) -> (B, R): response token k is predicted at P - 1 + k
        rows = [x[i, len(s.prompt_ids) - 1 :][: s.response_length] for i, s in enumerate(kept)]
        return torch.stack([F.pad(row, (0, r_max - len(row))) for row in rows])

    lp = responses(lp_all)
    pad = lambda v: v + [0.0] * (r_max - len(v))  # noqa: E731
    loss, _ = policy_loss(
        lp,
        lp.detach(),
        torch.tensor([s.advantage for s in kept]),
        torch.tensor([pad(s.loss_mask) for s in kept]),
        cfg,
        entropy=responses(ent_all),
        rollout_logprobs=torch.tensor([pad(s.rollout_logprobs) for s in kept]),
    )
    loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}


def with_untrainable(samples: list[Sample]) -> list[Sample]:
    """The batch plus samples the trainer must skip: no advantage, failed, nothing masked."""
    extra = [Sample(**{**vars(s), "metadata": {}}) for s in samples[:3]]
    extra[0].advantage = None
    extra[1].status = Status.FAILED
    extra[2].loss_mask = [0] * extra[2].response_length
    return samples + extra


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("pack", [False, True])
def test_microbatched_gradient_equals_one_big_batch(char_model_dir, make_samples, agg, pack):
    samples = make_samples(10, seed=1)
    cfg = LossConfig(agg=agg, max_len=16, tis_cap=1.05, entropy_coef=0.01)
    expected = reference_grads(char_model_dir, samples, cfg)
    # A budget of 30 tokens splits the 10 sequences (3 to 26 tokens) into micro-batches of
    # different sizes, so a wrong per-micro-batch weight changes the gradient.
    trainer = TorchTrainer(
        char_model_dir,
        OptimConfig(),
        cfg,
        TorchTrainerConfig(max_tokens_per_microbatch=30, pack_sequences=pack),
        total_steps=1,
        temperature=0.7,
    )
    m = trainer.forward_backward(with_untrainable(samples))
    assert m["n_microbatches"] >= 4 and m["n_samples"] == 10 and m["n_skipped"] == 3
    assert m["tis_clipfrac"] > 0  # the TIS cap is active on some tokens
    scale = max(float(g.abs().max()) for g in expected.values())
    for name, p in trainer.model.named_parameters():
        # Float rounding of sums taken in another order: 1e-5 of the largest gradient entry.
        torch.testing.assert_close(
            p.grad, expected[name], rtol=1e-4, atol=1e-5 * scale, msg=lambda m, n=name: f"{n}: {m}"
        )


def grouped(samples: list[Sample], n: int) -> list[Sample]:
    """The samples with every run of ``n`` given the prompt of its first (a prompt group)."""
    for i, s in enumerate(samples):
        s.prompt_ids = list(samples[i - i % n].prompt_ids)
    return samples


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("budget", [10_000, 40])
def test_shared_prompts_give_the_gradient_of_whole_samples(
    char_model_dir, make_samples, agg, budget
):
    """Groups of 4 share a prompt: each prompt runs once, its KV cache continued by every
    response (budget 40 also splits groups over micro-batches). The gradient, logprobs and loss
    are those of the plain one-batch computation; far fewer tokens run."""
    samples = grouped(make_samples(12, seed=7), 4)
    cfg = LossConfig(agg=agg, max_len=16, tis_cap=1.05, entropy_coef=0.01)
    expected = reference_grads(char_model_dir, samples, cfg)
    runs = {}
    for share in (True, False):
        tcfg = TorchTrainerConfig(share_prompts=share, max_tokens_per_microbatch=budget)
        trainer = TorchTrainer(char_model_dir, OptimConfig(), cfg, tcfg, 1, temperature=0.7)
        assert trainer.share_prompts is share
        runs[share] = (trainer.forward_backward(samples), trainer.compute_logprobs(samples))
        if share:
            scale = max(float(g.abs().max()) for g in expected.values())
            for name, p in trainer.model.named_parameters():
                torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-5 * scale)
    (shared, lp_shared), (whole, lp_whole) = runs[True], runs[False]
    assert (
        shared["tokens"]
        == whole["tokens"]
        == sum(len(s.prompt_ids) + s.response_length for s in samples)
    )
    assert shared["tokens_run"] < whole["tokens_run"]  # each prompt ran once (per micro-batch)
    assert shared["loss"] == pytest.approx(whole["loss"], abs=1e-6)
    flat = lambda rows: torch.tensor([x for r in rows for x in r])  # noqa: E731
    torch.testing.assert_close(flat(lp_shared), flat(lp_whole), rtol=0, atol=1e-5)


def test_gradient_checkpointing_gives_the_same_gradient(char_model_dir, make_samples):
    samples = make_samples(5, seed=5)
    grads = []
    for checkpointing in (False, True):
        cfg = TorchTrainerConfig(gradient_checkpointing=checkpointing)
        trainer = TorchTrainer(char_model_dir, OptimConfig(), LossConfig(), cfg, total_steps=1)
        assert trainer.model.is_activation_checkpointing == checkpointing
        trainer.forward_backward(samples)
        grads.append({n: p.grad for n, p in trainer.model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logprobs_equal_unpacked(char_model_dir, make_samples, attn):
    samples = make_samples(9, seed=2)

    def logprobs(pack: bool, budget: int) -> list[float]:
        cfg = TorchTrainerConfig(
            max_tokens_per_microbatch=budget, pack_sequences=pack, attn_implementation=attn
        )
        trainer = TorchTrainer(char_model_dir, OptimConfig(), LossConfig(), cfg, total_steps=1)
        return [x for row in trainer.compute_logprobs(samples) for x in row]

    alone = logprobs(pack=False, budget=1)  # one sequence per micro-batch, no padding at all
    packed = logprobs(pack=True, budget=10_000)  # all nine in one row
    padded = logprobs(pack=False, budget=10_000)
    assert len(alone) == sum(s.response_length for s in samples)
    torch.testing.assert_close(torch.tensor(packed), torch.tensor(alone), rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.tensor(padded), torch.tensor(alone), rtol=0, atol=1e-5)


def test_a_step_raises_the_logprob_of_positive_advantage_and_lowers_negative(char_model_dir):
    good = Sample(prompt_ids=[5, 6, 7], response_ids=[10, 11, 12], loss_mask=[1, 1, 1])
    bad = Sample(prompt_ids=[5, 6, 7], response_ids=[20, 21, 22], loss_mask=[1, 1, 1])
    good.advantage, bad.advantage = 1.0, -0.5
    good.status = bad.status = Status.COMPLETED
    trainer = TorchTrainer(
        char_model_dir, OptimConfig(lr=1e-3), LossConfig(), TorchTrainerConfig(), total_steps=1
    )
    before = [sum(x) for x in trainer.compute_logprobs([good, bad])]
    m = trainer.train_step([good, bad])
    after = [sum(x) for x in trainer.compute_logprobs([good, bad])]
    assert after[0] > before[0] and after[1] < before[1]
    # Ratio 1 on the first update: per-token loss -A, token mean (-1 * 3 + 0.5 * 3) / 6.
    assert m["loss"] == pytest.approx(-0.25, abs=1e-6)
    assert m["pg_loss"] == pytest.approx(-0.25, abs=1e-6)
    assert (m["tokens"], m["loss_tokens"], m["lr"]) == (12, 6, 1e-3)
    assert m["logprob_mean"] == pytest.approx(sum(before) / 6, abs=1e-5)
    assert m["grad_norm"] > 0 and m["nonpad_frac"] == 1.0


def test_kl_to_the_reference_model(char_model_dir, make_samples):
    samples = make_samples(6, seed=3)
    loss = LossConfig(kl_coef=0.5, kl_estimator="k3")
    trainer = TorchTrainer(
        char_model_dir, OptimConfig(lr=1e-2), loss, TorchTrainerConfig(), total_steps=3
    )
    ref = trainer.compute_logprobs(samples)  # the policy still equals the reference
    m0 = trainer.train_step(samples)
    assert m0["kl"] == pytest.approx(0.0, abs=1e-7)

    pol = trainer.compute_logprobs(samples)
    # k3 with log r = pol - ref: exp(ref - pol) - 1 + (pol - ref), mean over masked tokens.
    k3 = [
        math.exp(r - p) - 1 + (p - r)
        for s, rs, ps in zip(samples, ref, pol, strict=True)
        for m, r, p in zip(s.loss_mask, rs, ps, strict=True)
        if m
    ]
    expected = sum(k3) / len(k3)
    assert expected > 1e-4  # the first step did move the policy
    for s in samples:
        s.advantage = 0.0  # only the KL term pulls now
    m1 = trainer.train_step(samples)
    assert m1["kl"] == pytest.approx(expected, rel=1e-4)
    assert m1["loss"] == pytest.approx(0.5 * expected, rel=1e-4)
    m2 = trainer.train_step(samples)
    assert m2["kl"] < m1["kl"]  # the KL step pulled the policy back towards the reference


def test_bf16_training(char_model_dir, make_samples):
    samples = make_samples(6, seed=4)
    fp32 = TorchTrainer(char_model_dir, OptimConfig(), LossConfig(), TorchTrainerConfig(), 1)
    bf16 = TorchTrainer(
        char_model_dir,
        OptimConfig(lr=1e-2, dtype="bfloat16"),
        LossConfig(),
        TorchTrainerConfig(),
        1,
    )
    lp32 = torch.tensor([x for r in fp32.compute_logprobs(samples) for x in r])
    lp16 = torch.tensor([x for r in bf16.compute_logprobs(samples) for x in r])
    assert not torch.equal(lp16, lp32)  # bf16 autocast is really on
    torch.testing.assert_close(lp16, lp32, rtol=0, atol=0.05)
    before = params(bf16)
    m = bf16.train_step(samples)
    assert all(math.isfinite(v) for v in m.values())
    after = params(bf16)
    assert all(t.dtype == torch.float32 for t in after.values())  # fp32 master weights
    assert any(not torch.equal(before[n], after[n]) for n in after)


def test_checkpoint_round_trip_continues_like_not_stopping(char_model_dir, make_samples, tmp_path):
    batches = [make_samples(6, seed=10 + k) for k in range(3)]
    optim = OptimConfig(lr=1e-2, warmup_steps=1, decay="cosine", weight_decay=0.1)
    cfg = TorchTrainerConfig(max_tokens_per_microbatch=40)

    def trainer():
        return TorchTrainer(char_model_dir, optim, LossConfig(), cfg, total_steps=5)

    straight = trainer()
    for b in batches:
        last = straight.train_step(b)

    first = trainer()
    for b in batches[:2]:
        first.train_step(b)
    first.save(tmp_path / "ckpt")
    resumed = trainer()
    resumed.load(tmp_path / "ckpt")
    assert resumed.step == 2
    for n, t in params(first).items():
        torch.testing.assert_close(params(resumed)[n], t, rtol=0, atol=0)
    m = resumed.train_step(batches[2])
    assert m["lr"] == last["lr"] and m["lr"] != optim.lr  # the schedule went on from step 2
    for n, t in params(straight).items():
        torch.testing.assert_close(params(resumed)[n], t, rtol=0, atol=1e-7, msg=n)

    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    for n, t in params(first).items():
        torch.testing.assert_close(dict(hf.named_parameters())[n], t, rtol=0, atol=0)


def test_untrainable_batch_changes_nothing(char_model_dir, make_samples):
    trainer = TorchTrainer(
        char_model_dir, OptimConfig(lr=1e-2), LossConfig(), TorchTrainerConfig(), 1
    )
    samples = make_samples(2)
    samples[0].advantage = None
    samples[1].status = Status.ABORTED
    before = params(trainer)
    m = trainer.train_step(samples)
    assert (m["n_samples"], m["n_skipped"], trainer.step) == (0, 2, 0)
    assert all(torch.equal(before[n], t) for n, t in params(trainer).items())


def test_tis_without_rollout_logprobs_names_the_sample(char_model_dir, make_samples):
    trainer = TorchTrainer(
        char_model_dir, OptimConfig(), LossConfig(tis_cap=2.0), TorchTrainerConfig(), 1
    )
    with pytest.raises(ValueError, match=r"sample g0/e0/default/t0: tis_cap"):
        trainer.train_step(make_samples(2, rollout=False))


@pytest.mark.parametrize(("field", "value"), [("max_tokens_per_microbatch", 0), ("device", "tpu")])
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TorchTrainerConfig(**{field: value}).validate()


def test_a_greedy_temperature_is_refused_before_the_model_loads(char_model_dir):
    with pytest.raises(ValueError, match=r"temperature \(the rollout's.*> 0, got 0.0"):
        TorchTrainer(char_model_dir, OptimConfig(), LossConfig(), TorchTrainerConfig(), 1, 0.0)


def test_a_runs_trainer_takes_its_agents_rollout_temperature(tmp_path, make_samples):
    """One source per fact: the trainer a run builds (runtime.place_trainer) divides the
    logits by the temperature its agent samples at (here an agent override, 0.7), so its
    logprobs are those of the engine's distribution, not of temperature 1."""
    from pathlib import Path

    from kernel.cli import train_config
    from kernel.run.runtime import place_trainer, plan_models

    agents = '[{"name": "default", "rollout": {"temperature": 0.7}}]'
    toy = Path(__file__).resolve().parents[2] / "kernel" / "presets" / "toy.yaml"
    cfg = train_config([f"--config={toy}", f"--output_dir={tmp_path}", f"--agents={agents}"])
    (model,) = plan_models(cfg.plan(), tmp_path, {})
    trainer = place_trainer(cfg, model, None)
    samples = make_samples(3, seed=2)
    got = trainer.compute_logprobs(samples)
    hf = AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32)
    for s, lp in zip(samples, got, strict=True):
        ids = torch.tensor([s.prompt_ids + s.response_ids])  # (1, L)
        logits = hf(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1]  # (R, V)
        targets = torch.tensor(s.response_ids)
        at = {t: token_logprobs(logits, targets, t) for t in (0.7, 1.0)}
        torch.testing.assert_close(torch.tensor(lp), at[0.7], rtol=1e-4, atol=1e-5)
        assert (at[1.0] - at[0.7]).abs().max() > 1e-3  # temperature 1 would be told apart


def test_a_checkpoint_of_another_architecture_is_named(char_model_dir, tiny_model_dir, tmp_path):
    """Resuming a trainer from another model's checkpoint fails naming the checkpoint."""
    other = TorchTrainer(
        str(tiny_model_dir), OptimConfig(), LossConfig(), TorchTrainerConfig(), total_steps=5
    )
    other.save(tmp_path / "other")
    mine = TorchTrainer(
        char_model_dir, OptimConfig(), LossConfig(), TorchTrainerConfig(), total_steps=5
    )
    with pytest.raises(ValueError, match=r"other: .*do not match the model"):
        mine.load(tmp_path / "other")
