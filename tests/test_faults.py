"""Faults on CPU: an engine killed by PID mid-rollout (its requests go to the other engine, it
leaves the router, is restarted, gets the current weights and rejoins), and Ctrl-C (every
process the run started stops; nothing else does), and five SIGKILLs of a run, one while it
writes a checkpoint."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kernel.buffer import DataBuffer
from kernel.cli import train_config
from kernel.hooks import package_file
from kernel.run.loop import train
from tests.hook_fixtures import faults
from tests.procs import alive, children, engines_of
from tests.test_loop import _cli

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "kernel" / "presets" / "toy.yaml"


GATEWAY = [  # the toy's episode as a program behind the gateway (kernel.gateway)
    "--generate_fn=tests.hook_fixtures.faults.gateway_generate",
    "--reward_fn=kernel.gateway.hooks.reward",
    "--recipe_config=kernel.gateway.hooks.GatewayConfig",
    '--recipe_args={"program": "tests.hook_fixtures.faults.program"}',
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "transport, hooks",
    [
        ("tensor", ["--generate_fn=tests.hook_fixtures.faults.generate"]),
        ("distributed", ["--generate_fn=tests.hook_fixtures.faults.generate"]),
        ("tensor", GATEWAY),
    ],
    ids=["tensor", "distributed", "gateway"],
)
def test_engine_killed_mid_rollout_is_replaced_and_the_step_completes(tmp_path, transport, hooks):
    faults.seen.clear()
    cfg = train_config(
        [
            f"--config={TOY}",
            f"--output_dir={tmp_path}",
            *hooks,
            "--num_steps=4",
            "--engine.num_engines=2",
            "--engine.start_router=true",
            "--rollout.max_response_len=24",
            f"--sync.transport={transport}",
        ]
    )
    rows = train(cfg)

    # every step completed with its full batch, and no prompt was trained twice or lost
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r["rollout/groups"] == cfg.data.prompts_per_step for r in rows)
    trained = [row for r in rows for row in r["data/rows"]]
    assert len(trained) == len(set(trained)) == 4 * cfg.data.prompts_per_step
    # the dead engine was restarted once, in the step it died in
    assert [r["engines/restarts"] for r in rows] == [0, 1, 1, 1]
    url, old_pid = faults.seen["killed"]
    assert old_pid not in faults.seen["pids"]
    # ... re-registered with the router (both workers healthy again) ...
    workers = {w["url"]: w["is_healthy"] for w in faults.seen["workers"]}
    assert workers == {u: True for u in workers} and url in workers and len(workers) == 2
    # ... and serving the trainer's current weights, like the engine that never died
    assert faults.seen["versions"] == [str(rows[2]["weight_version"])] * 2
    assert rows[-1]["train/logprob_diff"] < 1e-4


@pytest.mark.slow
def test_ctrl_c_stops_every_process_the_run_started_and_nothing_else(tmp_path):
    bystander = subprocess.Popen(["sleep", "120"])  # not the run's: must survive
    metrics = tmp_path / "metrics.jsonl"
    cmd = [sys.executable, "-m", "kernel", "train", "--preset", "toy_duo"]
    # far more steps than the test lasts: only the SIGINT can end the run (200 steps of the
    # toy took under a minute, so a run that lost the signal could still end with exit 0)
    cmd += [f"--output_dir={tmp_path}", "--num_steps=100000", "--engine.start_router=true"]
    # a Ctrl-C reaches it even when this test runs in the background, where the shell has told
    # background jobs (and so their children) to ignore SIGINT
    run = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 240
        while not (metrics.exists() and metrics.read_text().strip()):
            assert run.poll() is None, run.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the run made no progress"
            time.sleep(0.2)
        started = children(run.pid)
        assert len(started) >= 4, started  # two engines and two routers (one per model)

        run.send_signal(signal.SIGINT)
        try:
            _, err = run.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            run.send_signal(signal.SIGUSR1)  # its threads' stacks: where it is stuck
            time.sleep(2)
            run.kill()
            _, err = run.communicate()
            pytest.fail("the run went on for a minute after SIGINT:\n" + err.decode()[-6000:])
        assert run.returncode == 130, err.decode()[-2000:]
        assert b"interrupted" in err.lower(), err.decode()[-2000:]
        deadline = time.monotonic() + 20
        while [p for p in started if alive(p)]:
            left = [p for p in started if alive(p)]
            assert time.monotonic() < deadline, f"left running: {left}"
            time.sleep(0.2)
        assert bystander.poll() is None  # a process the run did not start is untouched
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        assert rows and rows[0]["step"] == 0
    finally:
        if run.poll() is None:
            run.kill()
        bystander.kill()


@pytest.mark.slow
def test_five_sigkills_one_during_a_save_lose_and_repeat_nothing(tmp_path):
    """SIGKILL a toy run at five points -- one of them while a checkpoint is being written
    (its step_N.tmp exists) -- resuming after each: every step's row is in metrics.jsonl once,
    the prompts trained are exactly an uninterrupted run's, and no engine is orphaned."""
    steps, rng = 20, random.Random(5)
    metrics, ckpts = tmp_path / "metrics.jsonl", tmp_path / "checkpoints"

    def start(resume: bool) -> subprocess.Popen:
        return _cli(tmp_path, f"--num_steps={steps}", f"--resume={str(resume).lower()}")

    def rows() -> int:
        return len(metrics.read_text().splitlines()) if metrics.exists() else 0

    kills = []
    for k in range(5):
        run = start(resume=k > 0)
        deadline = time.monotonic() + 240
        during_save = k == 2
        target = rows() + 1
        while True:
            assert run.poll() is None, run.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the run made no progress"
            if during_save and any(ckpts.glob("step_*.tmp")):
                break
            if not during_save and rows() >= target:
                time.sleep(rng.uniform(0.0, 0.4))  # somewhere inside the next step
                break
            time.sleep(0.01)
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
        kills.append("save" if during_save else f"after row {rows()}")
        deadline = time.monotonic() + 20
        while engines_of(tmp_path):
            assert time.monotonic() < deadline, f"orphaned engines: {engines_of(tmp_path)}"
            time.sleep(0.2)
    last = start(resume=True)
    _, err = last.communicate(timeout=600)
    assert last.returncode == 0, err.decode()[-3000:]

    logged = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in logged] == list(range(steps)), kills
    cfg = train_config([f"--config={TOY}", f"--output_dir={tmp_path}"])
    buffer = DataBuffer(replace(cfg.data, path=package_file(cfg.data.path)))
    expected = [sorted(g[0].metadata["row"] for g in buffer.next_groups()) for _ in range(steps)]
    assert [r["data/rows"] for r in logged] == expected, kills
