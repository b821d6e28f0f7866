"""The cluster planner: a run's ``Placement`` on a cluster, which GPU of which node trains or
serves which model (each model a ``PlacedModel``).

Each model group (the agents that share one model) gets
- a trainer: ``train_gpus`` ranks of torch.distributed (Megatron's tensor x pipeline x data
  parallel, or the torch backend's data parallel), each rank one GPU;
- a pool of engines (SGLang servers), each ``engine_tensor_parallel`` GPUs of one node, behind the
  group's own sglang-router;
- a weight-sync transport implied by the placement: ``shared`` when colocated (train and infer on
  the same GPUs, SGLang releasing and resuming its memory around training; each engine TP rank
  reads the weights the trainer rank on its GPU shares by CUDA IPC), ``distributed`` (an NCCL
  broadcast from trainer rank 0 to the engines) when disaggregated.

GPUs are handed out first-fit, node by node, group by group in the order of ``agents``: a trainer
takes blocks of ``tensor_parallel`` GPUs (a tensor-parallel group never spans nodes, its
all-reduces need NVLink; data and pipeline parallel may span nodes), an engine takes one block of
``engine_tensor_parallel`` GPUs. The planner reads each model from the run's plan
(``RunPlan.models``, ``kernel.run.config``), where its owner's overrides are resolved and
checked: its resources (a ``kernel.run.resources.ResourceConfig``: GPU counts, colocation,
engine size; left empty, every group takes an even share of the GPUs, half to train and half
to serve) and its trainer's tensor- and pipeline-parallel sizes (``ModelPlan.trainer_parallel``:
the megatron trainer section's, the one place they are set).

``make_placement`` validates everything a launch would trip on later, with errors naming the
agent and field; ``Placement.table()`` renders it for ``kernel launch --dry-run`` and
``Placement.to_dict()`` as JSON. Nothing here imports Ray, SGLang or touches a GPU;
``kernel.cluster.run.run_placement`` runs a placement on Ray (``kernel launch`` without
--dry-run), with ``ClusterConfig.engine_server`` choosing what the engines run.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from kernel.run.agents import model_groups
from kernel.run.config import ModelPlan, TrainConfig, resolve
from kernel.run.resources import ResourceConfig

ENGINE_SERVERS = ("auto", "sglang", "embedded")


@dataclass
class ClusterConfig:
    """The cluster a run is placed on (``kernel launch --cluster.*``)."""

    nodes: int = 1
    """Nodes (machines) of the cluster."""
    gpus_per_node: int = 8
    """GPUs of each node."""
    address: str | None = None
    """Ray cluster to connect to (e.g. ray://head:10001 or auto); None starts a local one."""
    router_base_port: int = 30000
    """Port of the first model's sglang-router (on node 0); the next model's is one more."""
    engine_base_port: int = 30010
    """Port of the first engine on each node; the next engine on that node is one more."""
    metrics_base_port: int = 29000
    """Port of the first router's Prometheus exporter (node 0); one more per model."""
    master_base_port: int = 29500
    """torch.distributed rendezvous port of the first trainer (on its rank 0's node)."""
    engine_server: str = "auto"
    """What each planned engine runs: sglang (python -m sglang.launch_server, GPU nodes),
    embedded (python -m kernel.engine, the kernel's own server: CPU, tests) or auto
    (sglang when the Ray cluster has GPUs, embedded without)."""
    sglang_args: list[str] = field(default_factory=list)
    """More flags for every sglang.launch_server, passed verbatim (e.g. --dtype bfloat16); a
    model's own engine.sglang_args follow them."""
    startup_timeout_s: float = 600.0
    """How long an engine or router may take to answer /health after it is started."""
    gpu_memory_gb: float = 80.0
    """Memory of each GPU, for the arithmetic of a shared pool (resources.pool): its models'
    engines and trainer states are resident on each of its GPUs at once."""

    def validate(self) -> ClusterConfig:
        """Raise ValueError naming the first field with a bad value."""
        if self.nodes < 1:
            raise ValueError(f"cluster.nodes must be >= 1, got {self.nodes}")
        if self.gpus_per_node < 1:
            raise ValueError(f"cluster.gpus_per_node must be >= 1, got {self.gpus_per_node}")
        if self.engine_server not in ENGINE_SERVERS:
            raise ValueError(
                f"cluster.engine_server must be one of {ENGINE_SERVERS}, got {self.engine_server!r}"
            )
        if self.startup_timeout_s <= 0:
            raise ValueError(f"cluster.startup_timeout_s must be > 0, got {self.startup_timeout_s}")
        if self.gpu_memory_gb <= 0:
            raise ValueError(f"cluster.gpu_memory_gb must be > 0, got {self.gpu_memory_gb}")
        for f in fields(self):
            if f.name.endswith("_port") and not 0 < getattr(self, f.name) < 65536:
                raise ValueError(
                    f"cluster.{f.name} must be in 1..65535, got {getattr(self, f.name)}"
                )
        return self

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass
class TrainerRank:
    """One torch.distributed rank of a trainer: its GPU and parallel coordinates."""

    rank: int
    node: int
    gpu: int
    tp: int  # tensor-parallel index: fastest-varying, as in Megatron's default rank order
    dp: int
    pp: int


@dataclass
class EnginePlacement:
    """One SGLang engine: the GPUs of one node it holds and the port it serves on."""

    index: int
    node: int
    gpus: list[int]
    port: int


@dataclass
class PlacedModel:
    """The placement of one model: its trainer ranks, engines, router and sync."""

    owner: str
    agents: list[str]
    model: str | None
    backend: str
    colocate: bool
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    engine_tensor_parallel: int
    mem_fraction_static: float
    trainer: list[TrainerRank]
    engines: list[EnginePlacement]
    router_port: int
    metrics_port: int
    master_port: int | None  # torch.distributed rendezvous on trainer rank 0's node
    sync_transport: str  # shared (colocated) | distributed | none (frozen model)
    pool: str | None = None  # the GPU pool it shares with other models, taking turns

    def engine_ranks(self) -> list[list[int]] | None:
        """Colocated: per engine, the trainer rank on the GPU of each of its TP ranks (the
        rank whose shared copy of the weights that TP rank reads); None otherwise."""
        if not self.colocate:
            return None
        rank = {(r.node, r.gpu): r.rank for r in self.trainer}
        return [[rank[(e.node, gpu)] for gpu in e.gpus] for e in self.engines]


@dataclass
class Placement:
    """Where every model of a run trains and serves."""

    cluster: ClusterConfig
    groups: list[PlacedModel]  # one per model, in the order of their owners in agents

    def gpu_roles(self) -> dict[str, list[str]]:
        """``"node0/gpu3"`` -> roles on that GPU, e.g. ``["doctor train r0", "doctor engine 1"]``
        (agents sharing a model appear under the owner's name); idle GPUs map to []."""
        roles: dict[str, list[str]] = {
            f"node{n}/gpu{g}": []
            for n in range(self.cluster.nodes)
            for g in range(self.cluster.gpus_per_node)
        }
        for grp in self.groups:
            for r in grp.trainer:
                roles[f"node{r.node}/gpu{r.gpu}"].append(f"{grp.owner} train r{r.rank}")
            for e in grp.engines:
                for g in e.gpus:
                    roles[f"node{e.node}/gpu{g}"].append(f"{grp.owner} engine {e.index}")
        return roles

    def to_dict(self) -> dict[str, Any]:
        """The placement as plain JSON-able values."""
        return {"cluster": asdict(self.cluster), "groups": [asdict(g) for g in self.groups]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def tables(self) -> list:
        """Two rich tables: one row per model, one row per GPU."""
        from rich.table import Table

        models = Table(title="Models")
        for col in (
            "model of",
            "agents",
            "checkpoint",
            "backend",
            "trainer",
            "engines",
            "router",
            "sync",
            "pool",
        ):
            models.add_column(col)
        for g in self.groups:
            trainer = (
                f"{len(g.trainer)} GPUs = TP {g.tensor_parallel} x PP {g.pipeline_parallel} x "
                f"DP {g.data_parallel}, master :{g.master_port}"
                if g.trainer
                else "frozen"
            )
            engines = (
                f"{len(g.engines)} x TP {g.engine_tensor_parallel}"
                f"{' colocated' if g.colocate else ''}, mem {g.mem_fraction_static:g}, ports "
                + ", ".join(f"n{e.node}:{e.port}" for e in g.engines)
            )
            models.add_row(
                g.owner,
                ", ".join(g.agents),
                str(g.model),
                g.backend,
                trainer,
                engines,
                f"n0:{g.router_port} (metrics :{g.metrics_port})",
                g.sync_transport,
                g.pool or "-",
            )
        gpus = Table(title=f"GPUs ({self.cluster.nodes} x {self.cluster.gpus_per_node})")
        gpus.add_column("node/gpu")
        gpus.add_column("roles")
        coords = {(g.owner, r.rank): r for g in self.groups for r in g.trainer}
        for key, roles in self.gpu_roles().items():
            shown = []
            for role in roles:
                owner, kind, idx = role.split(" ")
                if kind == "train":
                    r = coords[(owner, int(idx[1:]))]
                    role += f" (tp {r.tp} dp {r.dp} pp {r.pp})"
                shown.append(role)
            gpus.add_row(key, "; ".join(shown) or "[dim]idle[/]")
        return [models, gpus]

    def table(self) -> str:
        """The placement as text (the tables rendered without colour)."""
        from rich.console import Console

        console = Console(width=160, record=True, color_system=None, file=_Null())
        for t in self.tables():
            console.print(t)
        return console.export_text()


class _Null:
    """A file that drops what is written (rich records the text for export)."""

    def write(self, _: str) -> int:
        return 0

    def flush(self) -> None:
        pass


# ------------------------------------------------------------------------------------ planning


@dataclass
class _Group:
    owner: str
    agents: list[str]
    model: str | None
    backend: str
    trainable: bool
    res: ResourceConfig
    tp: int = 1  # the trainer's tensor- and pipeline-parallel sizes (agent's trainer section)
    pp: int = 1
    train: int = 0
    infer: int = 0
    where: str = field(default="")


def make_placement(run, cluster: ClusterConfig) -> Placement:
    """Place every model of a run on ``cluster``: a RunPlan, a TrainConfig (resolved here), or
    a bare list of agent specs (their models in an otherwise default run).

    Raises ValueError naming the agent and field (or the cluster flag) for anything that cannot
    be placed: too few GPUs, parallel sizes that do not divide, memory fraction, port clashes.
    """
    cluster.validate()
    groups = _groups(_models(run))
    pools = _pools(groups)
    _size([g for g in groups if g.res.pool is None or pools[g.res.pool][0] is g], cluster)
    for members in pools.values():
        for g in members[1:]:
            g.train, g.infer = members[0].train, members[0].infer
    free = {n: list(range(cluster.gpus_per_node)) for n in range(cluster.nodes)}
    engine_ports = dict.fromkeys(range(cluster.nodes), cluster.engine_base_port)
    placed = []
    pool_blocks: dict[str, list] = {}  # a pool's trainer GPU blocks, taken by its first model
    for i, g in enumerate(groups):
        r = g.res
        _check_heads(g)
        tp, pp, etp = g.tp, g.pp, r.engine_tensor_parallel
        trainer = _place_trainer(g, free, pool_blocks)
        engines = _place_engines(g, trainer, free, engine_ports)
        placed.append(
            PlacedModel(
                owner=g.owner,
                agents=g.agents,
                model=g.model,
                backend=g.backend,
                colocate=r.colocate,
                tensor_parallel=tp,
                pipeline_parallel=pp,
                data_parallel=g.train // (tp * pp) if g.train else 0,
                engine_tensor_parallel=etp,
                mem_fraction_static=r.mem_fraction_static,
                trainer=trainer,
                engines=engines,
                router_port=cluster.router_base_port + i,
                metrics_port=cluster.metrics_base_port + i,
                master_port=cluster.master_base_port + i if trainer else None,
                sync_transport="none" if not trainer else "shared" if r.colocate else "distributed",
                pool=r.pool,
            )
        )
    placement = Placement(cluster, placed)
    _check_ports(placement)
    for name in pools:
        _check_pool_memory(name, [p for p in placed if p.pool == name], cluster)
    return placement


def _models(run) -> list[ModelPlan]:
    """The models of ``run`` as its plan resolves them. A bare list of agent specs (tests of the
    planner) has no data or recipe for a whole plan to check: each of its models is resolved
    as ``TrainConfig.plan`` resolves it, in a run that is the default but for its agents."""
    if not isinstance(run, list):
        return list(resolve(run).models)
    cfg = TrainConfig(agents=run)
    local = [s for s in cfg.agent_specs() if not s.remote]
    return [cfg.model_plan(members) for members in model_groups(local).values()]


def _groups(models: list[ModelPlan]) -> list[_Group]:
    """The models to place, one group per model in the order of the agents: its owner (the
    agent whose spec defines it), its agents, resources and trainer parallel sizes, as the run
    plan resolved them. A remote agent's model is placed by the job that plays it (the plan
    holds it apart)."""
    return [
        _Group(
            owner=m.owner,
            agents=[s.name for s in m.agents],
            model=m.settings.model,
            backend=m.settings.backend,
            trainable=m.trained,
            res=replace(m.resources),  # a copy: _pools colocates a pool's models
            tp=m.trainer_parallel[0],
            pp=m.trainer_parallel[1],
            where=f"agents[{m.owner!r}].resources",
        )
        for m in models
    ]


def _place_trainer(
    g: _Group, free: dict[int, list[int]], pool_blocks: dict[str, list]
) -> list[TrainerRank]:
    """The trainer's ranks of ``g``: blocks of TP GPUs taken from ``free`` (a pool's blocks are
    taken by its first model and shared by the others), numbered TP fastest, then DP, then PP."""
    tp, pp = g.tp, g.pp
    trainer = []
    if g.res.pool is None:
        blocks = _take(free, g, g.train // tp, tp, "the trainer")
    elif g.res.pool not in pool_blocks:
        blocks = pool_blocks[g.res.pool] = _take(free, g, g.train // tp, tp, "the pool")
    else:
        blocks = pool_blocks[g.res.pool]
    for b, (node, gpus) in enumerate(blocks):
        for t, gpu in enumerate(gpus):
            rank = b * tp + t
            dp = (rank // tp) % (g.train // (tp * pp))
            trainer.append(TrainerRank(rank, node, gpu, tp=t, dp=dp, pp=rank // (g.train // pp)))
    return trainer


def _place_engines(
    g: _Group,
    trainer: list[TrainerRank],
    free: dict[int, list[int]],
    engine_ports: dict[int, int],
) -> list[EnginePlacement]:
    """The engines of ``g``: on its trainer's GPUs when colocated, else blocks of engine TP GPUs
    taken from ``free``; each on the next free engine port of its node."""
    etp = g.res.engine_tensor_parallel
    if g.res.colocate:
        blocks = _colocated_blocks(g, trainer, etp)
    else:
        blocks = _take(free, g, g.infer // etp, etp, "the engines")
    engines = []
    for k, (node, gpus) in enumerate(blocks):
        engines.append(EnginePlacement(k, node, gpus, engine_ports[node]))
        engine_ports[node] += 1
    return engines


def _pools(groups: list[_Group]) -> dict[str, list[_Group]]:
    """The models of each shared pool (in the order of the agents), checked: every one trains
    (its engines serve on its training GPUs), at the size the first one gives the pool, with
    the same trainer tensor-parallel size (the pool's GPUs are taken in its blocks)."""
    pools: dict[str, list[_Group]] = {}
    for g in groups:
        if g.res.pool is not None:
            pools.setdefault(g.res.pool, []).append(g)
    for name, members in pools.items():
        first = members[0]  # the model that sizes the pool
        for g in members:
            if not g.trainable:
                raise ValueError(
                    f"{g.where}.pool {name!r}: a frozen model has no training turn; give it "
                    "GPUs of its own (leave pool unset)"
                )
            g.res.colocate = True
            if g is first:
                continue
            if g.res.train_gpus not in (None, first.res.train_gpus):
                raise ValueError(
                    f"{g.where}.train_gpus = {g.res.train_gpus}, but pool {name!r} has the size "
                    f"{first.owner!r} gives it ({first.res.train_gpus}): leave it unset"
                )
            if g.tp != first.tp:
                raise ValueError(
                    f"agents[{g.owner!r}].trainer.tensor_parallel = {g.tp}, but pool {name!r} "
                    f"is taken in blocks of {first.tp} (agents[{first.owner!r}]'s): make them equal"
                )
    return pools


def _param_count(model: str | None) -> int | None:
    """A local model's parameter count from its config.json (None when there is none to read):
    embeddings (twice when untied), attention and the gated MLP of each layer."""
    path = Path(model or "") / "config.json"
    if not model or not path.is_file():
        return None
    c = json.loads(path.read_text())
    try:
        h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
        heads = c["num_attention_heads"]
        kv = c.get("num_key_value_heads") or heads
        head_dim = c.get("head_dim") or h // heads
        inter = c["intermediate_size"]
    except KeyError:
        return None
    attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    embeddings = vocab * h * (1 if c.get("tie_word_embeddings") else 2)
    return embeddings + layers * (attention + 3 * h * inter)


TRAINER_BYTES_PER_PARAM = 16  # fp32 weights, gradients and AdamW's two moments


def _check_pool_memory(name: str, members: list[PlacedModel], cluster) -> None:
    """A pool's GPU holds at once every model's engine (its mem_fraction_static of the GPU)
    and every trainer's state (weights, gradients, AdamW moments, split over its ranks); a
    trainer's activations come on top during its turn, when the engines have released."""
    gb = cluster.gpu_memory_gb
    parts, need = [], 0.0
    for m in members:
        engine = m.mem_fraction_static * gb
        parts.append(f"engine of {m.owner} {m.mem_fraction_static:g} x {gb:g} = {engine:.1f} GB")
        need += engine
    unknown = []
    for m in members:
        params = _param_count(m.model)
        if params is None:
            unknown.append(m.owner)
            continue
        state = params * TRAINER_BYTES_PER_PARAM / len(m.trainer) / 2**30
        parts.append(f"trainer of {m.owner} {state:.1f} GB")
        need += state
    if need <= gb:
        return
    raise ValueError(
        f"pool {name!r}: each of its GPUs holds {' + '.join(parts)} = {need:.1f} GB > "
        f"cluster.gpu_memory_gb = {gb:g} (a trainer: {TRAINER_BYTES_PER_PARAM} bytes a "
        "parameter over its ranks"
        + (f"; those of {unknown} not counted: no local config.json" if unknown else "")
        + "): lower the engines' resources.mem_fraction_static, or give the pool more GPUs"
    )


def _size(groups: list[_Group], cluster: ClusterConfig) -> None:
    """Fill in each group's train/infer GPU counts and check they fit and divide."""
    explicit = _explicit_sizes(groups)
    auto = [g for g in groups if g.owner not in explicit]
    spare = cluster.total_gpus - sum(explicit.values())
    share = spare // len(auto) if auto else 0
    for g in groups:
        r = g.res
        size = explicit.get(g.owner, share)
        if not g.trainable:
            g.train, g.infer = 0, size
        elif r.colocate:
            g.train = g.infer = size
        elif r.train_gpus is not None:
            g.train, g.infer = r.train_gpus, size - r.train_gpus
        elif r.infer_gpus is not None:
            g.train, g.infer = size - r.infer_gpus, r.infer_gpus
        else:
            g.train, g.infer = size // 2, size - size // 2
    need = sum(g.train + (0 if g.res.colocate else g.infer) for g in groups)
    counts = ", ".join(f"{g.owner} {g.train}+{0 if g.res.colocate else g.infer}" for g in groups)
    if need > cluster.total_gpus or min(g.train for g in groups) < 0 or (auto and share < 1):
        raise ValueError(
            f"the plan needs {need} GPUs (train+infer per model: {counts}) but the cluster has "
            f"cluster.nodes x cluster.gpus_per_node = {cluster.nodes} x {cluster.gpus_per_node} = "
            f"{cluster.total_gpus}"
        )
    for g in groups:
        _check_size(g, cluster)


def _explicit_sizes(groups: list[_Group]) -> dict[str, int]:
    """The GPUs of each model whose resources fix them (by owner); the others share the rest.
    ValueError for GPUs or colocation asked of a frozen model."""
    explicit = {}
    for g in groups:
        r = g.res
        if not g.trainable:
            if r.train_gpus:
                raise ValueError(
                    f"{g.where}.train_gpus={r.train_gpus} but no agent of this model "
                    "is trainable: set it to 0 or leave it unset"
                )
            if r.colocate:
                raise ValueError(
                    f"{g.where}.colocate needs a trainable agent (this model is frozen)"
                )
            if r.infer_gpus is not None:
                explicit[g.owner] = r.infer_gpus
        elif r.colocate and r.train_gpus is not None:
            explicit[g.owner] = r.train_gpus
        elif not r.colocate and r.train_gpus is not None and r.infer_gpus is not None:
            explicit[g.owner] = r.train_gpus + r.infer_gpus
    return explicit


def _check_size(g: _Group, cluster: ClusterConfig) -> None:
    """ValueError naming the field when ``g``'s sized trainer or engines cannot run: no GPU
    for either, a parallel size that does not fit a node or divide its GPUs, a node that the
    cluster does not have."""
    r = g.res
    if g.trainable and g.train < 1:
        raise ValueError(
            f"{g.where}.train_gpus: a trainable model needs >= 1 training GPU; "
            f"its share of the cluster leaves {g.train}"
        )
    if g.infer < 1:
        raise ValueError(
            f"{g.where}.infer_gpus: every model needs >= 1 engine GPU; its share "
            f"of the cluster leaves {g.infer}"
        )
    trainer_where = f"agents[{g.owner!r}].trainer"
    sizes = {f"{trainer_where}.tensor_parallel": g.tp}
    sizes[f"{g.where}.engine_tensor_parallel"] = r.engine_tensor_parallel
    for name, size in sizes.items():
        if size > cluster.gpus_per_node:
            raise ValueError(
                f"{name} = {size} exceeds cluster.gpus_per_node = {cluster.gpus_per_node}: "
                "it must fit in one node"
            )
    if g.train % (g.tp * g.pp):
        raise ValueError(
            f"{trainer_where}: tensor_parallel x pipeline_parallel = {g.tp} x {g.pp} = "
            f"{g.tp * g.pp} must divide {g.where}.train_gpus = {g.train}"
        )
    if g.infer % r.engine_tensor_parallel:
        what = "train_gpus (colocated)" if r.colocate else "infer_gpus"
        raise ValueError(
            f"{g.where}.engine_tensor_parallel = {r.engine_tensor_parallel} must divide "
            f"{what} = {g.infer}"
        )
    bad = [n for n in r.nodes or [] if n >= cluster.nodes]
    if bad:
        raise ValueError(f"{g.where}.nodes: {bad} not in 0..{cluster.nodes - 1}")


def _take(free: dict[int, list[int]], g: _Group, n: int, size: int, what: str):
    """``n`` blocks of ``size`` GPUs, each inside one node, first fit; [(node, gpus)]."""
    out = []
    for _ in range(n):
        node = next(
            (k for k, gpus in free.items() if len(gpus) >= size and k in (g.res.nodes or [k])),
            None,
        )
        if node is None:
            left = {f"node{k}": len(v) for k, v in free.items() if v}
            raise ValueError(
                f"{g.where}: {what} need {n} blocks of {size} GPU(s) on one node each, but after "
                f"{len(out)} no node{' of nodes=' + str(g.res.nodes) if g.res.nodes else ''} has "
                f"{size} free GPU(s) (free: {left or 'none'})"
            )
        out.append((node, free[node][:size]))
        del free[node][:size]
    return out


def _colocated_blocks(g: _Group, trainer: list[TrainerRank], etp: int):
    """Colocated engines: consecutive blocks of ``etp`` trainer GPUs, each inside one node."""
    blocks = []
    for k in range(0, len(trainer), etp):
        ranks = trainer[k : k + etp]
        nodes = {r.node for r in ranks}
        if len(nodes) > 1:
            raise ValueError(
                f"{g.where}.engine_tensor_parallel = {etp}: colocated engine {k // etp} would span "
                f"nodes {sorted(nodes)} (the trainer's GPUs there: "
                f"{[(r.node, r.gpu) for r in ranks]}); an engine must fit in one node"
            )
        blocks.append((ranks[0].node, [r.gpu for r in ranks]))
    return blocks


def _check_heads(g: _Group) -> None:
    """Key/value heads must split evenly over the trainer's TP (Megatron's num_query_groups);
    an engine's TP may also be a multiple of them (SGLang replicates KV heads). Only checked
    when the model is a local folder with a config.json."""
    config = Path(g.model or "") / "config.json"
    if not g.model or not config.is_file():
        return
    cfg = json.loads(config.read_text())
    heads = cfg.get("num_key_value_heads") or cfg.get("num_attention_heads")
    if not heads:
        return
    tp, etp = g.tp, g.res.engine_tensor_parallel
    if heads % tp:
        raise ValueError(
            f"agents[{g.owner!r}].trainer.tensor_parallel = {tp} must divide the model's "
            f"{heads} key/value heads ({config})"
        )
    if heads % etp and etp % heads:
        raise ValueError(
            f"{g.where}.engine_tensor_parallel = {etp} must divide, or be a multiple of, the "
            f"model's {heads} key/value heads ({config})"
        )


def _check_ports(placement: Placement) -> None:
    """No two services of the placement may bind the same port on the same node."""
    taken: dict[tuple[int, int], str] = {}

    def claim(node: int, port: int, what: str) -> None:
        if not 0 < port < 65536:
            raise ValueError(f"{what}: port {port} is out of 1..65535 (lower the cluster.*_port)")
        if (node, port) in taken:
            raise ValueError(
                f"port clash on node {node}: {what} and {taken[(node, port)]} both want port "
                f"{port}; move cluster.router_base_port, engine_base_port, metrics_base_port or "
                "master_base_port apart"
            )
        taken[(node, port)] = what

    for g in placement.groups:
        claim(0, g.router_port, f"the router of {g.owner!r}")
        claim(0, g.metrics_port, f"the router metrics of {g.owner!r}")
        if g.master_port is not None:
            claim(g.trainer[0].node, g.master_port, f"the trainer rendezvous of {g.owner!r}")
        for e in g.engines:
            claim(e.node, e.port, f"engine {e.index} of {g.owner!r}")
