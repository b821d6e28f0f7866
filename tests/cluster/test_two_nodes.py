"""Two Ray nodes on this machine, each its own ``ray start`` (a head raylet on 127.0.0.2 and a
worker raylet on 127.0.0.3, both loopback; each declares two GPUs it does not have): ``kernel
launch`` places the doctor's trainer on node 0 and every engine on node 1, so each weight sync
crosses the node boundary (the distributed transport). Node 1's raylet is then SIGKILLed mid-run:
the run stops with an error naming the node and what it held, and once a new node joins, resumes
from its last checkpoint and trains every step once, on exactly the prompts of an uninterrupted
run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from kernel.buffer import DataBuffer
from kernel.cli import train_config
from kernel.cluster.plan import ClusterConfig, make_placement
from kernel.cluster.run import NodeLost, run_placement
from kernel.engine.launch import free_port
from kernel.hooks import package_file
from tests.ports import plan_ports

pytestmark = pytest.mark.slow  # the slow tier: scripts/test.sh --slow

ROOT = Path(__file__).resolve().parents[2]
TOY_DUO = ROOT / "kernel" / "presets" / "toy_duo.yaml"
STEPS = 4
RAY = str(Path(sys.executable).with_name("ray"))
# Ray turns 127.0.0.1 into the machine's outward address; other loopback addresses it keeps, so
# each node gets one of its own and nothing leaves the machine
HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"


class Nodes:
    """``ray start --block`` processes started by this test, stopped by PID at the end (SIGTERM:
    with draining off each stops its raylet, its workers and, on the head, the GCS)."""

    def __init__(self, tmp: str):
        self.tmp, self.port, self.started, self.logs = tmp, free_port(), [], []
        self.env = os.environ | {
            "RAY_AUTH_MODE": "disabled",
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        }
        self.address = f"{HEAD_IP}:{self.port}"

    def start(self, ip: str, head: bool = False) -> subprocess.Popen:
        flags = [f"--node-ip-address={ip}", "--num-cpus=2", "--num-gpus=2", "--block"]
        flags += ["--disable-usage-stats"]
        if head:  # a killed raylet is noticed in ~2 s (Ray's default: ~15 s)
            config = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}
            flags += ["--head", f"--port={self.port}", "--include-dashboard=false"]
            flags += [f"--temp-dir={self.tmp}", f"--system-config={json.dumps(config)}"]
        else:
            flags += [f"--address={self.address}"]
        log = open(Path(self.tmp) / f"{ip}-{len(self.started)}.log", "w")  # noqa: SIM115
        self.logs.append(log)
        proc = subprocess.Popen(
            [RAY, "start", *flags],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        self.started.append(proc)
        return proc

    def wait_alive(self, count: int, timeout_s: float = 90) -> None:
        import ray

        deadline = time.monotonic() + timeout_s
        while len([n for n in ray.nodes() if n["Alive"]]) != count:
            assert time.monotonic() < deadline, f"the Ray cluster did not reach {count} nodes"
            time.sleep(0.5)

    def kill_raylet(self, proc: subprocess.Popen) -> None:
        (raylet,) = [p for p in psutil.Process(proc.pid).children() if p.name() == "raylet"]
        raylet.kill()

    def wait_dead(self, ip: str, timeout_s: float = 30) -> None:
        import ray

        deadline = time.monotonic() + timeout_s
        while [n for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == ip]:
            assert time.monotonic() < deadline, f"Ray did not mark the node at {ip} dead"
            time.sleep(0.2)

    def stop(self) -> None:
        procs = [p for p in reversed(self.started) if p.poll() is None]  # the head last
        for p in procs:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for log in self.logs:
            log.close()


@pytest.fixture
def two_nodes(monkeypatch):
    import ray

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    # a short root: Ray's socket paths under it must stay within the OS's 107 characters
    nodes = Nodes(tempfile.mkdtemp(prefix="tandem-ray-", dir="/tmp"))
    try:
        nodes.start(HEAD_IP, head=True)
        deadline = time.monotonic() + 90
        while subprocess.run(
            [RAY, "status", f"--address={nodes.address}"], env=nodes.env, capture_output=True
        ).returncode:
            assert time.monotonic() < deadline, "the Ray head did not start"
            time.sleep(1)
        worker = nodes.start(WORKER_IP)
        ray.init(address=nodes.address, log_to_driver=False)
        nodes.wait_alive(2)
        yield nodes, worker
    finally:
        ray.shutdown()
        nodes.stop()
        shutil.rmtree(nodes.tmp, ignore_errors=True)


def _cluster(address: str) -> ClusterConfig:
    return ClusterConfig(
        nodes=2,
        gpus_per_node=2,
        address=address,
        engine_server="embedded",
        **plan_ports(),
        startup_timeout_s=180,
    )


def test_a_run_across_two_nodes_stops_when_one_dies_and_resumes_losing_nothing(tmp_path, two_nodes):
    nodes, worker = two_nodes
    frozen = {"model": "tiny-char", "trainable": False, "resources": {"infer_gpus": 1}}
    agents = [  # the doctor trains on node 0's two GPUs; both engines serve on node 1
        {"name": "doctor", "model": "tiny-char", "resources": {"train_gpus": 2, "infer_gpus": 1}},
        {"name": "patient", **frozen},
    ]
    flags = [f"--output_dir={tmp_path}", f"--num_steps={STEPS}", f"--agents={json.dumps(agents)}"]
    flags += ["--save_every=1", "--trainer.device=cpu", "--sync.check_every=1"]
    flags += ["--data.prompts_per_step=2"]
    cfg = train_config([f"--config={TOY_DUO}", *flags])
    placement = make_placement(cfg, _cluster(nodes.address))
    doctor, patient = placement.groups
    assert [r.node for r in doctor.trainer] == [0, 0] and doctor.sync_transport == "distributed"
    assert [e.node for e in doctor.engines + patient.engines] == [1, 1]

    def on_step(row):
        # node 1 dies after step 1 (its checkpoint is the one the resume starts from). Its
        # engines are processes of their own and keep serving without their raylet, so on a
        # fast machine the run could end before Ray notices: step 2, if it ends, holds the loop
        # until Ray has marked the node dead and the run's watcher (which looks every second)
        # has had time to stop it, before step 2's checkpoint
        if row["step"] == 1:
            nodes.kill_raylet(worker)
        if row["step"] == 2:
            nodes.wait_dead(WORKER_IP)
            time.sleep(3)

    with pytest.raises(NodeLost) as lost:
        run_placement(cfg, placement, on_step=on_step)
    message = str(lost.value)
    assert "node 1 of the placement" in message and "died while the run ran" in message
    assert "gpu0: doctor engine 0; gpu1: patient engine 0" in message
    assert "--resume true once the Ray cluster has cluster.nodes = 2 nodes again" in message
    assert os.path.isdir(tmp_path / "checkpoints")
    # the stopped run released what it held: node 0's two GPUs are free for the resume (a
    # trainer rank left alive would make the resumed run wait for them for ever)
    import ray

    deadline = time.monotonic() + 30
    while ray.available_resources().get("GPU", 0) < 2:
        assert time.monotonic() < deadline, f"GPUs still held: {ray.available_resources()}"
        time.sleep(0.5)

    nodes.start(WORKER_IP)
    nodes.wait_alive(2)
    resumed = train_config([f"--config={TOY_DUO}", *flags, "--resume=true"])
    rows = run_placement(resumed, make_placement(resumed, _cluster(nodes.address)))
    assert rows and rows[-1]["step"] == STEPS - 1
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == list(range(STEPS))  # each step once
    buffer = DataBuffer(replace(cfg.data, path=package_file(cfg.data.path)))
    expected = [sorted(g[0].metadata["row"] for g in buffer.next_groups()) for _ in range(STEPS)]
    assert [r["data/rows"] for r in logged] == expected  # no prompt lost or repeated
    assert logged[-1]["weight_version/doctor"] == STEPS
    # every trained step's weights crossed the node boundary and the engines then served them:
    # a push's check is logged with the next step, so each run's first step (0, and 2 after the
    # resume) may have none (the resume's restore push is checked only when it had a probe)
    checked = {
        r["step"]: r["sync/doctor/check_logprob_diff"]
        for r in logged
        if "sync/doctor/check_logprob_diff" in r
    }
    assert {1, 3} <= set(checked) and max(checked.values()) < 1e-4, checked
