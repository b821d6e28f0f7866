"""A trainer group on Ray: N actors, each one torch.distributed rank holding a TorchTrainer.

``RayTrainerGroup`` has the surface of ``TorchTrainer`` that the training loop and WeightSync
use -- ``train_step``, ``compute_logprobs``, ``named_parameters_for_sync``, ``save``, ``load``,
``save_hf``, ``close`` -- so it can stand in for one. Rank 0 picks the rendezvous address (its
node's IP and a free port); the ranks form one process group (gloo on CPU, NCCL on GPUs) and,
with more than one rank, the TorchTrainer shards the model with FSDP2. A global batch is split
with ``kernel.train.batching.shard_samples`` here, so each actor receives only its own share.

Faults: every call waits on the ranks as they finish, so a rank whose process died is seen at
once (Ray reports ``RayActorError``) instead of waiting on the survivors, which would block in a
collective with it forever. The group then kills its remaining actors and raises
``TrainerDied(agent, rank)``; the run stops and resumes from its last checkpoint.

Ray is imported inside the functions (the core imports without it). The caller starts or joins
Ray (``ray.init``) before building a group.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from kernel.sample import Sample
from kernel.train.batching import shard_samples


@dataclass
class RayConfig:
    """Training on Ray: each trainable model's trainer is a RayTrainerGroup of actors."""

    enabled: bool = False
    """Train every model with Ray actors (one torch.distributed rank each) instead of in the
    driver process; the engines, rollouts and weight sync stay as they are."""
    address: str = "local"
    """Ray to use: 'local' starts one on this machine (127.0.0.1, auth off), 'auto' or
    ray://HOST:PORT joins a running cluster."""
    ranks: int = 1
    """Trainer ranks (actors) per model; an agent's resources.train_gpus overrides it."""
    num_cpus_per_rank: float = 0.0
    """CPUs Ray reserves for each actor."""
    num_gpus_per_rank: float = 0.0
    """GPUs Ray reserves for each actor (1 on GPU nodes: NCCL; 0: CPU and gloo)."""

    def validate(self) -> RayConfig:
        if self.ranks < 1:
            raise ValueError(f"ray.ranks must be >= 1, got {self.ranks}")
        if self.num_cpus_per_rank < 0 or self.num_gpus_per_rank < 0:
            raise ValueError("ray.num_cpus_per_rank and ray.num_gpus_per_rank must be >= 0")
        return self

    def start(self) -> bool:
        """Start or join Ray unless it runs in this process already; True if this call did."""
        import ray

        if ray.is_initialized():
            return False
        if self.address == "local":
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local instance
            ray.init(
                address="local",
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                log_to_driver=False,
            )
        else:
            ray.init(address=self.address, log_to_driver=False)
        return True


class TrainerDied(RuntimeError):
    """A rank of an agent's trainer group died (its process exited or its node went away)."""

    def __init__(self, agent: str, rank: int, detail: str = ""):
        self.agent, self.rank = agent, rank
        super().__init__(
            f"the trainer of agent {agent!r} lost rank {rank}: its process died"
            f"{f' ({detail})' if detail else ''}; the group is stopped -- resume the run from its "
            "last checkpoint (--resume true)"
        )


class TrainerRankActor:
    """The body of one Ray actor: one rank of the group (wrapped by ``ray.remote`` at use)."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.trainer = None

    def address(self) -> tuple[str, int]:
        """This node's IP and a port free on it: the group's rendezvous (asked of rank 0)."""
        import ray

        from kernel.engine.launch import free_port

        ip = ray.util.get_node_ip_address()
        return ip, free_port(ip)

    def setup(self, master: tuple[str, int], backend: str, timeout_s: float, *trainer_args) -> int:
        """Join the process group and build the TorchTrainer; returns this process's PID."""
        import torch.distributed as dist

        from kernel.train.torch_backend import TorchTrainer

        os.environ.update(
            MASTER_ADDR=master[0],
            MASTER_PORT=str(master[1]),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",  # Ray gives each GPU actor its own CUDA_VISIBLE_DEVICES: one device
        )
        if self.world_size > 1:
            dist.init_process_group(
                backend,
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(seconds=timeout_s),
            )
        self.trainer = TorchTrainer(*trainer_args)
        return os.getpid()

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        return self.trainer.train_step(samples)

    def compute_logprobs(self, samples: list[Sample]) -> list[list[float]]:
        return self.trainer.compute_logprobs(samples)

    def full_state(self, dtype) -> dict[str, Any] | None:
        """Every full HF tensor on rank 0 (all ranks take part in gathering); None elsewhere."""
        params = {n: t.cpu() for n, t in self.trainer.named_parameters_for_sync(dtype)}
        return params if self.rank == 0 else None

    def save(self, path: str) -> str:
        return str(self.trainer.save(path))

    def save_hf(self, path: str) -> str:
        return str(self.trainer.save_hf(path))

    def load(self, path: str) -> int:
        self.trainer.load(path)
        return self.trainer.step


class RayTrainerGroup:
    """``world_size`` Ray actors training one model together; see the module docstring.

    ``optim``, ``loss``, ``cfg`` and ``total_steps`` are those of ``TorchTrainer``.
    ``num_cpus`` / ``num_gpus`` are each actor's Ray resource request (a GPU actor gets its own
    GPU and NCCL; CPU actors use gloo); ``scheduling`` is an optional list of one Ray
    scheduling strategy per rank (e.g. NodeAffinitySchedulingStrategy from a Plan's ranks).
    """

    def __init__(
        self,
        agent: str,
        model_path: str,
        optim,
        loss,
        cfg,
        total_steps: int,
        world_size: int = 1,
        num_cpus: float = 0.0,
        num_gpus: float = 0.0,
        backend: str | None = None,
        scheduling: list | None = None,
        timeout_s: float = 1800.0,
    ):
        import ray

        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if scheduling is not None and len(scheduling) != world_size:
            raise ValueError(f"scheduling has {len(scheduling)} entries, world_size {world_size}")
        if not ray.is_initialized():
            raise RuntimeError("RayTrainerGroup needs Ray: call ray.init(...) first")
        self.agent, self.world_size, self.rank = agent, world_size, 0
        self.step = 0
        backend = backend or ("nccl" if num_gpus > 0 else "gloo")
        remote = ray.remote(TrainerRankActor)
        self.actors = [
            remote.options(
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                max_restarts=0,  # a dead rank breaks the process group: fail, do not restart
                **({"scheduling_strategy": scheduling[r]} if scheduling else {}),
            ).remote(r, world_size)
            for r in range(world_size)
        ]
        try:
            (master,) = self._gather([self.actors[0].address.remote()], ranks=[0])
            args = (model_path, optim, loss, cfg, total_steps)
            self.pids = self._gather(
                [a.setup.remote(master, backend, timeout_s, *args) for a in self.actors]
            )
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- calls to every rank

    def _gather(self, refs: list, ranks: list[int] | None = None) -> list:
        """Results of one call per rank, in rank order. Waits on whichever rank finishes first,
        so a dead rank is reported at once; any failure stops the whole group."""
        import ray
        from ray.exceptions import RayActorError

        ranks = ranks if ranks is not None else list(range(len(refs)))
        rank_of = dict(zip(refs, ranks, strict=True))
        results: dict[int, Any] = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            rank = rank_of[ready[0]]
            try:
                results[rank] = ray.get(ready[0])
            except RayActorError as e:
                self.close()
                raise TrainerDied(self.agent, rank, type(e).__name__) from e
            except BaseException:
                self.close()  # the other ranks may be stuck in a collective with this one
                raise
        return [results[r] for r in ranks]

    def _all(self, method: str, *args) -> list:
        if not self.actors:
            raise RuntimeError(f"the trainer group of agent {self.agent!r} is closed")
        return self._gather([getattr(a, method).remote(*args) for a in self.actors])

    # ---------------------------------------------------------------- TorchTrainer's surface

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        """One optimiser update on a global batch: each rank trains on its shard (balanced by
        tokens); returns rank 0's metrics, which are global."""
        if not self.actors:
            raise RuntimeError(f"the trainer group of agent {self.agent!r} is closed")
        refs = [
            a.train_step.remote(shard_samples(samples, r, self.world_size))
            for r, a in enumerate(self.actors)
        ]
        metrics = self._gather(refs)[0]
        self.step = int(metrics.get("step", self.step))
        return metrics

    def compute_logprobs(self, samples: list[Sample]) -> list[list[float]]:
        """The policy's logprob of every response token of each sample (every rank computes all
        of them -- FSDP needs every rank in each forward; rank 0's answer is returned)."""
        return self._all("compute_logprobs", samples)[0]

    def named_parameters_for_sync(self, dtype=None) -> Iterator[tuple]:
        """(HF name, full tensor) of every parameter, gathered over the ranks, from rank 0."""
        yield from self._all("full_state", dtype)[0].items()

    def save(self, path: str | Path) -> Path:
        """A training checkpoint (TorchTrainer.save: any world size can load it)."""
        return Path(self._all("save", str(path))[0])

    def save_hf(self, path: str | Path) -> Path:
        """An HF checkpoint any engine can load."""
        return Path(self._all("save_hf", str(path))[0])

    def load(self, path: str | Path) -> None:
        """Restore a checkpoint written by ``save`` (of any world size)."""
        self.step = self._all("load", str(path))[0]

    def close(self) -> None:
        """Kill every actor of the group (only these, by handle)."""
        import ray

        for a in getattr(self, "actors", []):
            ray.kill(a, no_restart=True)
        self.actors = []

    shutdown = close


def run_plan(cfg, plan) -> None:
    """Run a placed plan on Ray (``kernel launch`` without --dry-run).

    Joins (``cluster.address``) or starts Ray and checks that it has the nodes and GPUs the plan
    needs. Starting SGLang engines and routers on the planned GPUs and handing RayTrainerGroups
    to the training loop is not wired yet: that stops here with NotImplementedError.
    """
    import ray

    if not ray.is_initialized():
        ray.init(address=plan.cluster.address or "local", include_dashboard=False)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    gpus = sorted((int(n["Resources"].get("GPU", 0)) for n in nodes), reverse=True)
    need = plan.cluster.gpus_per_node
    if len(nodes) < plan.cluster.nodes or any(g < need for g in gpus[: plan.cluster.nodes]):
        raise ValueError(
            f"the Ray cluster has {len(nodes)} node(s) with GPUs {gpus}, but the plan needs "
            f"cluster.nodes={plan.cluster.nodes} with cluster.gpus_per_node={need} each"
        )
    raise NotImplementedError(
        "kernel launch without --dry-run: the plan fits this Ray cluster, but starting SGLang "
        "engines on the planned GPUs and training with RayTrainerGroups is not wired into the "
        "training loop yet (issue 9); run `kernel train` per node meanwhile"
    )
