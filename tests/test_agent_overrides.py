"""Every per-agent override is honoured or refused, never accepted and ignored (issue 65).

For every field of every section an agent's spec overrides (``kernel.run.agents.OVERRIDABLE``,
the fields read from the dataclasses, so a new field is covered as soon as it exists), the
agent's value is either read back from what the run builds from the plan -- the agent handles
(sampling, lengths), the trainer's arguments (optim, loss, trainer, LoRA adapters), the engine
pool (engine), the cluster placement (resources) -- or refused at validation, naming
``agents[NAME].SECTION.FIELD``. Three kinds of agent: one that owns its model, one sharing
another's model, one another job plays (remote). No model is loaded.
"""

from __future__ import annotations

import asyncio
import json
import types
import typing
from dataclasses import MISSING, fields, replace
from pathlib import Path

import pytest

from kernel.advantages import AdvantageConfig
from kernel.cluster.plan import ClusterConfig, make_placement
from kernel.engine.pool import EngineConfig
from kernel.loss import LossConfig
from kernel.run import runtime
from kernel.run.agents import OVERRIDABLE, PER_AGENT, REMOTE, RUN_WIDE, AgentSpec
from kernel.run.config import RolloutConfig, TrainConfig
from kernel.run.jobs import QueueConfig
from kernel.run.resources import ResourceConfig
from kernel.sample import Sample
from kernel.train.optim import OptimConfig
from kernel.train.settings import (
    DEFAULT_TARGETS,
    CriticConfig,
    LoraConfig,
    MegatronTrainerConfig,
    TorchTrainerConfig,
)

SECTIONS = {
    "rollout": RolloutConfig,
    "optim": OptimConfig,
    "loss": LossConfig,
    "trainer": TorchTrainerConfig,  # backend torch; MegatronTrainerConfig for backend megatron
    "engine": EngineConfig,
    "lora": LoraConfig,
    "resources": ResourceConfig,
}

# A value other than the default for the fields whose default says nothing about what a valid
# other value is (strings, lists, None, choices); the rest change by rule (``_changed``). A
# dict gives the fields that must come with it (an engine's lora_paths needs enable_lora).
VALUES = {
    ("rollout", "top_p"): 0.9,
    ("rollout", "leftover"): "abort",
    ("optim", "betas"): (0.8, 0.99),
    ("optim", "decay"): "cosine",
    ("optim", "dtype"): "bfloat16",
    ("loss", "dual_clip"): 3.0,
    ("loss", "agg"): {"agg": "seq_mean_token_sum_norm", "max_len": 100},
    ("loss", "max_len"): 100,
    ("loss", "kl_estimator"): "k1",
    ("loss", "tis_cap"): 3.0,
    ("loss", "old_logprobs"): "rollout",
    ("trainer", "device"): "cpu",
    ("trainer", "attn_implementation"): "eager",
    ("trainer", "optimizer"): "distributed",  # megatron's
    ("engine", "urls"): ["http://127.0.0.1:9"],
    ("engine", "router_url"): {"urls": ["http://127.0.0.1:9"], "router_url": "http://r:8"},
    ("engine", "device"): "cuda:1",
    ("engine", "num_threads"): 2,
    ("engine", "api_key"): "key-123",
    ("engine", "sglang_args"): ["--context-length", "4096"],
    ("engine", "lora_paths"): {"enable_lora": True, "lora_paths": ["x=/adapters/x"]},
    ("engine", "lora_target_modules"): ["q_proj"],
    ("lora", "rank"): 8,
    ("lora", "target_modules"): ["q_proj", "v_proj"],
    ("lora", "path"): "ADAPTER",  # the adapter folder the test writes
    ("resources", "train_gpus"): 2,
    ("resources", "infer_gpus"): 3,
    ("resources", "engine_tensor_parallel"): 2,
    ("resources", "mem_fraction_static"): 0.5,
    ("resources", "nodes"): [1],
    ("resources", "pool"): "p",
}

# How the run reads an agent's rollout settings: its handle (kernel.run.agents.AgentHandle).
ROLLOUT_READ = {
    "temperature": lambda h: h.sampling["temperature"],
    "top_p": lambda h: h.sampling["top_p"],
    "max_response_len": lambda h: h.max_response_len,
    "max_context_len": lambda h: h.max_context_len,
}
# How the cluster placement of a model shows its resources (kernel.cluster.plan.PlacedModel).
RESOURCES_READ = {
    "train_gpus": lambda g: len(g.trainer),
    "infer_gpus": lambda g: sum(len(e.gpus) for e in g.engines),
    "colocate": lambda g: g.colocate,
    "engine_tensor_parallel": lambda g: g.engine_tensor_parallel,
    "mem_fraction_static": lambda g: g.mem_fraction_static,
    "nodes": lambda g: sorted({r.node for r in g.trainer} | {e.node for e in g.engines}),
    "pool": lambda g: g.pool,
}
# How this job reads the engine settings of an agent another job plays: its client of them.
REMOTE_ENGINE_READ = {
    "request_timeout_s": lambda h: h.clients[0].config.timeout_s,
    "api_key": lambda h: h.clients[0].config.api_key,
    "batch_window_ms": lambda h: h.batcher.window_s * 1000,
}


def _cases(kinds=("torch", "megatron")) -> list:
    cases = [(s, f.name, "torch") for s, cls in SECTIONS.items() for f in fields(cls)]
    if "megatron" in kinds:
        cases += [("trainer", f.name, "megatron") for f in fields(MegatronTrainerConfig)]
    return cases


def _changed(section: str, name: str, backend: str, adapter: Path) -> dict:
    """The override of ``section.name`` the test gives (with any field it needs beside it)."""
    cls = MegatronTrainerConfig if (section, backend) == ("trainer", "megatron") else None
    cls = cls or SECTIONS[section]
    f = next(f for f in fields(cls) if f.name == name)
    value = VALUES.get((section, name), MISSING)
    if value == "ADAPTER":
        value = str(adapter)
    if value is MISSING:
        default = f.default if f.default is not MISSING else f.default_factory()
        if isinstance(default, bool):
            value = not default
        elif isinstance(default, int):
            value = default + 1
        elif isinstance(default, float):
            value = round(default + 0.5, 3) if default < 0.5 else default * 2
        else:
            raise AssertionError(f"give tests/test_agent_overrides.py a value for {section}.{name}")
    return value if isinstance(value, dict) else {name: value}


@pytest.fixture
def adapter(tmp_path) -> Path:
    """A PEFT adapter folder with the settings of the run's LoRA section in these tests."""
    folder = tmp_path / "adapter"
    folder.mkdir()
    saved = {"r": 4, "lora_alpha": 32.0, "lora_dropout": 0.0, "target_modules": DEFAULT_TARGETS}
    (folder / "adapter_config.json").write_text(json.dumps(saved))
    return folder


@pytest.fixture
def no_files(monkeypatch):
    """Build what the run builds from a plan without touching a model: no model files are
    materialised and a trainer is only its arguments."""
    monkeypatch.setattr(runtime, "check_model", lambda name: name)
    monkeypatch.setattr(runtime, "materialize_model", lambda name, out: name)
    monkeypatch.setattr(
        runtime, "build_trainer", lambda *a, **kw: types.SimpleNamespace(a=a, kw=kw)
    )


def _config(section: str, backend: str, agents: list[AgentSpec], **run) -> TrainConfig:
    if section == "lora":
        run["lora"] = LoraConfig(rank=4)  # a LoRA model: every trainable agent has an adapter
    cfg = TrainConfig(agents=agents, **run)
    cfg.data.path = "x.jsonl"
    return cfg


def _built(plan, tmp_path):
    """The models, trainers and agent handles the run builds from ``plan`` (runtime.open)."""
    models = runtime.plan_models(plan, tmp_path, {})
    for m in models:
        m.generators = [object()]
        m.trainer = runtime.place_trainer(plan.cfg, m, None)
    remote = {r.owner: None for r in plan.remote}
    return models, runtime.agent_handles(plan, models, None, remote)


def _read(section: str, agent: str, plan, tmp_path) -> typing.Callable[[str], object]:
    """``key -> the value the run uses for agent's section.key``, from what it builds."""
    models, handles = _built(plan, tmp_path)
    model = next(m for m in models if agent in {s.name for s in m.agents})
    if section == "rollout":
        return lambda key: ROLLOUT_READ[key](handles[agent])
    if section == "engine":
        return lambda key: getattr(model.pool.cfg, key)
    if section == "resources":
        placed = make_placement(plan, ClusterConfig(nodes=2, gpus_per_node=8))
        group = next(g for g in placed.groups if agent in g.agents)
        return lambda key: RESOURCES_READ[key](group)
    if section == "lora":
        adapters = model.trainer.kw["adapters"]
        return lambda key: getattr(adapters[agent], key)
    args = dict(zip(("path", "optim", "loss", "trainer"), model.trainer.a, strict=False))
    return lambda key: getattr(args[section], key)


def _check_read_back(read, override: dict, section: str, name: str) -> None:
    for key, value in override.items():
        if section == "rollout" and key not in ROLLOUT_READ:
            raise AssertionError(f"rollout.{name} is per agent: add how its handle reads it")
        if section == "resources" and key not in RESOURCES_READ:
            raise AssertionError(f"resources.{name}: add how the cluster placement shows it")
        got = read(key)
        assert got == (tuple(value) if isinstance(got, tuple) else value), (section, key)


# ---------------------------------------------------------------- the sections, field by field


def test_every_overridable_section_is_covered():
    assert set(SECTIONS) == set(OVERRIDABLE)
    assert set(RUN_WIDE) <= set(OVERRIDABLE) and set(PER_AGENT) <= set(OVERRIDABLE)
    for section, why in RUN_WIDE.items():
        assert set(why) <= {f.name for f in fields(SECTIONS[section])}, section


@pytest.mark.parametrize(("section", "name", "backend"), _cases())
def test_an_agents_own_model_honours_or_refuses_each_override(
    section, name, backend, tmp_path, adapter, no_files
):
    """The agent owning its model: its value is the one its handle, trainer, engines or
    placement get (and another agent's model keeps the run's), or the field is run-wide and
    refused, naming it."""
    override = _changed(section, name, backend, adapter)
    doctor = AgentSpec("doctor", backend=backend, **{section: override})
    agents = [doctor] if backend == "megatron" else [doctor, AgentSpec("patient", model="p")]
    cfg = _config(section, backend, agents)
    if name in RUN_WIDE.get(section, {}):
        with pytest.raises(ValueError, match=rf"agents\['doctor'\]\.{section}\.{name}: .*run-wide"):
            cfg.plan()
        return
    plan = cfg.plan()
    _check_read_back(_read(section, "doctor", plan, tmp_path), override, section, name)
    if backend == "torch" and section != "resources":  # the other model: the run's own value
        run_section = getattr(cfg, section)
        read = _read(section, "patient", plan, tmp_path)
        for key in override:
            if not (section == "engine" and key.startswith(("enable_lora", "lora_", "max_lora"))):
                assert read(key) == getattr(run_section, key), (section, key)


@pytest.mark.parametrize(("section", "name", "backend"), _cases(kinds=("torch",)))
def test_an_agent_sharing_a_model_sets_only_its_own_sampling_and_adapter(
    section, name, backend, tmp_path, adapter, no_files
):
    """An agent sharing a model: its rollout and lora overrides are its own (read back from
    its handle and adapter); every field of its model's sections is refused, naming it."""
    override = _changed(section, name, backend, adapter)
    nurse = AgentSpec("nurse", share_model_with="doctor", **{section: override})
    cfg = _config(section, backend, [AgentSpec("doctor"), nurse])
    if section not in PER_AGENT or name in RUN_WIDE.get(section, {}) or name == "temperature":
        # a trained agent samples at its model's one training temperature (freeze it to differ)
        with pytest.raises(ValueError, match=rf"agents\['nurse'\]\.{section}\.{name}[:,]"):
            cfg.plan()
        return
    _check_read_back(_read(section, "nurse", cfg.plan(), tmp_path), override, section, name)


@pytest.mark.parametrize(("section", "name", "backend"), _cases(kinds=("torch",)))
def test_a_remote_agent_sets_only_its_sampling_and_how_it_is_called(
    section, name, backend, tmp_path, adapter, no_files
):
    """An agent another job plays (remote): its sampling and this job's client of its engines
    are read back from its handle; what that job runs (its trainer, engines, placement,
    adapters) is refused, naming the field."""
    override = _changed(section, name, backend, adapter)
    patient = AgentSpec("patient", model="p", remote=True, **{section: override})
    queue = QueueConfig(url="redis://127.0.0.1:1/0")
    cfg = _config(section, backend, [AgentSpec("doctor"), patient], queue=queue)
    allowed = REMOTE.get(section, ())
    if name in RUN_WIDE.get(section, {}) or (allowed is not None and name not in allowed):
        with pytest.raises(ValueError, match=rf"agents\['patient'\]\.{section}\.{name}[:,]"):
            cfg.plan()
        return
    plan = cfg.plan()
    _, handles = _built(plan, tmp_path)
    readers = ROLLOUT_READ if section == "rollout" else REMOTE_ENGINE_READ
    for key, value in override.items():
        assert readers[key](handles["patient"]) == pytest.approx(value), (section, key)


def test_a_frozen_agent_sharing_a_model_samples_at_its_own_temperature(tmp_path, no_files):
    agents = [
        AgentSpec("doctor"),
        AgentSpec("greedy", share_model_with="doctor", trainable=False, rollout={"temperature": 0}),
    ]
    cfg = _config("rollout", "torch", agents)
    _, handles = _built(cfg.plan(), tmp_path)
    assert handles["greedy"].sampling["temperature"] == 0
    assert handles["doctor"].sampling["temperature"] == 1.0


# ---------------------------------------------------------------- the fixes behind the refusals


def test_engine_lora_settings_add_to_what_the_adapters_need(tmp_path, no_files):
    """On a LoRA model the run sets the engines' LoRA fields from the adapters; an agent's own
    values are kept beside them (a larger max_lora_rank, more target modules, more adapters),
    and a max_lora_rank too small for the adapters is refused."""
    engine = {"max_lora_rank": 64, "lora_target_modules": ["gate_proj"]}
    engine |= {"enable_lora": True, "lora_paths": ["extra=/adapters/extra"]}
    cfg = _config("lora", "torch", [AgentSpec("doctor", engine=engine, lora={"rank": 8})])
    served = _read("engine", "doctor", cfg.plan(), tmp_path)
    assert served("max_lora_rank") == 64
    assert set(served("lora_target_modules")) == {"gate_proj", *DEFAULT_TARGETS}
    assert served("lora_paths") == ["extra=/adapters/extra"]
    small = _config("lora", "torch", [AgentSpec("doctor", engine={"max_lora_rank": 2})])
    with pytest.raises(ValueError, match=r"agents\['doctor'\]\.engine\.max_lora_rank"):
        small.plan()


def test_lora_settings_beside_a_path_must_be_the_folders(adapter):
    """An adapter folder fixes its rank, alpha, dropout and targets: a different value given
    beside its path is refused, naming it; the folder's own value is accepted."""
    same = AgentSpec("doctor", lora={"path": str(adapter), "rank": 4, "alpha": 32})
    _config("lora", "torch", [same]).plan()
    for key, value in {"rank": 8, "alpha": 8.0, "dropout": 0.1, "target_modules": ["q"]}.items():
        spec = AgentSpec("doctor", lora={"path": str(adapter), key: value})
        with pytest.raises(ValueError, match=rf"agents\['doctor'\]\.lora\.{key}: .*folder's"):
            _config("lora", "torch", [spec]).plan()


# ---------------------------------------------------------------- the run's one critic (MAAC)


def test_the_runs_one_critic_trains_with_the_settings_it_is_built_with(tmp_path):
    """MAAC (critic.scope run): the critic's device, micro-batches and epochs all come from the
    first trained model's trainer settings, the owner's overrides applied (it took its epochs
    from the run's trainer section before, while built from the model's)."""
    cfg = TrainConfig(
        agents=[
            AgentSpec("doctor", trainer={"ppo_epochs": 3, "max_tokens_per_microbatch": 512}),
            AgentSpec("patient", model="p", trainer={"ppo_epochs": 2}),
        ],
        advantage=AdvantageConfig(estimator="gae"),
        critic=CriticConfig(scope="run"),
    )
    cfg.data.path = "x.jsonl"
    plan = cfg.plan()
    assert cfg.trainer.ppo_epochs == 1
    assert plan.critic_trainer is plan.model_of("doctor").settings.trainer
    assert (plan.critic_trainer.ppo_epochs, plan.critic_trainer.max_tokens_per_microbatch) == (
        3,
        512,
    )
    assert replace(cfg, critic=CriticConfig()).plan().critic_trainer is None  # scope model

    class Critic:  # what critic_step asks of kernel.train.critic.Critic
        settings = plan.critic_trainer

        def advantages(self, samples):
            return types.SimpleNamespace(samples=samples), {}

        def train(self, step, minibatches):
            self.passes = minibatches
            return {}

    critic = Critic()
    models = [types.SimpleNamespace(trained={"doctor"}), types.SimpleNamespace(trained=set())]
    rt = types.SimpleNamespace(models=models, critic=critic)
    samples = [Sample(prompt_ids=[1], agent="doctor"), Sample(prompt_ids=[2], agent="doctor")]
    asyncio.run(runtime.Runtime.critic_step(rt, samples))
    assert critic.passes == [[0, 1]] * 3
