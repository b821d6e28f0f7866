"""The flywheel end to end on CPU: a tiny model served by the embedded engine learns the toy
task through generation -> reward -> advantages -> train -> weight sync; async mode; every
weight-sync transport; SIGKILL mid-step and resume with no prompt skipped or repeated."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel.buffer import DataBuffer
from kernel.cli import train_config
from kernel.run.loop import train
from tests.procs import engines_of

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "kernel" / "presets" / "toy.yaml"


def toy_config(tmp_path, *flags):
    return train_config([f"--config={TOY}", f"--output_dir={tmp_path}", *flags])


def mean_reward(rows):
    return sum(r["reward"] for r in rows) / len(rows)


@pytest.mark.slow
def test_tiny_model_learns_through_the_full_path(tmp_path):
    t0 = time.perf_counter()
    rows = train(toy_config(tmp_path, "--num_steps=50"))
    elapsed = time.perf_counter() - t0
    first, last = mean_reward(rows[:5]), mean_reward(rows[-5:])
    assert first <= 0.3, first
    assert last >= 0.9, (first, last)
    assert elapsed < 300, elapsed
    # the engine sampled with the weights the trainer had: the logprobs agree every step
    assert max(r["train/logprob_diff"] for r in rows) < 1e-4
    assert [r["weight_version"] for r in rows] == list(range(1, 51))
    assert (tmp_path / "curves.png").exists() is False  # the CLI plots; train() only logs
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 50


@pytest.mark.slow
def test_async_one_step_off_policy_learns_and_bounds_staleness(tmp_path):
    eval_flags = ["--eval.path=kernel/presets/toy_prompts.jsonl", "--eval.every=20"]
    cfg = toy_config(
        tmp_path,
        "--num_steps=40",
        "--async_mode=true",
        "--loss.tis_cap=2.0",
        *eval_flags,
        "--eval.max_prompts=8",
    )
    rows = train(cfg)
    assert mean_reward(rows[-5:]) - mean_reward(rows[:5]) > 0.4
    assert all(r["staleness/dropped"] == 0 for r in rows)
    evals = [r for r in rows if "eval/default/avg@4" in r]
    assert [r["step"] for r in evals] == [19, 39]
    assert evals[-1]["eval/default/avg@4"] > evals[0]["eval/default/avg@4"]


@pytest.mark.slow
def test_dapo_overlong_shaping_shortens_the_answers(tmp_path):
    """The toy's reward (share of digits) does not care about length, so its answers fill the
    8 tokens; DAPO's overlong term (free up to 4 tokens) makes them end early. Measured, seed
    42: 7.7 -> 4.0 tokens (without the term 7.9 -> 8.0)."""
    flags = ["--reward.overlong_buffer_len=4", "--reward.overlong_max_len=8"]
    flags += ["--reward.overlong_penalty=0.5", "--loss.clip_high=0.28", "--dynamic_sampling=true"]
    rows = train(toy_config(tmp_path, *flags))
    # a step whose every group dynamic sampling dropped (constant rewards, refills spent) trains
    # on nothing and logs no length
    length = [r["default/response_length"] for r in rows if "default/response_length" in r]
    assert len(length) >= 40 and sum(length[:5]) / 5 > 7 and sum(length[-5:]) / 5 < 5.5


def test_eval_at_start_greedy_per_item_and_a_time_limit(tmp_path):
    # max_minutes stops a 1000-step run after the first step that began past 0.6 s; it is
    # evaluated and checkpointed as the last one, and the starting weights were evaluated too
    flags = ["--eval.path=kernel/presets/toy_prompts.jsonl", "--eval.every=1000"]
    flags += ["--eval.at_start=true", "--eval.temperature=0", "--eval.n_samples=3"]
    flags += ["--eval.pass_k=[1,3]"]
    cfg = toy_config(tmp_path, "--num_steps=1000", "--max_minutes=0.01", *flags)
    rows = train(cfg)
    assert 1 <= len(rows) < 1000
    n = len(rows)
    assert "eval/default/avg@3" in rows[-1] and rows[-1]["time/eval_s"] > 0
    assert not any("eval/default/avg@3" in r for r in rows[:-1])
    assert (tmp_path / "checkpoints" / f"step_{n}" / "state.json").exists()
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged[0]["step"] == -1 and "eval/default/pass@3" in logged[0]
    assert [r["step"] for r in logged[1:]] == list(range(n))
    before, after = (
        [json.loads(line) for line in (tmp_path / "eval" / f"step_{k}.jsonl").open()]
        for k in (0, n)
    )
    # pass@1 (unbiased) is the mean share of passing episodes per prompt, pass@3 whether any
    share = [sum(i["passed"]) / len(i["passed"]) for i in before]
    assert logged[0]["eval/default/pass@1"] == pytest.approx(sum(share) / len(share))
    anyp = [float(any(i["passed"])) for i in before]
    assert logged[0]["eval/default/pass@3"] == pytest.approx(sum(anyp) / len(anyp))
    n_prompts = len((ROOT / cfg.eval.path).read_text().splitlines())
    assert sorted(i["row"] for i in before) == sorted(i["row"] for i in after)
    assert len(before) == min(n_prompts, cfg.eval.max_prompts)
    for item in before + after:  # greedy: the three episodes of a prompt are one answer
        assert item["agent"] == "default" and len(item["rewards"]) == 3
        assert len(set(item["rewards"])) == 1, item
    mean_before = sum(i["rewards"][0] for i in before) / len(before)
    assert logged[0]["eval/default/avg@3"] == pytest.approx(mean_before)


@pytest.mark.parametrize("transport", ["disk", "tensor", "shared", "distributed"])
def test_after_a_push_engine_logprobs_equal_the_trainers(tmp_path, transport):
    from kernel.engine.pool import EnginePool
    from kernel.models import materialize_model
    from kernel.sample import Sample, Status
    from kernel.sync.push import WeightSync
    from kernel.train.torch_backend import TorchTrainer

    cfg = toy_config(tmp_path, f"--sync.transport={transport}", "--optim.lr=0.05")
    model = materialize_model(cfg.model, tmp_path / "models")
    trainer = TorchTrainer(model, cfg.optim, cfg.loss, cfg.trainer, total_steps=2)
    prompt = [1, 90, 88, 74, 87, 3, 45, 78, 5, 2, 3, 1, 70, 88]  # ChatML ids of the toy tokenizer

    def as_sample(ids, advantage=None):
        return Sample(
            prompt_ids=prompt,
            response_ids=ids,
            loss_mask=[1] * len(ids),
            advantage=advantage,
            status=Status.COMPLETED,
        )

    def trainer_logprobs(ids):
        return trainer.compute_logprobs([as_sample(ids)])[0]

    async def run(client):
        sync = WeightSync(cfg.sync, [client], tmp_path)
        try:
            res = await client.generate(prompt, {"max_new_tokens": 4})
            # the trainer's weights move; the engine's do not, until the push
            trainer.train_step([as_sample(res.output_ids, advantage=1.0)])
            stale = await client.generate(prompt, {"max_new_tokens": 4})
            stale_ref = trainer_logprobs(stale.output_ids)
            metrics = await sync.push(trainer, version=1, probe=prompt)
            metrics |= await sync.checked()  # the check ran in the background
            fresh = await client.generate(prompt, {"max_new_tokens": 4})
            return stale, stale_ref, fresh, trainer_logprobs(fresh.output_ids), metrics
        finally:
            await sync.aclose()
            await client.aclose()

    with EnginePool(cfg.engine, model, tmp_path / "logs") as pool:
        stale, stale_ref, fresh, ref, metrics = asyncio.run(run(pool.clients()[1][0]))
    # before the push the engine is measurably behind; after it, it serves the trainer's weights
    assert max(abs(a - b) for a, b in zip(stale.logprobs, stale_ref, strict=True)) > 1e-3
    assert fresh.weight_version == "1"
    assert max(abs(a - b) for a, b in zip(fresh.logprobs, ref, strict=True)) < 1e-4
    # ... and the post-sync check saw the same, on its own probe
    assert 0.0 <= metrics["sync/check_logprob_diff"] < 1e-4


@pytest.mark.parametrize("transport", ["tensor", "shared", "distributed"])
def test_post_sync_check_catches_a_wrong_conversion(tmp_path, transport):
    """A converter that splits a fused gate/up projection in the wrong order (Megatron's
    linear_fc1) loads without an error; the post-sync check names the engine instead of letting
    the run train on bad rollouts. A random tiny model's outputs are nearly flat, so the bug
    moves its logprobs by ~5e-3 per token: the fp32 tolerance (1e-3) is used, against a noise
    floor of ~1e-5."""
    from kernel.engine.pool import EnginePool
    from kernel.models import materialize_model
    from kernel.sync.push import SyncCheckError, WeightSync
    from kernel.train.torch_backend import TorchTrainer

    class SwapsGateAndUp(TorchTrainer):
        swap = False  # the converter's bug, switched on for the second push

        def named_parameters_for_sync(self, dtype=None):
            params = dict(super().named_parameters_for_sync(dtype))
            for name in [n for n in params if n.endswith("mlp.gate_proj.weight") and self.swap]:
                up = name.replace("gate_proj", "up_proj")
                params[name], params[up] = params[up], params[name]
            yield from params.items()

    flags = ("--sync.check_tolerance=1e-3", "--sync.check_every=1")  # the toy checks every 10th
    cfg = toy_config(tmp_path, f"--sync.transport={transport}", *flags)
    model = materialize_model(cfg.model, tmp_path / "models")
    prompt = [1, 90, 88, 74, 87, 3, 45, 78, 5, 2, 3, 1, 70, 88]

    async def run(client):
        sync = WeightSync(cfg.sync, [client], tmp_path)
        try:
            trainer = SwapsGateAndUp(model, cfg.optim, cfg.loss, cfg.trainer, total_steps=1)
            await sync.push(trainer, 1, probe=prompt)
            assert (await sync.checked())["sync/check_logprob_diff"] < 1e-4
            trainer.swap = True
            await sync.push(trainer, 2, probe=prompt)  # the check runs in the background ...
            with pytest.raises(SyncCheckError, match=f"engine {client.base_url} gives logprobs"):
                await sync.checked()  # ... and fails when the loop waits for it
            # the engine answers again afterwards (generation was continued)
            assert (await client.generate(prompt, {"max_new_tokens": 2})).weight_version == "2"
        finally:
            await sync.aclose()
            await client.aclose()

    with EnginePool(cfg.engine, model, tmp_path / "logs") as pool:
        asyncio.run(run(pool.clients()[1][0]))


def test_post_sync_check_skips_an_engine_that_died_after_the_push(tmp_path):
    """The check runs beside the next rollout; an engine killed meanwhile gives no reply. It is
    skipped (its pool restarts it with the current weights); the live ones are still checked,
    and no engine replying at all is an error."""
    from kernel.engine.client import ClientConfig, EngineClient
    from kernel.engine.launch import free_port
    from kernel.engine.pool import EnginePool
    from kernel.models import materialize_model
    from kernel.sync.push import SyncCheckError, WeightSync
    from kernel.train.torch_backend import TorchTrainer

    cfg = toy_config(tmp_path, "--sync.transport=tensor")
    model = materialize_model(cfg.model, tmp_path / "models")
    prompt = [1, 90, 88, 74, 87, 3, 45, 78, 5, 2, 3, 1, 70, 88]
    fast = ClientConfig(max_retries=1, backoff_s=0.05, connect_timeout_s=2)

    async def run(client):
        dead = EngineClient(f"http://127.0.0.1:{free_port()}", fast)  # nothing listens there
        trainer = TorchTrainer(model, cfg.optim, cfg.loss, cfg.trainer, total_steps=1)
        sync = WeightSync(cfg.sync, [client], tmp_path)
        try:
            await sync.push(trainer, 1)
            both = WeightSync(cfg.sync, [client, dead], tmp_path)
            assert await both.check(trainer, prompt, 1) < 1e-4  # the live engine, checked
            wrong = f"engine {client.base_url} serves weight version '1'"
            with pytest.raises(SyncCheckError, match=wrong):  # a live engine, wrong version
                await both.check(trainer, prompt, 2)
            with pytest.raises(SyncCheckError, match="no engine replied"):
                await WeightSync(cfg.sync, [dead], tmp_path).check(trainer, prompt, 1)
        finally:
            await sync.aclose()
            await client.aclose()
            await dead.aclose()

    with EnginePool(cfg.engine, model, tmp_path / "logs") as pool:
        asyncio.run(run(pool.clients()[1][0]))


def _cli(tmp_path, *flags):
    cmd = [
        sys.executable,
        "-m",
        "kernel",
        "train",
        "--preset",
        "toy",
        f"--output_dir={tmp_path}",
        "--num_steps=6",
        "--save_every=1",
        *flags,
    ]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_sigkill_mid_step_then_resume_skips_and_repeats_no_prompt(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    run = _cli(tmp_path)
    deadline = time.monotonic() + 240
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert run.poll() is None, run.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.2)
    time.sleep(0.3)  # into the next step
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    # the engine the killed run started dies with it (PR_SET_PDEATHSIG), leaving no orphan
    deadline = time.monotonic() + 20
    while engines_of(tmp_path):
        assert time.monotonic() < deadline, f"orphaned engines: {engines_of(tmp_path)}"
        time.sleep(0.2)

    resumed = _cli(tmp_path, "--resume=true")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err.decode()[-3000:]

    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(6))
    assert [r["weight_version"] for r in rows] == list(range(1, 7))
    # the prompts trained, step by step, are exactly those of an uninterrupted run
    cfg = toy_config(tmp_path)
    from dataclasses import replace

    from kernel.hooks import package_file

    buffer = DataBuffer(replace(cfg.data, path=package_file(cfg.data.path)))
    expected = [sorted(g[0].metadata["row"] for g in buffer.next_groups()) for _ in range(6)]
    assert [r["data/rows"] for r in rows] == expected


@pytest.mark.slow
def test_training_through_the_real_sglang_router(tmp_path):
    """The real sglang-router in front of engine A only, engines A and B given for weight sync:
    generation must go through the router (so only A serves) while weight sync reaches both
    engines directly (both end on the trainer's version, which the post-sync check probes)."""
    import httpx

    from kernel.engine.launch import free_port, launch_server
    from kernel.engine.router import RouterConfig, launch_router, wait_for_workers
    from kernel.engine.settings import ServerConfig
    from kernel.models import materialize_model

    model = materialize_model("tiny-char", tmp_path / "models")
    servers, router = [], None
    try:
        for i in range(2):
            cfg = ServerConfig(model=model, port=free_port(), num_threads=1, seed=i)
            servers.append(launch_server(cfg, tmp_path / f"engine{i}.log"))
        for s in servers:
            s.wait_healthy(120)
        urls = [s.url for s in servers]
        rcfg = RouterConfig(port=free_port(), worker_urls=urls[:1], policy="round_robin")
        router = launch_router(rcfg, tmp_path / "router.log")
        wait_for_workers(rcfg.url, 1)
        rows = train(
            toy_config(
                tmp_path / "run",
                "--num_steps=12",
                "--sync.check_every=1",  # the toy checks every 10th push; here each is counted
                f"--engine.urls={urls}",
                f"--engine.router_url={rcfg.url}",
            )
        )
        loads = [httpx.get(f"{u}/v1/loads").json()["loads"][0] for u in urls]
        versions = [httpx.get(f"{u}/get_weight_version").json()["weight_version"] for u in urls]
    finally:
        for p in [*servers, router]:
            if p is not None:
                p.stop()
    assert mean_reward(rows[-3:]) > mean_reward(rows[:3])
    # B only answered the post-sync check's probe, once per step (SyncConfig.check_tokens)
    assert loads[0]["num_finished_reqs"] > 12 and loads[1]["num_finished_reqs"] == 12, loads
    assert versions == ["12", "12"]
    assert max(r["train/logprob_diff"] for r in rows) < 1e-4
