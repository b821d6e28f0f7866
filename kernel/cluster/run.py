"""Run a placement on Ray: ``kernel launch`` without --dry-run.

For every model of the placement (``kernel.cluster.plan``), in this order:

1. its engines: one Ray actor per engine, pinned to the planned node (NodeAffinity), starts the
   server as a child process with CUDA_VISIBLE_DEVICES = the planned GPUs, bound to the node's
   IP and the planned port -- real SGLang (``python -m sglang.launch_server --tp-size ETP
   --mem-fraction-static F``, plus ``--enable-memory-saver`` when colocated and the LoRA flags
   with ``engine.enable_lora``) or the kernel's embedded server (``cluster.engine_server``); all
   engines load at once;
2. its sglang-router on node 0 at the planned router port, with those engines as workers;
3. then the training loop (``kernel.run.loop.train``) runs with ``engine.urls`` = the workers and
   ``engine.router_url`` = the router of each model, and each trainer a ``RayTrainer``
   whose ranks sit on the planned node and GPU. Colocated models release their engines' memory
   for each training step and resume it before the weight sync, which is ``shared``: each
   trainer rank shares its copy of each bucket on its GPU, and each engine TP rank reads the copy
   of the rank on its GPU (``PlacedModel.engine_ranks``); disaggregated ones sync by broadcast
   (``distributed``).

A rank that asks Ray for a GPU gets one (``num_gpus=1``; disaggregated engines ask for their
``engine_tensor_parallel`` GPUs, colocated ones ask for none: the trainer's ranks hold them), so
Ray's accounting matches the placement, but which physical GPU a process uses is the
placement's, set by CUDA_VISIBLE_DEVICES. Placement node k is the k-th alive Ray node (the head
first, then by IP).

Everything started here is stopped at the end, on an error or on Ctrl-C: servers by PID (each
by the actor that started it), then the actors by handle; ``<output_dir>/launch/processes.json``
lists the server PIDs while they run. Ray is imported inside the functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kernel.engine.keyed import keyed_command, keyed_env
from kernel.engine.launch import LaunchedProcess, server_command, server_env
from kernel.engine.router import RouterConfig, wait_for_workers
from kernel.models import materialize_model
from kernel.run.checkpoint import checkpoints
from kernel.run.config import RunPlan
from kernel.run.loop import train
from kernel.train.settings import RayConfig


@dataclass
class RayPlacement:
    """One placed model as the loop starts it on Ray (``kernel.run.loop.train(...,
    placement={owner: this})``): its trainer's Ray options, colocation, sync and GPU pool."""

    trainer_options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of its RayTrainer: world_size, scheduling, gpus, num_gpus, ..."""
    colocate: bool = False
    """Its engines share the trainer's GPUs: release their memory around each training step."""
    sync_transport: str = "shared"
    """shared (colocated) or distributed, as planned."""
    engine_ranks: list[list[int]] | None = None
    """Colocated: per engine, the trainer ranks on its TP ranks' GPUs (their shared weights are
    its payloads)."""
    pool: str | None = None
    """The GPU pool it shares with other models (resources.pool): they train in turns, every
    engine of the pool released meanwhile."""


class ServiceActor:
    """The body of a Ray actor that runs one server process (an engine or a router) on its node
    and stops it by PID; wrapped by ``ray.remote`` at use."""

    def __init__(self) -> None:
        self.process = None

    def start(self, name: str, url: str, command: list[str], log_path: str, env: dict) -> int:

        self.process = LaunchedProcess.start(name, url, command, log_path, env=env)
        return self.process.pid

    def wait_healthy(self, deadline_s: float) -> None:
        self.process.wait_healthy(deadline_s)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def run_placement(run, placement, on_step=None) -> list[dict]:
    """Run ``run`` (a TrainConfig, or its RunPlan) on the Ray cluster as ``placement`` places
    it; returns the loop's metrics rows. The run is resolved twice: as given (with Ray training
    on), then with the started engines' and routers' addresses the loop connects to.

    Joins Ray at ``cluster.address`` (or starts a local one) unless this process already runs
    it, checks the cluster has the planned nodes and GPUs, starts every engine and router, trains
    (see the module docstring) and stops all it started, also on errors and Ctrl-C.
    """

    started_ray = RayConfig(address=placement.cluster.address or "local").start()
    services: list = []  # Ray actor handles of engines and routers, stopped in reverse
    try:
        nodes, has_gpus = _ray_nodes(placement)
        server = placement.cluster.engine_server
        if server == "auto":
            server = "sglang" if has_gpus else "embedded"
        run = _launch_plan(run, placement)  # every group's model settings
        cfg = run.cfg
        out = Path(cfg.output_dir)
        record: dict[str, list] = {"engines": [], "routers": []}
        engines: dict[str, list[str]] = {}
        for g in placement.groups:
            engines[g.owner] = []
            for e in g.engines:
                ip, actor = _service(nodes[e.node], 0 if g.colocate else len(e.gpus) * has_gpus)
                services.append(actor)
                url = f"http://{ip}:{e.port}"
                command, env = _engine_command(
                    server, run, g, e, ip, out, placement.cluster.sglang_args
                )
                env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, e.gpus))
                log = out / "logs" / g.owner / f"engine{e.index}.log"
                pid = _get(
                    actor.start.remote(
                        f"engine {e.index} of {g.owner!r}", url, command, str(log), env
                    )
                )
                engines[g.owner].append(url)
                record["engines"].append({"owner": g.owner, "url": url, "pid": pid, "node": e.node})
        _write(out, record)
        _get([a.wait_healthy.remote(placement.cluster.startup_timeout_s) for a in services])
        routers = {}
        for g in placement.groups:
            routers[g.owner] = _start_router(
                run, g, engines[g.owner], nodes[0], placement, services, record
            )
        _write(out, record)

        on_ray = {
            g.owner: _ray_placement(run, g, nodes, has_gpus, placement)
            for g in placement.groups
            if g.trainer
        }
        with _watch_nodes(nodes, placement, out):
            placed = _placed_config(cfg, engines, routers).plan()
            return train(placed, on_step, on_ray)
    finally:
        _stop(services)
        if started_ray:
            import ray

            ray.shutdown()


class NodeLost(RuntimeError):
    """A node of the placement died while the run ran; the message names it and what it held."""


@contextlib.contextmanager
def _watch_nodes(nodes: list[tuple[str, str]], placement, out: Path, period_s: float = 1.0):
    """While the loop runs, a thread looks at Ray's nodes every ``period_s``; when a node of
    the placement is no longer alive it interrupts the run as Ctrl-C does (SIGINT: the loop stops
    every process it started, the last checkpoint stays), and the run raises NodeLost naming
    the node, what it held and how to resume. A run that fails otherwise first looks for up
    to ``LOST_GRACE_S`` whether Ray saw a node of it die: if one did, that is the error."""
    import ray

    def dead() -> list[int]:
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        return [k for k, (node_id, _) in enumerate(nodes) if node_id not in alive]

    lost: list[int] = []
    lock, stop, ended = threading.Lock(), threading.Event(), [False]

    def watch() -> None:
        while not stop.wait(period_s):
            if found := dead():
                with lock:
                    if not ended[0]:
                        lost.extend(found)
                        os.kill(os.getpid(), signal.SIGINT)
                return

    thread = threading.Thread(target=watch, name="tandem-node-watch", daemon=True)
    thread.start()
    try:
        yield
    except BaseException as exc:
        with lock:
            ended[0] = True
        interrupted = isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError))
        deadline = time.monotonic() + (0 if interrupted else LOST_GRACE_S)
        while not lost and not (found := dead()) and time.monotonic() < deadline:
            time.sleep(period_s)
        lost = lost or found
        if not lost:
            raise
        message = _lost_message(lost, nodes, placement, out)
        raise NodeLost(message) from (None if interrupted else exc)
    finally:
        with lock:
            ended[0] = True
        stop.set()
        thread.join(timeout=5)


LOST_GRACE_S = 3.0  # a death Ray has not noticed by then is left to the SIGINT path


def _lost_message(lost: list[int], nodes, placement, out: Path) -> str:
    held: dict[int, list[str]] = {k: [] for k in lost}
    for gpu, roles in placement.gpu_roles().items():
        node, index = gpu.split("/")
        k = int(node.removeprefix("node"))
        if k in held and roles:
            held[k].append(f"{index}: {', '.join(roles)}")
    found = checkpoints(out)
    where = f"its last checkpoint, {found[-1]}" if found else "the start (no checkpoint yet)"
    died = "; ".join(
        f"node {k} of the placement (Ray node {nodes[k][0][:12]} at {nodes[k][1]}) died while the "
        f"run ran; it held {'; '.join(held[k]) or 'nothing'}"
        for k in sorted(set(lost))
    )
    return (
        f"{died}. The run stopped everything it started. Resume from {where} with --resume "
        f"true once the Ray cluster has cluster.nodes = {placement.cluster.nodes} nodes again"
    )


def _get(refs):
    import ray

    return ray.get(refs)


def _ray_nodes(placement) -> tuple[list[tuple[str, str]], bool]:
    """(node id, IP) of placement node 0, 1, ... and whether the cluster has GPUs at all; raises
    ValueError naming the cluster flags when the Ray cluster is smaller than the placement."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    has_gpus = any(n["Resources"].get("GPU", 0) for n in alive)
    need = placement.cluster.gpus_per_node
    fit = [n for n in alive if n["Resources"].get("GPU", 0) >= need or not has_gpus]
    fit.sort(
        key=lambda n: (
            "node:__internal_head__" not in n["Resources"],
            n["NodeManagerAddress"],
            n["NodeID"],
        )
    )
    if len(fit) < placement.cluster.nodes:
        gpus = sorted((int(n["Resources"].get("GPU", 0)) for n in alive), reverse=True)
        raise ValueError(
            f"the Ray cluster has {len(alive)} node(s) with GPUs {gpus}, but the placement needs "
            f"cluster.nodes={placement.cluster.nodes} with cluster.gpus_per_node={need} each"
        )
    nodes = [(n["NodeID"], n["NodeManagerAddress"]) for n in fit[: placement.cluster.nodes]]
    return nodes, has_gpus


def _launch_plan(run, placement) -> RunPlan:
    """``run`` (a config or its plan) resolved with Ray training on, checked against what a
    launched run cannot do; a plan that trains on Ray already is taken as it is."""
    cfg = run.cfg if isinstance(run, RunPlan) else run
    for g in placement.groups:
        if g.colocate and cfg.async_mode:
            raise ValueError(
                f"agents[{g.owner!r}].resources.colocate: async_mode overlaps rollout and "
                "training, but colocated engines give their memory up while the model trains; "
                "turn one of them off"
            )
    if isinstance(run, RunPlan) and cfg.ray.enabled:
        return run
    return replace(cfg, ray=replace(cfg.ray, enabled=True)).plan()


def _service(node: tuple[str, str], num_gpus: int):
    """A ServiceActor on ``node`` (reserving ``num_gpus`` of Ray's GPUs); (node IP, handle)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node_id, ip = node
    actor = (
        ray.remote(ServiceActor)
        .options(
            num_cpus=0,
            num_gpus=num_gpus,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        )
        .remote()
    )
    return ip, actor


def _owner_settings(run, g):
    """The model settings of group ``g`` (those of the agent that owns its model) in the run's
    ``RunPlan``."""
    return run.model_of(g.owner).settings


def _engine_command(server: str, run, g, e, ip: str, out: Path, sglang_args):
    """The command line of engine ``e`` of group ``g`` and its environment: real SGLang (with
    its LoRA flags, the cluster's ``sglang_args``, then the model's own ``engine.sglang_args``)
    or the embedded server, each with the model's ``engine.api_key`` if it has one."""

    settings = _owner_settings(run, g)
    model = materialize_model(settings.model, out / "models")
    if server == "sglang":  # its key as the embedded server's: in the environment
        cmd = ["--model-path", model]
        cmd += ["--host", ip, "--port", str(e.port), "--tp-size", str(g.engine_tensor_parallel)]
        cmd += ["--mem-fraction-static", str(g.mem_fraction_static)]
        if g.colocate:  # /release_memory_occupation needs it
            cmd += ["--enable-memory-saver"]
        cmd += _lora_flags(settings.engine)
        cmd += list(sglang_args) + list(settings.engine.sglang_args)
        return keyed_command("sglang.launch_server", cmd), keyed_env(settings.engine.api_key)

    config = settings.engine.server_config(model, host=ip, port=e.port, seed=run.cfg.seed + e.index)
    return server_command(config.validate()), server_env(config)


def _lora_flags(engine) -> list[str]:
    """sglang.launch_server's LoRA flags of an engine config. Adapters are loaded at run time
    (but for ``lora_paths``), for which SGLang must know the largest rank and the target layers
    in advance."""
    if not engine.enable_lora:
        return []
    if engine.max_lora_rank < 1 or not engine.lora_target_modules:
        raise ValueError(
            "engine.enable_lora on real SGLang needs engine.max_lora_rank >= 1 and "
            f"engine.lora_target_modules (got {engine.max_lora_rank} and "
            f"{engine.lora_target_modules}): the run sets them from the model's LoRA settings"
        )
    flags = ["--enable-lora", "--max-loras-per-batch", str(engine.max_loras_per_batch)]
    flags += ["--max-lora-rank", str(engine.max_lora_rank)]
    flags += ["--lora-target-modules", *engine.lora_target_modules]
    return flags + (["--lora-paths", *engine.lora_paths] if engine.lora_paths else [])


def _start_router(run, g, urls, node, placement, services: list, record: dict) -> str:
    """Group ``g``'s sglang-router on placement node 0, with its engines registered; its URL."""

    ip, actor = _service(node, 0)
    services.append(actor)
    config = RouterConfig(
        host=ip,
        port=g.router_port,
        worker_urls=urls,
        policy="round_robin",
        prometheus_port=g.metrics_port,
        api_key=_owner_settings(run, g).engine.api_key,
    ).validate()
    log = Path(run.cfg.output_dir) / "logs" / g.owner / "router.log"
    pid = _get(
        actor.start.remote(
            f"router of {g.owner!r}", config.url, config.command(), str(log), config.env()
        )
    )
    record["routers"].append({"owner": g.owner, "url": config.url, "pid": pid, "node": 0})
    _get(actor.wait_healthy.remote(placement.cluster.startup_timeout_s))
    wait_for_workers(config.url, len(urls), placement.cluster.startup_timeout_s, config.api_key)
    return config.url


def _ray_placement(run, g, nodes, has_gpus: bool, placement) -> RayPlacement:
    """Group ``g``'s trainer ranks as RayTrainer options, its colocation, pool and sync. The
    trainers of a shared pool split each GPU's Ray reservation (they take turns on it)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    device = getattr(_owner_settings(run, g).trainer, "device", None)  # megatron: none
    sharing = sum(x.pool == g.pool for x in placement.groups) if g.pool else 1
    options = {
        "world_size": len(g.trainer),
        "scheduling": [
            NodeAffinitySchedulingStrategy(nodes[r.node][0], soft=False) for r in g.trainer
        ],
        "gpus": [r.gpu for r in g.trainer],
        "master_port": g.master_port,
        "num_cpus": run.cfg.ray.num_cpus_per_rank,
        "num_gpus": 1 / sharing if has_gpus else 0,
        "backend": "gloo" if device == "cpu" else None,  # None: each rank's CUDA decides
    }
    return RayPlacement(options, g.colocate, g.sync_transport, g.engine_ranks(), g.pool)


def _placed_config(cfg, engines: dict[str, list[str]], routers: dict[str, str]):
    """``cfg`` whose model owners use the started engines (``engine.urls``) and router; not
    yet resolved."""
    agents = []
    for spec in cfg.agent_specs():
        if spec.name in engines:
            started = {"urls": engines[spec.name], "router_url": routers[spec.name]}
            spec = replace(spec, engine={**spec.engine, **started, "start_router": False})
        agents.append(spec)
    return replace(cfg, agents=agents)


def _write(out: Path, record: dict) -> None:
    path = out / "launch" / "processes.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))


def _stop(services: list) -> None:
    """Stop every server (its actor ends it by PID), routers first, then kill the actors."""
    import ray

    for actor in reversed(services):
        # an actor already gone took its server with it (SIGTERM on the parent's death)
        with contextlib.suppress(Exception):
            ray.get(actor.stop.remote(), timeout=60)
        ray.kill(actor, no_restart=True)
