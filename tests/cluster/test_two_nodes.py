"""Two Ray nodes on this machine (``ray.cluster_utils.Cluster``: a head raylet and a worker
raylet, each declaring two GPUs it does not have): ``kernel launch`` places the doctor's trainer
on node 0 and every engine on node 1, so each weight sync crosses the node boundary (the
distributed transport). Node 1's raylet is then killed (SIGKILL) mid-run: the run stops with an
error naming the node and what it held, and once a new node joins, resumes from its last
checkpoint and trains every step once, on exactly the prompts of an uninterrupted run."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from kernel.buffer import DataBuffer
from kernel.cluster.plan import ClusterConfig, make_plan
from kernel.cluster.run import NodeLost, run_plan
from kernel.engine.launch import free_port
from kernel.hooks import package_file
from kernel.run.config import load_train_config

pytestmark = pytest.mark.slow  # the slow tier: scripts/test.sh --slow

ROOT = Path(__file__).resolve().parents[2]
TOY_DUO = ROOT / "kernel" / "presets" / "toy_duo.yaml"
STEPS = 4
NODE = {"num_cpus": 2, "num_gpus": 2, "node_ip_address": "127.0.0.1"}


@pytest.fixture
def two_nodes(monkeypatch):
    import ray
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(
        initialize_head=True,
        connect=True,
        head_node_args={
            **NODE,
            "include_dashboard": False,
            # a killed raylet is noticed in ~2 s (Ray's default: ~15 s)
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4},
        },
    )
    worker = cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    try:
        yield cluster, worker
    finally:
        ray.shutdown()
        cluster.shutdown()


def _cluster(address: str) -> ClusterConfig:
    return ClusterConfig(
        nodes=2,
        gpus_per_node=2,
        address=address,
        engine_server="embedded",
        router_base_port=free_port(),
        metrics_base_port=free_port(),
        engine_base_port=free_port(),
        master_base_port=free_port(),
        startup_timeout_s=180,
    )


def test_a_run_across_two_nodes_stops_when_one_dies_and_resumes_losing_nothing(tmp_path, two_nodes):
    cluster, worker = two_nodes
    frozen = {"model": "tiny-char", "trainable": False, "resources": {"infer_gpus": 1}}
    agents = [  # the doctor trains on node 0's two GPUs; both engines serve on node 1
        {"name": "doctor", "model": "tiny-char", "resources": {"train_gpus": 2, "infer_gpus": 1}},
        {"name": "patient", **frozen},
    ]
    flags = [f"--output_dir={tmp_path}", f"--num_steps={STEPS}", f"--agents={json.dumps(agents)}"]
    flags += ["--save_every=1", "--trainer.device=cpu", "--sync.check_every=1"]
    flags += ["--data.prompts_per_step=2"]
    cfg = load_train_config(flags, yaml_path=TOY_DUO)
    plan = make_plan(cfg, _cluster(cluster.address))
    doctor, patient = plan.groups
    assert [r.node for r in doctor.trainer] == [0, 0] and doctor.sync_transport == "distributed"
    assert [e.node for e in doctor.engines + patient.engines] == [1, 1]

    def on_step(row):
        if row["step"] == 1:
            cluster.remove_node(worker, allow_graceful=False)  # SIGKILL of its raylet

    with pytest.raises(NodeLost) as lost:
        run_plan(cfg, plan, on_step=on_step)
    message = str(lost.value)
    assert "node 1 of the plan" in message and "died while the run ran" in message
    assert "gpu0: doctor engine 0; gpu1: patient engine 0" in message
    assert "--resume true once the Ray cluster has cluster.nodes = 2 nodes again" in message
    assert os.path.isdir(tmp_path / "checkpoints")

    cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    resumed = load_train_config([*flags, "--resume=true"], yaml_path=TOY_DUO)
    rows = run_plan(resumed, make_plan(resumed, _cluster(cluster.address)))
    assert rows and rows[-1]["step"] == STEPS - 1
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == list(range(STEPS))  # each step once
    buffer = DataBuffer(replace(cfg.data, path=package_file(cfg.data.path)))
    expected = [sorted(g[0].metadata["row"] for g in buffer.next_groups()) for _ in range(STEPS)]
    assert [r["data/rows"] for r in logged] == expected  # no prompt lost or repeated
    assert logged[-1]["weight_version/doctor"] == STEPS
    # every step's weights crossed the node boundary and the engines then served them
    assert all(r["sync/doctor/check_logprob_diff"] < 1e-4 for r in logged[1:])
