"""Placements of the three recipes on 1 x 8 and 2 x 8 GPUs, checked GPU by GPU against
layouts written out here; bad placements fail with errors naming the agent and field; and
``python -m kernel launch --dry-run`` prints the placement (exit 0) or rejects bad flags
(exit 2)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kernel.cli import train_config
from kernel.cluster.plan import ClusterConfig, make_placement
from kernel.run.agents import AgentSpec
from kernel.run.resources import ResourceConfig

ROOT = Path(__file__).resolve().parents[2]
ONE = ClusterConfig(nodes=1, gpus_per_node=8)
TWO = ClusterConfig(nodes=2, gpus_per_node=8)


def recipe_config(recipe: str, *flags: str):
    return train_config(["--config", str(ROOT / "recipes" / recipe / "presets/cpu.yaml"), *flags])


def gpus(node: int, roles: list[list[str]]) -> dict[str, list[str]]:
    """``node``'s GPUs 0.. mapped to the given role lists (one per GPU)."""
    return {f"node{node}/gpu{g}": r for g, r in enumerate(roles)}


# ------------------------------------------------------------------ math_solver_verifier
# One model plays solver, rewriter and selector: the owner "solver" gets the whole cluster,
# half to train (data parallel) and half to serve, synced by NCCL broadcast.


def test_math_solver_verifier_on_one_node():
    placement = make_placement(recipe_config("math_solver_verifier"), ONE)
    (g,) = placement.groups
    assert g.agents == ["solver", "rewriter", "selector"] and g.model == "smollm2"
    # 8 GPUs / 1 model = 8; half (4) train, half (4) serve
    assert placement.gpu_roles() == gpus(
        0,
        [["solver train r0"], ["solver train r1"], ["solver train r2"], ["solver train r3"],
         ["solver engine 0"], ["solver engine 1"], ["solver engine 2"], ["solver engine 3"]],
    )  # fmt: skip
    assert [r.dp for r in g.trainer] == [0, 1, 2, 3]  # TP 1 x PP 1 x DP 4
    assert (g.tensor_parallel, g.pipeline_parallel, g.data_parallel) == (1, 1, 4)
    assert [(e.node, e.port) for e in g.engines] == [(0, 30010), (0, 30011), (0, 30012), (0, 30013)]
    assert (g.router_port, g.metrics_port, g.master_port) == (30000, 29000, 29500)
    assert g.sync_transport == "distributed"


def test_math_solver_verifier_on_two_nodes():
    placement = make_placement(recipe_config("math_solver_verifier"), TWO)
    (g,) = placement.groups
    # 16 GPUs: the trainer fills node 0, the engines node 1 (engine ports count per node)
    assert placement.gpu_roles() == {
        **gpus(0, [[f"solver train r{r}"] for r in range(8)]),
        **gpus(1, [[f"solver engine {e}"] for e in range(8)]),
    }
    assert [(e.node, e.port) for e in g.engines] == [(1, 30010 + e) for e in range(8)]
    assert g.data_parallel == 8 and g.router_port == 30000


# ------------------------------------------------------------------ takes_two
# Doctor and patient are separate models: each gets its own half of the cluster, its own trainer,
# engines, router (30000, 30001) and rendezvous port (29500, 29501).

TAKES_TWO = [AgentSpec("doctor", model="doctor-ckpt"), AgentSpec("patient", model="patient-ckpt")]


def test_takes_two_on_one_node():
    placement = make_placement(TAKES_TWO, ONE)
    doctor, patient = placement.groups
    # 8 GPUs / 2 models = 4 each: 2 train + 2 serve
    assert placement.gpu_roles() == gpus(
        0,
        [["doctor train r0"], ["doctor train r1"], ["doctor engine 0"], ["doctor engine 1"],
         ["patient train r0"], ["patient train r1"], ["patient engine 0"], ["patient engine 1"]],
    )  # fmt: skip
    assert [e.port for e in doctor.engines] == [30010, 30011]
    assert [e.port for e in patient.engines] == [30012, 30013]  # same node: next ports
    assert (doctor.router_port, patient.router_port) == (30000, 30001)
    assert (doctor.master_port, patient.master_port) == (29500, 29501)
    assert (doctor.model, patient.model) == ("doctor-ckpt", "patient-ckpt")


# takes_two in one shared pool (Dr.MAS): both models train and serve on the same 8 GPUs, in turns.
def pooled(doctor: dict | None = None, patient: dict | None = None, model: str = "") -> list:
    """takes_two's two models in pool "p" (``model``: both agents' checkpoint)."""
    return [
        AgentSpec(name, model=model or f"{name}-ckpt", resources={"pool": "p", **(res or {})})
        for name, res in (("doctor", doctor), ("patient", patient))
    ]


def test_takes_two_in_one_shared_pool_on_one_node():
    low = {"mem_fraction_static": 0.4, "engine_tensor_parallel": 2}
    placement = make_placement(pooled(low, low), ONE)
    doctor, patient = placement.groups
    assert (doctor.pool, patient.pool) == ("p", "p") and doctor.colocate and patient.colocate
    assert [(r.node, r.gpu) for r in doctor.trainer] == [(0, g) for g in range(8)]
    assert [(r.node, r.gpu) for r in patient.trainer] == [(0, g) for g in range(8)]
    assert [e.gpus for e in doctor.engines] == [e.gpus for e in patient.engines]
    assert [e.gpus for e in doctor.engines] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [e.port for e in doctor.engines + patient.engines] == list(range(30010, 30018))
    roles = placement.gpu_roles()
    assert roles["node0/gpu3"] == [
        "doctor train r3", "doctor engine 1", "patient train r3", "patient engine 1"
    ]  # fmt: skip
    assert "| p " in placement.table().replace("│", "|")  # the models table names the pool


def test_a_shared_pool_that_cannot_hold_its_models_is_refused_with_the_arithmetic(tmp_path):
    from kernel.models import build_tiny_model

    with pytest.raises(ValueError) as e:  # two engines of 0.8 of the GPU each
        make_placement(pooled(), ONE)
    assert str(e.value).startswith(
        "pool 'p': each of its GPUs holds engine of doctor 0.8 x 80 = 64.0 GB + engine of "
        "patient 0.8 x 80 = 64.0 GB = 128.0 GB > cluster.gpu_memory_gb = 80"
    )
    assert "those of ['doctor', 'patient'] not counted: no local config.json" in str(e.value)
    model = str(build_tiny_model(tmp_path / "tiny", "qwen2"))  # a local config: its trainer counts
    small = ClusterConfig(nodes=1, gpus_per_node=1, gpu_memory_gb=0.001)
    low = {"mem_fraction_static": 0.1}
    with pytest.raises(ValueError, match=r"trainer of doctor [0-9.]+ GB") as e:
        make_placement(pooled(low, low, model), small)
    assert "trainer of patient" in str(e.value) and "not counted" not in str(e.value)
    placement = make_placement(pooled(low, low, model), ONE)  # 80 GB: it fits
    assert [len(g.trainer) for g in placement.groups] == [8, 8]


@pytest.mark.parametrize(
    ("doctor", "patient", "words"),
    [
        ({"train_gpus": 4}, {"train_gpus": 2}, "pool 'p' has the size 'doctor' gives it (4)"),
        ({}, {"infer_gpus": 2}, "a pool's models serve on its training GPUs"),
    ],
)
def test_shared_pool_settings_are_checked_naming_the_agent(doctor, patient, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        make_placement(pooled(doctor, patient), ONE)


def test_a_frozen_model_has_no_turn_in_a_shared_pool():
    specs = pooled()
    specs[1] = AgentSpec("patient", model="p", trainable=False, resources={"pool": "p"})
    with pytest.raises(ValueError, match="a frozen model has no training turn"):
        make_placement(specs, ONE)


def test_sglang_command_adds_the_models_own_flags_after_the_clusters(tmp_path):
    """Each planned SGLang server gets its placement flags, the cluster's sglang_args, then its
    own model's engine.sglang_args (the doctor's flags never reach the patient's servers)."""
    from kernel.cluster.run import _engine_command

    spec = {"name": "doctor", "model": "/ckpt/doctor"}
    spec["engine"] = {"sglang_args": ["--context-length", "8192"]}
    agents = json.dumps([spec, {"name": "patient", "model": "/ckpt/patient"}])
    cfg = recipe_config("takes_two", "--agents", agents)
    doctor, patient = make_placement(cfg, ONE).groups
    run = cfg.plan()
    cluster_args = ["--dtype", "bfloat16"]
    ip, out = "10.0.0.1", tmp_path
    cmd, env = _engine_command("sglang", run, doctor, doctor.engines[1], ip, out, cluster_args)
    keyed = ["-m", "kernel.engine.keyed", "sglang.launch_server"]
    assert cmd[1:4] == keyed and env == {"TANDEM_API_KEY": ""}
    assert cmd[4:] == [
        "--model-path", "/ckpt/doctor", "--host", "10.0.0.1", "--port", "30011", "--tp-size", "1",
        "--mem-fraction-static", str(doctor.mem_fraction_static),
        "--dtype", "bfloat16", "--context-length", "8192",
    ]  # fmt: skip
    cmd, _ = _engine_command("sglang", run, patient, patient.engines[0], ip, out, cluster_args)
    assert cmd[5] == "/ckpt/patient" and cmd[-2:] == cluster_args
    with pytest.raises(
        ValueError, match=r"engine\.sglang_args: \['--tp', 2\] is not a valid list\[str\]"
    ):
        bad = json.dumps([{"name": "doctor", "engine": {"sglang_args": ["--tp", 2]}}, "patient"])
        recipe_config("takes_two", "--agents", bad).validate()


def test_an_engine_api_key_reaches_sglang_and_the_embedded_server_by_environment(tmp_path):
    """Never on a command line (readable by every local user): the embedded server reads it
    from its environment, real SGLang through kernel.engine.keyed, which passes it as the
    flag SGLang needs inside the process."""
    from kernel.cluster.run import _engine_command

    spec = {"name": "doctor", "model": "/ckpt/doctor", "engine": {"api_key": "k-123"}}
    cfg = recipe_config("takes_two", "--agents", json.dumps([spec, "patient"]))
    (doctor,) = make_placement(cfg, ONE).groups
    run = cfg.plan()
    cmd, env = _engine_command("sglang", run, doctor, doctor.engines[0], "10.0.0.1", tmp_path, [])
    assert "k-123" not in " ".join(cmd) and env == {"TANDEM_API_KEY": "k-123"}
    assert cmd[1:4] == ["-m", "kernel.engine.keyed", "sglang.launch_server"]
    cmd, env = _engine_command("embedded", run, doctor, doctor.engines[0], "10.0.0.1", tmp_path, [])
    assert "k-123" not in " ".join(cmd) and env == {"TANDEM_API_KEY": "k-123"}


def test_lora_engines_get_sglangs_lora_flags_and_the_embedded_servers_theirs(tmp_path):
    """Real SGLang starts with no adapter and loads them at run time, so it is told the most
    adapters per batch, the largest rank and the target layers; the embedded server needs only
    the first two flags."""
    from kernel.cluster.run import _engine_command

    lora = {"enable_lora": True, "max_loras_per_batch": 2, "max_lora_rank": 16}
    lora["lora_target_modules"] = ["q_proj", "v_proj"]
    spec = {"name": "doctor", "model": "/ckpt/doctor", "engine": lora}
    cfg = recipe_config("takes_two", "--agents", json.dumps([spec, "patient"]))
    (doctor,) = make_placement(cfg, ONE).groups
    run = cfg.plan()
    cmd, _ = _engine_command("sglang", run, doctor, doctor.engines[0], "10.0.0.1", tmp_path, [])
    at = cmd.index("--enable-lora")
    assert cmd[at:] == [
        "--enable-lora", "--max-loras-per-batch", "2", "--max-lora-rank", "16",
        "--lora-target-modules", "q_proj", "v_proj",
    ]  # fmt: skip
    cmd, _ = _engine_command("embedded", run, doctor, doctor.engines[0], "10.0.0.1", tmp_path, [])
    assert cmd[cmd.index("--enable_lora") + 1] == "True"
    assert cmd[cmd.index("--max_loras_per_batch") + 1] == "2"
    spec["engine"] = {"enable_lora": True}  # no rank, no targets: SGLang could load none
    cfg = recipe_config("takes_two", "--agents", json.dumps([spec, "patient"]))
    (doctor,) = make_placement(cfg, ONE).groups
    with pytest.raises(ValueError, match=r"engine\.max_lora_rank"):
        _engine_command("sglang", cfg.plan(), doctor, doctor.engines[0], "10.0.0.1", tmp_path, [])


def test_takes_two_on_two_nodes():
    placement = make_placement(TAKES_TWO, TWO)
    doctor, patient = placement.groups
    # 16 GPUs / 2 models = 8 each: a node per model, 4 train + 4 serve
    assert placement.gpu_roles() == {
        **gpus(0, [[f"doctor train r{r}"] for r in range(4)]
               + [[f"doctor engine {e}"] for e in range(4)]),
        **gpus(1, [[f"patient train r{r}"] for r in range(4)]
               + [[f"patient engine {e}"] for e in range(4)]),
    }  # fmt: skip
    # engine ports count per node; routers live on node 0, the patient's rendezvous on node 1
    assert [(e.node, e.port) for e in doctor.engines] == [(0, 30010 + i) for i in range(4)]
    assert [(e.node, e.port) for e in patient.engines] == [(1, 30010 + i) for i in range(4)]
    assert (patient.trainer[0].node, patient.master_port, patient.router_port) == (1, 29501, 30001)


# ------------------------------------------------------------------ deep_research
# agent and searcher share one model, colocated: train and serve on the same GPUs, engines of
# 2 GPUs each, weights synced by tensor.

COLOCATED = json.dumps(
    [{"name": "agent", "resources": {"colocate": True, "engine_tensor_parallel": 2}}, "searcher"]
)


def test_deep_research_colocated_on_one_node():
    placement = make_placement(recipe_config("deep_research", f"--agents={COLOCATED}"), ONE)
    (g,) = placement.groups
    assert g.agents == ["agent", "searcher"] and g.colocate and g.sync_transport == "shared"
    # all 8 GPUs train (DP 8); engine k holds GPUs 2k and 2k+1
    assert placement.gpu_roles() == gpus(
        0, [[f"agent train r{r}", f"agent engine {r // 2}"] for r in range(8)]
    )
    assert [(e.gpus, e.port) for e in g.engines] == [
        ([0, 1], 30010), ([2, 3], 30011), ([4, 5], 30012), ([6, 7], 30013)
    ]  # fmt: skip
    # each engine TP rank reads the weights of the trainer rank on its GPU
    assert g.engine_ranks() == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_deep_research_colocated_on_two_nodes():
    placement = make_placement(recipe_config("deep_research", f"--agents={COLOCATED}"), TWO)
    (g,) = placement.groups
    # 16 ranks: r0-7 on node 0, r8-15 on node 1; 8 engines of 2 GPUs, 4 per node
    assert placement.gpu_roles() == {
        **gpus(0, [[f"agent train r{r}", f"agent engine {r // 2}"] for r in range(8)]),
        **gpus(1, [[f"agent train r{8 + r}", f"agent engine {4 + r // 2}"] for r in range(8)]),
    }
    assert [(e.node, e.port) for e in g.engines] == [
        (n, 30010 + i) for n in (0, 1) for i in range(4)
    ]
    assert g.data_parallel == 16
    assert g.engine_ranks() == [[2 * k, 2 * k + 1] for k in range(8)]  # node 1: ranks 8-15


def test_deep_research_default_preset_shares_one_model():
    placement = make_placement(recipe_config("deep_research"), ONE)
    assert [g.agents for g in placement.groups] == [["agent", "searcher"]]
    assert placement.gpu_roles()["node0/gpu3"] == ["agent train r3"]
    assert placement.gpu_roles()["node0/gpu4"] == ["agent engine 0"]


# ------------------------------------------------------------------ the run plan


@pytest.mark.parametrize(
    "flags",
    [["math_solver_verifier"], ["takes_two"], ["deep_research", f"--agents={COLOCATED}"]],
    ids=lambda flags: flags[0],
)
def test_the_planner_reads_the_plan_kernel_launch_resolved(flags):
    """kernel launch hands the planner the plan it resolved (Ray training on): the placement is
    the one of the config it came from, and a bare list of its agents places the same way."""
    from dataclasses import replace

    cfg = recipe_config(*flags)
    launched = replace(cfg, ray=replace(cfg.ray, enabled=True)).plan()
    owners = {s.name: replace(s, model=s.model or cfg.model) for s in cfg.agent_specs()}
    bare = [s if s.share_model_with else owners[s.name] for s in cfg.agent_specs()]
    for cluster in (ONE, TWO):
        placement = make_placement(launched, cluster).to_dict()
        assert make_placement(cfg, cluster).to_dict() == placement
        assert make_placement(bare, cluster).to_dict() == placement


# ------------------------------------------------------------------ parallel coordinates


def test_megatron_tp_pp_dp_coordinates_and_explicit_counts():
    res = {"train_gpus": 8, "infer_gpus": 4, "engine_tensor_parallel": 2}
    sizes = {"tensor_parallel": 2, "pipeline_parallel": 2}  # the trainer's, set there only
    specs = [AgentSpec("doctor", model="m", backend="megatron", resources=res, trainer=sizes)]
    placement = make_placement(specs, ClusterConfig(nodes=2, gpus_per_node=8))
    (g,) = placement.groups
    # DP = 8 / (TP 2 x PP 2) = 2; Megatron order: TP fastest, then DP, then PP
    coords = [(r.rank, r.tp, r.dp, r.pp) for r in g.trainer]
    assert coords == [
        (0, 0, 0, 0), (1, 1, 0, 0), (2, 0, 1, 0), (3, 1, 1, 0),
        (4, 0, 0, 1), (5, 1, 0, 1), (6, 0, 1, 1), (7, 1, 1, 1),
    ]  # fmt: skip
    assert g.data_parallel == 2
    # the trainer fills node 0; two 2-GPU engines on node 1; node 1's GPUs 4-7 stay idle
    assert [(e.node, e.gpus) for e in g.engines] == [(1, [0, 1]), (1, [2, 3])]
    assert placement.gpu_roles()["node1/gpu4"] == []


def test_nodes_pin_a_model():
    specs = [
        AgentSpec("doctor", model="a"),
        AgentSpec("patient", model="b", resources={"nodes": [1]}),
    ]
    placement = make_placement(specs, TWO)
    doctor, patient = placement.groups
    assert {r.node for r in patient.trainer} | {e.node for e in patient.engines} == {1}
    assert {r.node for r in doctor.trainer} == {0}


# ------------------------------------------------------------------ errors


def spec(trainer: dict | None = None, **resources):
    return [
        AgentSpec(
            "solver", model="m", backend="megatron", resources=resources, trainer=trainer or {}
        )
    ]


@pytest.mark.parametrize(
    ("agents", "cluster", "message"),
    [
        (
            [
                AgentSpec("doctor", model="a", resources={"train_gpus": 4, "infer_gpus": 4}),
                AgentSpec("patient", model="b", resources={"train_gpus": 4, "infer_gpus": 4}),
            ],
            ONE,
            "needs 16 GPUs .* cluster.nodes x cluster.gpus_per_node = 1 x 8 = 8",
        ),
        (
            spec({"tensor_parallel": 2, "pipeline_parallel": 2}, train_gpus=6, infer_gpus=2),
            ONE,
            r"agents\['solver'\].trainer: tensor_parallel x pipeline_parallel = 2 x 2 = 4 must "
            r"divide agents\['solver'\].resources.train_gpus = 6",
        ),
        (
            spec(train_gpus=4, infer_gpus=3, engine_tensor_parallel=2),
            ONE,
            r"agents\['solver'\].resources.engine_tensor_parallel = 2 must divide infer_gpus = 3",
        ),
        (
            spec(mem_fraction_static=1.0),
            ONE,
            r"agents\['solver'\].resources.mem_fraction_static must be in \(0, 1\), got 1.0",
        ),
        (spec(gpus=4), ONE, r"agents\['solver'\].resources: unknown key\(s\) \['gpus'\]"),
        (
            [AgentSpec("solver", trainer={"tensor_parallel": 2})],
            ONE,
            # the torch backend is data parallel only: its trainer section has no such field
            r"agents\['solver'\].trainer: unknown key\(s\) \['tensor_parallel'\]",
        ),
        (
            spec({"pipeline_parallel": 0}),
            ONE,
            r"agents\['solver'\].trainer: pipeline_parallel must be >= 1, got 0",
        ),
        (
            spec(train_gpus=0, infer_gpus=8),
            ONE,
            r"agents\['solver'\].resources.train_gpus: a trainable model needs >= 1",
        ),
        (
            spec(colocate=True, train_gpus=8, engine_tensor_parallel=4),
            ClusterConfig(nodes=2, gpus_per_node=6),
            # ranks 0-5 on node 0, 6-7 on node 1: engine 1 (ranks 4-7) would span both
            r"engine_tensor_parallel = 4: colocated engine 1 would span nodes \[0, 1\]",
        ),
        (
            spec(train_gpus=4, infer_gpus=12, engine_tensor_parallel=12),
            TWO,
            r"engine_tensor_parallel = 12 exceeds cluster.gpus_per_node = 8",
        ),
        (
            [AgentSpec("solver")],
            ClusterConfig(router_base_port=30010),
            "port clash on node 0: engine 0 of 'solver' and the router of 'solver' both want "
            "port 30010",
        ),
        ([AgentSpec("solver")], ClusterConfig(gpus_per_node=0), "cluster.gpus_per_node must be"),
    ],
)
def test_bad_placements_name_the_field(agents, cluster, message):
    with pytest.raises(ValueError, match=message):
        make_placement(agents, cluster)


def test_key_value_heads_must_split_over_tensor_parallel(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_key_value_heads": 2}))
    bad = [
        AgentSpec(
            "solver",
            model=str(tmp_path),
            backend="megatron",
            resources={"train_gpus": 4, "infer_gpus": 4},
            trainer={"tensor_parallel": 4},
        )
    ]
    with pytest.raises(ValueError, match=r"tensor_parallel = 4 must divide the model's 2 key/val"):
        make_placement(bad, ONE)
    # an engine may replicate KV heads: TP 4 over 2 heads is fine for SGLang, TP 3 is not
    ok = [AgentSpec("solver", model=str(tmp_path), resources={"engine_tensor_parallel": 4})]
    assert make_placement(ok, ONE).groups[0].engines[0].gpus == [4, 5, 6, 7]
    bad_engine = [
        AgentSpec(
            "solver",
            model=str(tmp_path),
            resources={"train_gpus": 2, "infer_gpus": 3, "engine_tensor_parallel": 3},
        )
    ]
    with pytest.raises(ValueError, match="engine_tensor_parallel = 3 must divide, or be a multi"):
        make_placement(bad_engine, ONE)


def test_resource_config_validate_names_the_field():
    with pytest.raises(ValueError, match="infer_gpus=2 but colocate is true"):
        ResourceConfig(colocate=True, infer_gpus=2).validate()
    with pytest.raises(ValueError, match="engine_tensor_parallel must be >= 1"):
        ResourceConfig(engine_tensor_parallel=0).validate()


def test_placement_to_dict_is_json_and_table_names_every_gpu():
    placement = make_placement(TAKES_TWO, ONE)
    data = json.loads(placement.to_json())
    assert data["cluster"]["gpus_per_node"] == 8
    assert data["groups"][1]["engines"][0] == {"index": 0, "node": 0, "gpus": [6], "port": 30012}
    text = placement.table()
    assert "patient train r1 (tp 0 dp 1 pp 0)" in text and "node0/gpu7" in text


# ------------------------------------------------------------------ CLI


def launch(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernel", "launch", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_dry_run_prints_the_placement():
    flags = ["--recipe", "math_solver_verifier", "--preset", "cpu", "--cluster.nodes", "2"]
    out = launch(*flags, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "node1/gpu7" in out.stdout and "solver engine 7" in out.stdout
    out = launch(*flags, "--dry-run", "--json")
    assert out.returncode == 0, out.stderr
    (g,) = json.loads(out.stdout)["groups"]
    assert [e["node"] for e in g["engines"]] == [1] * 8


def test_cli_bad_flags_exit_2_naming_the_field():
    base = ["--recipe", "math_solver_verifier", "--preset", "cpu", "--dry-run"]
    out = launch(*base, "--cluster.gpus_per_node", "0")
    assert out.returncode == 2 and "cluster.gpus_per_node must be >= 1" in out.stderr
    out = launch(*base, "--agents", '[{"name": "solver", "resources": {"mem_fraction_static": 2}}]')
    assert out.returncode == 2
    assert "agents['solver'].resources.mem_fraction_static must be in (0, 1)" in out.stderr
    out = launch(*base, "--cluster.nodez", "2")
    assert out.returncode == 2 and "cluster.nodez" in out.stderr


# ------------------------------------------------------------------ the recipes' run.sh (MODE=gpu)


def run_sh(recipe: str, tmp_path, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "MODE": "gpu", "OUT": str(tmp_path / "run"), "PY": sys.executable, **env}
    return subprocess.run(
        ["bash", f"recipes/{recipe}/run.sh"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def planned(out: subprocess.CompletedProcess, *keys: str) -> list[dict]:
    assert out.returncode == 0, out.stderr
    groups = json.loads(out.stdout)["groups"]
    return [{k: len(g[k]) if isinstance(g[k], list) else g[k] for k in keys} for g in groups]


KEYS = ("owner", "backend", "colocate", "tensor_parallel", "pipeline_parallel", "data_parallel",
        "trainer", "engines", "sync_transport")  # fmt: skip


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (  # split: half train (Megatron TP 2 x PP 2), half serve, NCCL broadcast
            {"TP": "2", "PP": "2"},
            ("solver", "megatron", False, 2, 2, 1, 4, 4, "distributed"),
        ),
        (  # colocated: 8 ranks (DP 8) and four 2-GPU SGLang servers on the same GPUs
            {"PLACEMENT": "colocate", "ENGINE_TP": "2", "BACKEND": "torch"},
            ("solver", "torch", True, 1, 1, 8, 8, 4, "shared"),
        ),
    ],
)
def test_math_run_sh_gpu_mode_plans_through_kernel_launch(tmp_path, env, expected):
    """run.sh MODE=gpu turns its environment variables into one validated placement (DRY_RUN=json
    stops there); without DRY_RUN the same command runs it on Ray."""
    out = run_sh("math_solver_verifier", tmp_path, MODEL="/ckpt/m", DRY_RUN="json", **env)
    assert planned(out, *KEYS) == [dict(zip(KEYS, expected, strict=True))]
    (g,) = json.loads(out.stdout)["groups"]
    assert g["agents"] == ["solver", "rewriter", "selector"] and g["model"] == "/ckpt/m"


def test_takes_two_run_sh_gives_each_model_its_own_gpus(tmp_path):
    out = run_sh(
        "takes_two", tmp_path, DOCTOR_MODEL="/ckpt/d", PATIENT_MODEL="/ckpt/p", TP="2",
        PATIENT_TRAIN_GPUS="2", PATIENT_INFER_GPUS="1", DRY_RUN="json",
    )  # fmt: skip
    # the patient asked for 2 + 1 GPUs; the doctor takes the other 5: 2 train (TP 2), 3 serve
    assert planned(out, *KEYS, "model", "router_port") == [
        {**dict(zip(KEYS, ("doctor", "megatron", False, 2, 1, 1, 2, 3, "distributed"),
                    strict=True)), "model": "/ckpt/d", "router_port": 30000},
        {**dict(zip(KEYS, ("patient", "megatron", False, 2, 1, 1, 2, 1, "distributed"),
                    strict=True)), "model": "/ckpt/p", "router_port": 30001},
    ]  # fmt: skip


def test_code_pair_run_sh_plans_two_models_with_an_even_share(tmp_path):
    models = {"HELPER_MODEL": "/ckpt/h", "MAIN_MODEL": "/ckpt/m"}
    out = run_sh("code_pair", tmp_path, DRY_RUN="json", **models)
    assert planned(out, *KEYS, "model") == [
        {**dict(zip(KEYS, ("helper", "megatron", False, 1, 1, 2, 2, 2, "distributed"),
                    strict=True)), "model": "/ckpt/h"},
        {**dict(zip(KEYS, ("main", "megatron", False, 1, 1, 2, 2, 2, "distributed"),
                    strict=True)), "model": "/ckpt/m"},
    ]  # fmt: skip


def test_debate_run_sh_plans_one_model_for_both_debaters(tmp_path):
    out = run_sh("debate", tmp_path, MODEL="/ckpt/m", TP="2", ENGINE_TP="2", DRY_RUN="json")
    assert planned(out, *KEYS) == [
        dict(zip(KEYS, ("alice", "megatron", False, 2, 1, 2, 4, 2, "distributed"), strict=True))
    ]
    (g,) = json.loads(out.stdout)["groups"]
    assert g["agents"] == ["alice", "bob"] and g["model"] == "/ckpt/m"


def test_gym_run_sh_plans_its_agent(tmp_path):
    out = run_sh("gym", tmp_path, MODEL="/ckpt/m", BACKEND="torch", DRY_RUN="json")
    assert planned(out, *KEYS) == [
        dict(zip(KEYS, ("default", "torch", False, 1, 1, 4, 4, 4, "distributed"), strict=True))
    ]


def test_deep_research_run_sh_plans_before_starting_the_retriever(tmp_path):
    out = run_sh("deep_research", tmp_path, MODEL="/ckpt/m", TRAIN_GPUS="6", DRY_RUN="json")
    assert planned(out, *KEYS) == [
        dict(zip(KEYS, ("agent", "megatron", False, 1, 1, 6, 6, 2, "distributed"), strict=True))
    ]
    assert not (tmp_path / "run" / "logs" / "retriever.log").exists()  # nothing started


@pytest.mark.parametrize(
    ("recipe", "env", "message"),
    [
        ("math_solver_verifier", {"MODEL": "/m", "PLACEMENT": "both"},
         "PLACEMENT must be split or colocate"),
        ("takes_two", {"DOCTOR_MODEL": "/d"}, "set PATIENT_MODEL"),
        ("code_pair", {"HELPER_MODEL": "/h"}, "set MAIN_MODEL"),
        ("deep_research", {"MODEL": "/m", "TRAIN_GPUS": "9", "DRY_RUN": "1"}, "infer_gpus"),
    ],
)  # fmt: skip
def test_run_sh_gpu_mode_refuses_bad_settings(tmp_path, recipe, env, message):
    out = run_sh(recipe, tmp_path, **env)
    assert out.returncode != 0 and message in out.stderr, out.stderr
