"""``kernel launch`` without --dry-run, on a local Ray cluster that declares fake GPUs: the toy
task runs as placed -- a trainer of two Ray actors (gloo) on its placed GPUs, two embedded
engines started by Ray actors on their planned ports behind the real sglang-router on its planned
port. Disaggregated (distributed weight sync): each step's weights reach both engines. Colocated
(shared sync: each trainer rank's shared copy to the engine on its GPU): the engines release
their memory for every training step and resume it, and what they generate afterwards carries
the trainer's logprobs. A Megatron trainer gets the placement's
tensor-parallel size. Afterwards every process the launch started -- engines, routers, their
actors, the trainer ranks -- is gone."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from kernel.cli import train_config
from kernel.cluster.plan import ClusterConfig, make_placement
from kernel.cluster.run import _engine_command, run_placement
from tests.ports import plan_ports
from tests.procs import alive, descendants_named

pytestmark = pytest.mark.slow  # the slow tier: scripts/test.sh --slow

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "kernel" / "presets" / "toy.yaml"
STEPS = 3


def toy(tmp_path, resources: dict, backend: str = "torch", trainer: dict | None = None):
    spec = {"name": "default", "backend": backend, "resources": resources}
    agents = json.dumps([spec | {"trainer": trainer or {}}])
    flags = [
        f"--output_dir={tmp_path}",
        f"--num_steps={STEPS}",
        f"--agents={agents}",
        "--data.prompts_per_step=2",
        "--trainer.device=cpu",
        "--engine.max_batch_size=16",
        "--sync.check_every=1",  # the toy preset checks every 10th push; these tests, each
    ]
    return train_config([f"--config={TOY}", *flags])


def cluster(gpus: int) -> ClusterConfig:
    return ClusterConfig(
        nodes=1,
        gpus_per_node=gpus,
        engine_server="embedded",
        **plan_ports(),
        startup_timeout_s=180,
    )


def started(tmp_path) -> dict:
    return json.loads((tmp_path / "launch" / "processes.json").read_text())


def _server_state(url: str) -> dict:
    return httpx.get(f"{url}/server_info", timeout=10).json()["internal_states"][0]


ACTORS = ("ServiceActor", "TrainerRankActor")  # the launch's actor classes


def check_all_stopped(tmp_path) -> None:
    procs = started(tmp_path)
    pids = [p["pid"] for p in procs["engines"] + procs["routers"]]
    assert [pid for pid in pids if alive(pid)] == []  # stopped by PID before run_placement returns
    # ray.kill returns before the actor's process has exited; a Megatron rank took over 20 s to
    # exit on 2 busy cores (the slow tier beside a learning run)
    end = time.monotonic() + 60
    while descendants_named(*ACTORS) and time.monotonic() < end:
        time.sleep(0.2)
    assert descendants_named(*ACTORS) == []


def test_launch_disaggregated_trains_on_ray_ranks_and_syncs_both_engines(tmp_path, fake_gpu_ray):
    cfg = toy(tmp_path, {"train_gpus": 2, "infer_gpus": 2})
    placement = make_placement(cfg, cluster(4))
    (g,) = placement.groups
    assert [r.gpu for r in g.trainer] == [0, 1] and [e.gpus for e in g.engines] == [[2], [3]]
    assert g.sync_transport == "distributed"
    versions, routed = [], []

    def on_step(row):
        procs = started(tmp_path)
        urls = [e["url"] for e in procs["engines"]]
        assert [int(u.rsplit(":", 1)[1]) for u in urls] == [e.port for e in g.engines]  # planned
        versions.append(
            [httpx.get(f"{u}/get_weight_version").json()["weight_version"] for u in urls]
        )
        (router,) = procs["routers"]
        assert router["url"].endswith(f":{g.router_port}")
        workers = httpx.get(f"{router['url']}/workers").json()["workers"]
        routed.append(sorted(w["url"] for w in workers) == sorted(urls))
        # trainer ranks, engine actors, router actor
        assert len(descendants_named(*ACTORS)) == 2 + 2 + 1

    rows = run_placement(cfg, placement, on_step=on_step)
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert [r["weight_version"] for r in rows] == list(range(1, STEPS + 1))
    assert versions == [[str(s + 1)] * 2 for s in range(STEPS)]  # both engines, every step
    assert routed == [True] * STEPS  # the router serves both engines throughout
    assert all(r["staleness/dropped"] == 0 for r in rows)
    check_all_stopped(tmp_path)


def test_launch_colocated_releases_and_resumes_engine_memory_around_training(
    tmp_path, fake_gpu_ray
):
    cfg = toy(tmp_path, {"train_gpus": 2, "colocate": True})
    placement = make_placement(cfg, cluster(2))
    (g,) = placement.groups
    assert [e.gpus for e in g.engines] == [[0], [1]] and g.sync_transport == "shared"
    assert g.engine_ranks() == [[0], [1]]  # each engine reads the copy of the rank on its GPU
    counts = []

    def on_step(row):
        states = [_server_state(e["url"]) for e in started(tmp_path)["engines"]]
        counts.append(
            [
                (s["num_memory_releases"], s["num_memory_resumes"], s["memory_released"])
                for s in states
            ]
        )

    rows = run_placement(cfg, placement, on_step=on_step)
    assert [r["step"] for r in rows] == list(range(STEPS))
    # one release and one resume per engine per training step, nothing left released
    assert counts == [[(s + 1, s + 1, [])] * 2 for s in range(STEPS)]
    # steps 1 and 2 trained on samples generated after a release, resume and shared sync (rank
    # 0's shared memory to engine 0, rank 1's to engine 1): the engines' logprobs are the
    # trainer's (resumed weights are zeros until the sync refills them)
    assert all(r["train/logprob_diff"] < 1e-4 for r in rows)
    assert [r["weight_version"] for r in rows] == list(range(1, STEPS + 1))
    check_all_stopped(tmp_path)


def test_launch_a_shared_pool_trains_two_models_in_turns_on_the_same_gpus(tmp_path, fake_gpu_ray):
    """Dr.MAS's shared pool: the doctor's and the patient's models each train on both GPUs and
    serve there, taking turns. The patient trains every second step; at the others its engines
    give up only their KV cache while the doctor trains, and serve its weights unchanged after
    (its next step's samples still carry the trainer's logprobs)."""
    pool = {"pool": "p", "mem_fraction_static": 0.4}
    agents = [
        {"name": "doctor", "model": "tiny-char", "resources": {**pool, "train_gpus": 2}},
        {"name": "patient", "model": "tiny-char", "update_every": 2, "resources": pool},
    ]
    flags = [f"--output_dir={tmp_path}", f"--num_steps={STEPS}", f"--agents={json.dumps(agents)}"]
    flags += ["--data.prompts_per_step=2", "--trainer.device=cpu", "--sync.check_every=1"]
    cfg = train_config(["--preset", "toy_duo", *flags])
    placement = make_placement(cfg, cluster(2))
    doctor, patient = placement.groups
    assert [e.gpus for e in doctor.engines] == [e.gpus for e in patient.engines] == [[0], [1]]
    assert [r.gpu for r in doctor.trainer] == [r.gpu for r in patient.trainer] == [0, 1]
    released = []

    def on_step(row):
        engines = started(tmp_path)["engines"]
        states = {e["owner"]: [] for e in engines}
        for e in engines:
            s = _server_state(e["url"])
            states[e["owner"]].append((s["num_memory_releases"], s["memory_released"]))
        released.append(states)

    rows = run_placement(cfg, placement, on_step=on_step)
    assert [r["step"] for r in rows] == list(range(STEPS))
    # every engine of the pool gives its memory up at every step's turns, and has it back after
    assert released == [
        {"doctor": [(s + 1, [])] * 2, "patient": [(s + 1, [])] * 2} for s in range(STEPS)
    ]
    assert [r["weight_version/doctor"] for r in rows] == [1, 2, 3]
    assert [r["weight_version/patient"] for r in rows] == [1, 1, 2]  # trained at steps 0 and 2
    # step 2 trained the patient on samples its engines made after step 1's KV-only release
    assert all(r["train/doctor/logprob_diff"] < 1e-4 for r in rows)
    assert rows[2]["train/patient/logprob_diff"] < 1e-4
    check_all_stopped(tmp_path)


def test_launch_trains_megatron_at_the_planned_tensor_parallel_size(tmp_path, fake_gpu_ray):
    """backend megatron: the trainer section's TP=2 sizes the placement and reaches the trainer (the
    two Ray ranks split every layer), its weights are gathered into HF layout for the
    distributed sync, and the engines then sample with the trainer's logprobs (the rollout/train
    gap and the post-sync check)."""
    pytest.importorskip("megatron.core")
    sizes = {"tensor_parallel": 2}
    cfg = toy(tmp_path, {"train_gpus": 2, "infer_gpus": 2}, "megatron", trainer=sizes)
    placement = make_placement(cfg, cluster(4))
    (g,) = placement.groups
    assert (g.backend, g.tensor_parallel, g.data_parallel) == ("megatron", 2, 1)
    rows = run_placement(cfg, placement)
    assert [r["weight_version"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["train/logprob_diff"] < 1e-4 for r in rows[1:])
    # each step's row carries the check of the previous step's push (run beside the rollout)
    assert "sync/check_logprob_diff" not in rows[0]
    assert all(r["sync/check_logprob_diff"] < 1e-4 for r in rows[1:])
    check_all_stopped(tmp_path)


def test_launch_refuses_a_plan_bigger_than_the_ray_cluster(tmp_path, fake_gpu_ray):
    cfg = toy(tmp_path, {"train_gpus": 4, "infer_gpus": 4})
    with pytest.raises(ValueError, match=r"cluster\.gpus_per_node=8"):
        run_placement(cfg, make_placement(cfg, cluster(8)))
    assert not (tmp_path / "launch").exists()  # nothing was started


def test_a_colocated_sglang_engine_is_started_to_release_its_memory(tmp_path):
    """Real SGLang colocated: its command asks for the memory saver (release/resume) at the
    engine's TP size and memory share; its engine TP ranks read the trainer ranks' copies."""
    cfg = toy(tmp_path, {"train_gpus": 4, "colocate": True, "engine_tensor_parallel": 2})
    (g,) = make_placement(cfg, cluster(4)).groups
    cmd, env = _engine_command("sglang", cfg.plan(), g, g.engines[1], "10.0.0.1", tmp_path, [])
    assert cmd[1:4] == ["-m", "kernel.engine.keyed", "sglang.launch_server"]
    assert env == {"TANDEM_API_KEY": ""} and "--enable-memory-saver" in cmd
    assert cmd[cmd.index("--tp-size") + 1] == "2"
    assert cmd[cmd.index("--port") + 1] == str(g.engines[1].port)
    assert g.engine_ranks() == [[0, 1], [2, 3]]
