"""Tests for kernel/train/megatron_backend.py under data and pipeline parallelism, with
Megatron's own optimizers, and across checkpoints. Every layout must reproduce one
single-process run (TP=1, PP=1, DP=1, torch AdamW) of two steps on the same batches.

- Data parallel: two gloo processes (TP=1, so DP=2) each train their ``shard_samples`` share;
  the shares differ in tokens and micro-batches (one rank runs a dummy micro-batch), so the
  globally counted normaliser and Megatron DDP's gradient average are both exercised; with
  torch AdamW and with Megatron's distributed optimizer (Adam state sharded over the ranks).
- Pipeline parallel: PP=2 through Megatron's 1F1B schedule, with torch AdamW and Megatron's
  optimizer.
- Megatron's optimizer (get_megatron_optimizer) in one process equals torch AdamW.
- Checkpoints: save after step 1, load into a fresh trainer, and step 2 must equal the
  uninterrupted run's step 2 within 1e-6, for every layout and optimizer above and TP=2. A
  checkpoint of another layout or optimizer is refused, naming what differs.

Multi-process cases launch this file as a script: ``python this.py CASE RANK PORT MODEL OUT``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

from kernel.loss import LossConfig
from kernel.models import build_tiny_model
from kernel.sample import Sample, Status
from kernel.train.batching import plan_microbatches, shard_samples
from kernel.train.megatron_backend import MegatronTrainer
from kernel.train.optim import OptimConfig
from kernel.train.settings import MegatronTrainerConfig
from tests.megatron.conftest import run_ranks

pytestmark = pytest.mark.slow  # the slow tier: scripts/test.sh --slow

# linear decay over 2 steps: lr 1e-3 at step 1, 1e-3 * (2 - 1) / 2 = 5e-4 at step 2, so a
# resumed run that lost the schedule would take a different step 2
OPTIM = OptimConfig(lr=1e-3, grad_clip=1.0, warmup_steps=0, decay="linear")
LOSS = LossConfig(kl_coef=0.1)  # token_mean, with a reference model (KL)
BUDGET = 8  # tokens per micro-batch: 2 rows of 5 do not fit, so rows mostly run alone


def sample(prompt: list[int], response: list[int], mask: list[int], adv: float) -> Sample:
    return Sample(
        prompt_ids=prompt,
        response_ids=response,
        loss_mask=mask,
        advantage=adv,
        status=Status.COMPLETED,
    )


def batch(step: int = 0) -> list[Sample]:
    """Lengths 6, 5, 4; 6 masked tokens in all."""
    k = step * 3  # another step, other tokens
    return [
        sample([1, 5 + k, 7], [9, 10, 11 + k], [1, 1, 0], 1.0),  # 6 tokens, 2 masked
        sample([2, 5], [9, 12 + k, 13], [1, 1, 1], -0.5),  # 5 tokens, 3 masked
        sample([3, 4], [14 + k, 15], [1, 0], 2.0),  # 4 tokens, 1 masked
    ]


def trainer(model: str, tp: int = 1, pp: int = 1, optimizer: str = "torch") -> MegatronTrainer:
    cfg = MegatronTrainerConfig(
        tensor_parallel=tp,
        pipeline_parallel=pp,
        max_tokens_per_microbatch=BUDGET,
        optimizer=optimizer,
    )
    return MegatronTrainer(model, OPTIM, LOSS, cfg, total_steps=2, temperature=0.7)


def weights(t: MegatronTrainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in t.named_parameters_for_sync()}


def max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max((a[k] - b[k]).abs().max().item() for k in a)


def two_steps(
    model: str, ckpt: Path, tp: int = 1, pp: int = 1, optimizer: str = "torch", dp_rank=None
) -> dict:
    """Logprobs, then two uninterrupted steps saving a checkpoint after the first; then a fresh
    trainer that loads the checkpoint and takes step 2. Every rank must call it; with a
    ``dp_rank`` (of 2) each trains its ``shard_samples`` share of the batches."""

    def data(step: int) -> list[Sample]:
        return batch(step) if dp_rank is None else shard_samples(batch(step), dp_rank, 2)

    a = trainer(model, tp, pp, optimizer)
    try:
        numel = sum(p.numel() for p in a.module.parameters())
        adam_numel = sum(
            p.numel() for o in a._torch_optimizers() for g in o.param_groups for p in g["params"]
        )  # what this rank's Adam state covers
        before = weights(a)
        lp0 = a.compute_logprobs(data(0))
        m1 = a.train_step(data(0))
        after_1 = weights(a)
        a.save(ckpt)
        m2 = a.train_step(data(1))
        after_2 = weights(a)
    finally:
        a.close()
    b = trainer(model, tp, pp, optimizer)
    try:
        b.load(ckpt)
        loaded, loaded_step = weights(b), b.step
        r2 = b.train_step(data(1))
        resumed_2 = weights(b)
    finally:
        b.close()
    return dict(
        numel=numel, adam_numel=adam_numel, before=before, lp0=lp0, m1=m1, m2=m2, r2=r2,
        after_1=after_1, after_2=after_2, loaded=loaded, loaded_step=loaded_step,
        resumed_2=resumed_2,
    )  # fmt: skip


def check_resume(r: dict) -> None:
    assert r["loaded_step"] == 1
    assert max_diff(r["loaded"], r["after_1"]) == 0.0  # the weights come back exactly
    assert max_diff(r["after_2"], r["after_1"]) > 1e-4  # step 2 moves them visibly
    assert max_diff(r["resumed_2"], r["after_2"]) < 1e-6
    assert r["m1"]["lr"] == pytest.approx(1e-3)
    assert r["r2"]["lr"] == r["m2"]["lr"] == pytest.approx(5e-4)  # see OPTIM
    assert r["r2"]["step"] == r["m2"]["step"] == 2.0
    for k in ("loss", "grad_norm", "kl"):
        assert r["r2"][k] == pytest.approx(r["m2"][k], rel=1e-6, abs=1e-9), k


def check_same_metrics(got: dict, want: dict) -> None:
    # token_mean over the 6 masked tokens of the whole batch, ratio 1, and kl 0 at step 1
    # (the reference is the policy): loss = -(2 * 1.0 + 3 * -0.5 + 1 * 2.0) / 6 = -2.5 / 6
    # (rank 0 of DP=2 alone would give -2 / 2 = -1, rank 1 alone -(-1.5 + 2) / 4 = -0.125)
    assert want["loss"] == pytest.approx(-2.5 / 6, abs=1e-6)
    assert got["loss"] == pytest.approx(-2.5 / 6, abs=1e-6)
    assert got["loss_tokens"] == want["loss_tokens"] == 6
    assert got["n_samples"] == want["n_samples"] == 3
    for k in ("grad_norm", "logprob_mean", "entropy"):
        assert got[k] == pytest.approx(want[k], rel=1e-5), k
    assert want["grad_norm"] > 1.0  # above grad_clip: clipping is part of what is compared


# ---------------------------------------------------------------- the processes


def run_rank(case: str, rank: int, port: int, model: str, out: Path) -> None:
    import torch.distributed as dist

    from kernel.train.megatron_model import megatron_parallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if case == "dp2":  # TP=1, PP=1 on 2 ranks: DP=2
        with megatron_parallel():
            result = {
                opt: two_steps(model, out / f"ckpt_dp2_{opt}", optimizer=opt, dp_rank=rank)
                for opt in ("torch", "distributed")
            }
    elif case == "tp2":
        with megatron_parallel(tensor_parallel=2):
            result = two_steps(model, out / "ckpt_tp2", tp=2)
    elif case == "pp2":
        with megatron_parallel(pipeline_parallel=2):
            result = {
                opt: two_steps(model, out / f"ckpt_pp2_{opt}", pp=2, optimizer=opt)
                for opt in ("torch", "megatron")
            }
    else:
        raise ValueError(f"unknown case {case!r}")
    if rank == 0:
        torch.save(result, out / f"{case}.pt")
    dist.destroy_process_group()


def launch(case: str, model: str, out: Path) -> dict:
    argv = lambda r, port: [case, str(r), str(port), model, str(out)]  # noqa: E731
    run_ranks(__file__, argv, env={"OMP_NUM_THREADS": "1"})
    return torch.load(out / f"{case}.pt", weights_only=False)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("m"), "qwen2", tokenizer="char"))


@pytest.fixture(scope="module")
def single(model, tmp_path_factory) -> dict:
    """The single-process run (TP=1, PP=1, DP=1) every parallel layout must reproduce."""
    return two_steps(model, tmp_path_factory.mktemp("ckpt") / "tp1")


# ---------------------------------------------------------------- tests


def test_data_parallel_two_ranks_equal_one_process(model, single, tmp_path):
    """DP=2 with torch AdamW and with Megatron's distributed optimizer (Adam state sharded
    over the two ranks, gradients reduce-scattered, weights all-gathered over gloo)."""
    shards = [shard_samples(batch(0), r, 2) for r in range(2)]
    # rank 0 gets the 6-token sample (2 masked), rank 1 the 5- and 4-token ones (3 + 1):
    assert [len(s) for s in shards] == [1, 2]
    lengths = [[len(s.prompt_ids) + s.response_length for s in shard] for shard in shards]
    assert [len(plan_microbatches(n, BUDGET, False)) for n in lengths] == [1, 2]  # + a dummy
    assert max_diff(single["after_1"], single["before"]) > 5e-4  # the update is visible

    dp = launch("dp2", model, tmp_path)
    assert dp["torch"]["adam_numel"] == dp["torch"]["numel"]
    # rank 0's half of the flat buffer (Megatron pads the buckets: 41280 of 82496 here)
    half = dp["distributed"]["numel"] / 2
    assert half <= dp["distributed"]["adam_numel"] <= 1.01 * half
    for optimizer, r in dp.items():
        check_same_metrics(r["m1"], single["m1"])
        assert max_diff(r["after_1"], single["after_1"]) < 1e-5, optimizer
        assert max_diff(r["after_2"], single["after_2"]) < 1e-5, optimizer
        check_resume(r)
    # the distributed optimizer's state is sharded over DP=2: a DP=1 trainer refuses it
    t = trainer(model, optimizer="distributed")
    try:
        with pytest.raises(ValueError, match=r"data_parallel=2.*data_parallel=1"):
            t.load(tmp_path / "ckpt_dp2_distributed")
    finally:
        t.close()


def test_megatron_optimizer_equals_torch_adamw(model, single, tmp_path):
    """get_megatron_optimizer (Megatron's Adam, grad norm and clipping) on CPU: the same two
    updates as torch AdamW, and its checkpoint resumes."""
    r = two_steps(model, tmp_path / "ckpt", optimizer="megatron")
    check_same_metrics(r["m1"], single["m1"])
    assert max_diff(r["after_1"], single["after_1"]) < 1e-6
    assert max_diff(r["after_2"], single["after_2"]) < 1e-6
    check_resume(r)
    t = trainer(model)  # torch AdamW
    try:
        with pytest.raises(ValueError, match="optimizer='megatron'"):
            t.load(tmp_path / "ckpt")
    finally:
        t.close()


def test_checkpoint_resumes_like_an_uninterrupted_run(single):
    check_resume(single)


def test_checkpoint_resumes_at_tensor_parallel_two(model, single, tmp_path):
    tp2 = launch("tp2", model, tmp_path)
    check_resume(tp2)
    # Across layouts (not across a resume) the update equals the single process's to 5e-5:
    # Adam's first step is lr * g / (|g| + 1e-8), so for the few weights whose gradient is
    # about 1e-10 it turns on the gradient's rounding, which the TP split changes (measured:
    # 4 of the 80k weights differ by more than 1e-6, at most 1.6e-5; DP=2 and PP=2 by < 1e-6).
    assert max_diff(tp2["after_2"], single["after_2"]) < 5e-5
    assert tp2["m2"]["kl"] == pytest.approx(single["m2"]["kl"], rel=1e-4)
    # the TP=2 checkpoint holds half-size shards: a TP=1 trainer refuses it by name
    t = trainer(model)
    try:
        with pytest.raises(ValueError, match=r"tensor_parallel=2.*tensor_parallel=1"):
            t.load(tmp_path / "ckpt_tp2")
    finally:
        t.close()


def test_pipeline_parallel_two_stages_equal_one_process(model, single, tmp_path):
    """PP=2 through Megatron's 1F1B schedule (3 micro-batches, activations and their
    gradients sent over gloo, tied embeddings on both stages, the KL reference pipelined
    too), with torch AdamW and with Megatron's optimizer (its grad norm over both stages):
    logprobs, step 1 and step 2 equal the single process's, and the PP checkpoint resumes."""
    assert single["m2"]["kl"] > 0  # at step 2 the policy has left the reference
    for optimizer, pp2 in launch("pp2", model, tmp_path).items():
        for a, b in zip(pp2["lp0"], single["lp0"], strict=True):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)
        check_same_metrics(pp2["m1"], single["m1"])
        assert max_diff(pp2["after_1"], single["after_1"]) < 1e-5, optimizer
        assert pp2["m2"]["kl"] == pytest.approx(single["m2"]["kl"], rel=1e-4)
        assert max_diff(pp2["after_2"], single["after_2"]) < 1e-5, optimizer
        check_resume(pp2)


def test_load_refuses_a_folder_without_a_manifest(model, tmp_path):
    t = trainer(model)
    try:
        with pytest.raises(FileNotFoundError, match=r"megatron_checkpoint\.json"):
            t.load(tmp_path)
    finally:
        t.close()


if __name__ == "__main__":
    case, rank, port, model_dir, out_dir = sys.argv[1:]
    run_rank(case, int(rank), int(port), model_dir, Path(out_dir))
