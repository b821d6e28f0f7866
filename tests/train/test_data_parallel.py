"""Data parallel (FSDP2 over gloo, 2 CPU processes) trains exactly like one process.

The test launches this file twice as a script (ranks 0 and 1 on 127.0.0.1, a free port). Each
rank trains on its shard of the same global batches (pickled by the test). The shards have
different sizes and micro-batch counts, so the dummy micro-batches and the globally counted
normaliser are both exercised. Rank 0 writes the parameters and metrics; the ranks save a
checkpoint together. The test compares them with one in-process trainer on the full batches,
then resumes the data-parallel checkpoint in a single process and checks it goes on like the
single process.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernel.engine.launch import free_port
from kernel.loss import LossConfig
from kernel.train.batching import plan_microbatches, shard_samples
from kernel.train.optim import OptimConfig
from kernel.train.settings import TorchTrainerConfig
from kernel.train.torch_backend import TorchTrainer

OPTIM = OptimConfig(lr=1e-3, warmup_steps=1, decay="linear")
LOSS = LossConfig(agg="seq_mean_token_mean", tis_cap=2.0, kl_coef=0.1)  # + sharded ref
CFG = TorchTrainerConfig(max_tokens_per_microbatch=24, pack_sequences=True)
STEPS, BATCH = 2, 7
METRICS = ("loss", "pg_loss", "kl", "grad_norm", "lr", "tokens", "loss_tokens", "n_samples")


def run_rank(rank: int, world: int, port: int, model_dir: str, out: Path) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    trainer = TorchTrainer(model_dir, OPTIM, LOSS, CFG, total_steps=STEPS + 1)
    metrics = []
    with (out / "batches.pkl").open("rb") as f:
        batches = pickle.load(f)  # the test's own file
    for batch in batches[:STEPS]:
        metrics.append(trainer.train_step(shard_samples(batch, rank, world)))
    params = dict(trainer.named_parameters_for_sync())  # every rank gathers
    trainer.save(out / "ckpt")
    if rank == 0:
        torch.save({"params": params, "metrics": metrics}, out / "dp.pt")
    dist.destroy_process_group()


@pytest.mark.slow
def test_world_size_two_equals_world_size_one(char_model_dir, make_samples, tmp_path):
    batches = [make_samples(BATCH, seed=step) for step in range(STEPS + 1)]
    counts = [
        len(plan_microbatches([len(s.prompt_ids) + s.response_length for s in shard], 24, True))
        for batch in batches[:STEPS]
        for shard in (shard_samples(batch, r, 2) for r in range(2))
    ]
    assert counts[2] != counts[3]  # in step 2 one rank runs a dummy micro-batch
    with (tmp_path / "batches.pkl").open("wb") as f:
        pickle.dump(batches, f)
    port, repo = free_port(), Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(r), "2", str(port), char_model_dir, str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    single = TorchTrainer(char_model_dir, OPTIM, LOSS, CFG, total_steps=STEPS + 1)
    metrics = [single.train_step(batch) for batch in batches[:STEPS]]
    for p in procs:
        log = p.communicate(timeout=120)[0].decode()
        assert p.returncode == 0, log[-3000:]

    dp = torch.load(tmp_path / "dp.pt", weights_only=True)
    for name, t in single.named_parameters_for_sync():
        torch.testing.assert_close(dp["params"][name], t, rtol=0, atol=1e-5)
    assert any(
        not torch.equal(t, t0)
        for (_, t), (_, t0) in zip(
            single.named_parameters_for_sync(),
            TorchTrainer(char_model_dir, OPTIM, LOSS, CFG, 1).named_parameters_for_sync(),
            strict=True,
        )
    )
    for m_dp, m_one in zip(dp["metrics"], metrics, strict=True):
        for k in METRICS:
            assert abs(m_dp[k] - m_one[k]) <= 1e-5 * max(1.0, abs(m_one[k])), k

    # The FSDP checkpoint (full state dicts) resumes in one process like the single run goes on.
    resumed = TorchTrainer(char_model_dir, OPTIM, LOSS, CFG, total_steps=STEPS + 1)
    resumed.load(tmp_path / "ckpt")
    single.train_step(batches[STEPS])
    resumed.train_step(batches[STEPS])
    expected = dict(single.named_parameters_for_sync())
    for name, t in resumed.named_parameters_for_sync():
        torch.testing.assert_close(t, expected[name], rtol=0, atol=1e-5)


if __name__ == "__main__":
    rank, world, port, model_dir, out = sys.argv[1:]
    run_rank(int(rank), int(world), int(port), model_dir, Path(out))
