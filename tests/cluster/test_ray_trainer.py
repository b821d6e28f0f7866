"""A Ray trainer group of world size 2 (FSDP2 over gloo, CPU actors) and two embedded engines
behind the real sglang-router run two RL steps with tensor, distributed or shared weight sync
(distributed: broadcast by rank 0's actor; shared: each rank's own shared copy, rank 0's to
engine 0 and rank 1's to engine 1 -- never through this process): the group's first loss equals
a single process's, and after each push both engines serve the group's weights. Killing one
actor's process makes the next step raise TrainerDied naming the agent and rank. A group of
MegatronTrainers (TP=2, or two data-parallel replicas) steps like one process."""

from __future__ import annotations

import asyncio
import base64
import os
import signal

import pytest
import torch
from torch.distributed import distributed_c10d as c10d

from kernel.engine.client import EngineClient
from kernel.engine.launch import free_port, launch_server
from kernel.engine.router import RouterConfig, launch_router, wait_for_workers
from kernel.engine.settings import ServerConfig
from kernel.engine.weights import decode_flattened_bucket
from kernel.loss import LossConfig
from kernel.sample import Sample, Status
from kernel.sync.push import WeightSync
from kernel.sync.settings import SyncConfig
from kernel.train.optim import OptimConfig
from kernel.train.ray_trainer import RayTrainer, TrainerDied
from kernel.train.settings import TorchTrainerConfig
from kernel.train.torch_backend import TorchTrainer

pytestmark = pytest.mark.slow  # the slow tier: scripts/test.sh --slow

OPTIM = OptimConfig(lr=0.02)
LOSS = LossConfig()
CFG = TorchTrainerConfig(max_tokens_per_microbatch=64, device="cpu")
PROMPT = [1, 90, 88, 74, 87, 3, 45, 78, 5, 2, 3, 1, 70, 88]  # ChatML ids of the char tokenizer
SAMPLING = {"max_new_tokens": 6, "temperature": 1.0, "ignore_eos": True}
ADVANTAGES = [1.0, -1.0, 0.5, -0.5]


def sample(output_ids, logprobs=None, advantage=None) -> Sample:
    return Sample(
        prompt_ids=PROMPT,
        response_ids=list(output_ids),
        loss_mask=[1] * len(output_ids),
        rollout_logprobs=logprobs,
        advantage=advantage,
        status=Status.COMPLETED,
    )


@pytest.fixture
def engines(char_model_dir, tmp_path):
    """Two embedded engines and the real sglang-router in front of them."""
    procs = []
    try:
        for i in range(2):
            cfg = ServerConfig(
                model=char_model_dir, port=free_port(), num_threads=1, max_batch_size=8, seed=i
            )
            procs.append(launch_server(cfg, tmp_path / f"engine{i}.log"))
        for p in procs:
            p.wait_healthy(120)
        urls = [p.url for p in procs]
        router_cfg = RouterConfig(
            port=free_port(), worker_urls=urls, policy="round_robin", prometheus_port=free_port()
        )
        procs.append(launch_router(router_cfg, tmp_path / "router.log"))
        procs[-1].wait_healthy(60)
        wait_for_workers(router_cfg.url, 2, 60)
        yield router_cfg.url, urls
    finally:
        for p in procs:
            p.stop()


@pytest.mark.parametrize("transport", ["tensor", "distributed", "shared"])
def test_group_trains_syncs_engines_and_reports_a_dead_rank(
    local_ray, engines, char_model_dir, tmp_path, transport
):
    router_url, urls = engines
    group = RayTrainer("doctor", char_model_dir, OPTIM, LOSS, CFG, 3, world_size=2)
    single = TorchTrainer(char_model_dir, OPTIM, LOSS, CFG, 3)
    assert len(set(group.pids)) == 2 and os.getpid() not in group.pids

    async def check_engines(clients, version: str) -> None:
        """Each engine's logprobs of its own sample equal the group's for those ids."""
        for c in clients:
            res = await c.generate(PROMPT, SAMPLING)
            assert res.weight_version == version
            ref = group.compute_logprobs([sample(res.output_ids)])[0]
            assert max(abs(a - b) for a, b in zip(res.logprobs, ref, strict=True)) < 1e-4

    async def run() -> list[dict]:
        router = EngineClient(router_url)
        clients = [EngineClient(u) for u in urls]
        ranks = [[0], [1]] if transport == "shared" else None  # engine i <- rank i's copy
        sync = WeightSync(SyncConfig(transport=transport), clients, tmp_path, engine_ranks=ranks)
        metrics = []
        try:
            await check_engines(clients, "0")
            for step in (1, 2):
                results = await asyncio.gather(
                    *(router.generate(PROMPT, SAMPLING) for _ in ADVANTAGES)
                )
                batch = [
                    sample(r.output_ids, r.logprobs, a)
                    for r, a in zip(results, ADVANTAGES, strict=True)
                ]
                metrics.append(group.train_step(batch))
                if step == 1:
                    metrics.append(single.train_step(batch))
                    # the group's weights moved and the engines' did not, until the push
                    stale = await clients[0].generate(PROMPT, SAMPLING)
                    new = group.compute_logprobs([sample(stale.output_ids)])[0]
                    gap = max(abs(a - b) for a, b in zip(stale.logprobs, new, strict=True))
                    assert gap > 1e-3, gap
                await sync.push(group, version=step)
                await check_engines(clients, str(step))
                # distributed: rank 0's actor broadcast the weights; this process joined no group
                assert c10d._world.pg_names == {}
            if transport == "shared":  # each rank shares a copy of its own, in its own process
                b = group.weight_broadcaster()
                b.start(2**30, "gloo")
                b.next()
                payloads = b.share()
                try:
                    for pid, payload in zip(group.pids, payloads, strict=True):
                        assert f"/torch_{pid}_".encode() in base64.b64decode(payload)
                    copies = [dict(decode_flattened_bucket(p)) for p in payloads]
                    full = dict(group.named_parameters_for_sync())
                    assert copies[0].keys() == copies[1].keys() == full.keys()
                    assert all(torch.equal(c[k], full[k]) for c in copies for k in full)
                finally:
                    b.release()
        finally:
            await sync.aclose()
            await asyncio.gather(router.aclose(), *(c.aclose() for c in clients))
        return metrics

    try:
        group_1, single_1, group_2 = asyncio.run(run())
        assert group_1["n_samples"] == len(ADVANTAGES) == single_1["n_samples"]
        # the loss (ratio 1 at step 1: normalised over both ranks' tokens), the weights'
        # logprobs and the gradient norm after FSDP's reduction all match one process
        for key in ("loss", "logprob_mean", "grad_norm"):
            assert abs(group_1[key] - single_1[key]) <= 1e-5, (key, group_1, single_1)
        assert group.step == 2 and group_2["step"] == 2.0

        # a rank's process dies: the next step names the agent and the rank, and stops the group
        os.kill(group.pids[1], signal.SIGKILL)
        with pytest.raises(TrainerDied, match="agent 'doctor' lost rank 1") as err:
            group.train_step([sample([40, 41, 42], advantage=1.0)])
        assert (err.value.agent, err.value.rank) == ("doctor", 1)
        assert group.actors == []
    finally:
        group.close()


@pytest.mark.parametrize("tensor_parallel", [1, 2])
def test_megatron_group_of_two_ranks_equals_one_process(local_ray, char_model_dir, tensor_parallel):
    """A MegatronTrainerConfig makes every rank a MegatronTrainer: at TP=2 the ranks split each
    layer, at TP=1 they are two data-parallel replicas with a shard of the batch each. Either
    way one step equals an in-process single-rank MegatronTrainer step on the whole batch."""
    pytest.importorskip("megatron.core")
    from kernel.train.megatron_backend import MegatronTrainer
    from kernel.train.settings import MegatronTrainerConfig

    batch = [sample([10 + i, 20 + i, 30 + i], advantage=a) for i, a in enumerate(ADVANTAGES)]
    cfg = MegatronTrainerConfig(tensor_parallel=1, max_tokens_per_microbatch=64)
    ref = MegatronTrainer(char_model_dir, OPTIM, LOSS, cfg, total_steps=1)
    try:
        ref_metrics = ref.train_step(batch)
        ref_weights = dict(ref.named_parameters_for_sync())
    finally:
        ref.close()

    cfg = MegatronTrainerConfig(tensor_parallel=tensor_parallel, max_tokens_per_microbatch=64)
    group = RayTrainer("solver", char_model_dir, OPTIM, LOSS, cfg, 1, world_size=2)
    try:
        assert group.replicas == ([(0, 2), (1, 2)] if tensor_parallel == 1 else [(0, 1)] * 2)
        metrics = group.train_step(batch)
        weights = dict(group.named_parameters_for_sync())
    finally:
        group.close()
    assert metrics["n_samples"] == 4 and metrics["loss_tokens"] == 12
    assert abs(metrics["loss"] - ref_metrics["loss"]) < 1e-5
    assert abs(metrics["grad_norm"] - ref_metrics["grad_norm"]) < 1e-4
    assert weights.keys() == ref_weights.keys()
    # Adam moves every weight by ~lr = 0.02; TP's split reductions leave ~1e-5 of it
    assert max((weights[k] - ref_weights[k]).abs().max().item() for k in weights) < 1e-4
