"""A trainer group on Ray: N actors, each one torch.distributed rank holding a trainer.

``RayTrainer`` is a ``kernel.train.trainer.Trainer`` like the backends it runs, so the loop
and WeightSync use it as they use one; the distributed weight sync broadcasts from rank 0's
actor, and the shared one has every rank share its own copy, for the engines on its GPU
(``RayBroadcaster``). Rank 0 opens the rendezvous (its node's IP and the planned port, or one
the OS picks, listening before the others are told it); the ranks form one process group
(gloo on CPU, NCCL on GPUs). Each rank's trainer comes from ``build_trainer``: TorchTrainer
settings shard the model over the ranks with FSDP2, MegatronTrainer settings split them
tensor x pipeline x data parallel. A global batch is split over the data-parallel replicas
with ``kernel.train.batching.shard_samples`` here, so each actor receives only its replica's
share (every TP/PP rank of a Megatron replica the same one).

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
from datetime import timedelta
from pathlib import Path
from typing import Any

from kernel.engine.process_group import listen
from kernel.sample import Sample
from kernel.sync.push import LocalBroadcaster
from kernel.train.batching import shard_samples
from kernel.train.trainer import build_trainer


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

    def __init__(self, rank: int, world_size: int, gpu: int | None = None):
        self.rank, self.world_size = rank, world_size
        self.trainer = None
        self._store = None  # rank 0's rendezvous store (address())
        self._broadcaster = None  # the distributed weight sync's end in this rank (lazily)
        if gpu is not None:  # the planned GPU, before CUDA starts (Ray's own pick is ignored)
            os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)

    def address(self, port: int | None = None) -> tuple[str, int]:
        """This node's IP and ``port`` (None: one the OS picks), where this rank's store listens
        from now on: the group's rendezvous (asked of rank 0, before the others join)."""
        import ray

        self._store = listen(ray.util.get_node_ip_address(), port or 0)
        return self._store.host, self._store.port

    def setup(
        self, master: tuple[str, int], backend: str | None, timeout_s: float, *trainer_args
    ) -> tuple[int, int, int]:
        """Join the process group and build the trainer (TorchTrainer, or MegatronTrainer for a
        MegatronTrainerConfig); returns this process's PID and its data-parallel rank and size."""
        import torch.distributed as dist

        os.environ.update(
            MASTER_ADDR=master[0],
            MASTER_PORT=str(master[1]),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",  # Ray gives each GPU actor its own CUDA_VISIBLE_DEVICES: one device
        )
        if self.world_size > 1:
            import torch

            timeout = timedelta(seconds=timeout_s)
            store = self._store  # rank 0's, listening since address()
            if self.rank > 0:
                store = dist.TCPStore(master[0], master[1], is_master=False, timeout=timeout)
            store.set_timeout(timeout)
            dist.init_process_group(
                backend or ("nccl" if torch.cuda.is_available() else "gloo"),
                store=store,
                rank=self.rank,
                world_size=self.world_size,
                timeout=timeout,
            )
        self.trainer = build_trainer(*trainer_args)
        return os.getpid(), self.trainer.rank, self.trainer.world_size

    def train_step(self, samples: list[Sample], version: int | None = None) -> dict[str, float]:
        return self.trainer.train_step(samples, version)

    def compute_logprobs(self, samples: list[Sample]) -> list[list[float]]:
        return self.trainer.compute_logprobs(samples)

    def full_state(self, dtype) -> dict[str, Any] | None:
        """Every full HF tensor on rank 0 (all ranks take part in gathering); None elsewhere."""
        params = {n: t.cpu() for n, t in self.trainer.named_parameters_for_sync(dtype)}
        return params if self.rank == 0 else None

    # the distributed weight sync's rank 0 (kernel.sync.push.LocalBroadcaster) lives on rank 0
    # of the group, on its node and GPU; every rank takes part in gathering each bucket

    def broadcaster(self):
        import ray

        if self._broadcaster is None:
            self._broadcaster = LocalBroadcaster(self.trainer, ray.util.get_node_ip_address())
        return self._broadcaster

    def weight_rendezvous(self) -> tuple[str, int]:
        return self.broadcaster().rendezvous()

    def weight_backend(self) -> str:
        return self.broadcaster().backend()

    def join_weight_group(self, cfg) -> None:
        self.broadcaster().join(cfg)

    def start_weights(self, bucket_bytes: int, backend: str) -> None:
        self.broadcaster().start(bucket_bytes, backend)

    def next_weights(self):
        return self.broadcaster().next()

    def broadcast_weights(self) -> None:
        self.broadcaster().broadcast()

    def share_weights(self) -> str:
        return self.broadcaster().share()[0]

    def release_weights(self) -> None:
        self.broadcaster().release()

    def leave_weight_group(self) -> None:
        self.broadcaster().leave()

    def save(self, path: str) -> str:
        return str(self.trainer.save(path))

    def save_hf(self, path: str) -> str:
        return str(self.trainer.save_hf(path))

    def load(self, path: str) -> int:
        self.trainer.load(path)
        return self.trainer.step


class RayTrainer:
    """``world_size`` Ray actors training one model together; see the module docstring.

    ``optim``, ``loss``, ``cfg``, ``total_steps``, ``temperature`` and ``seed`` are those of
    ``build_trainer`` (``MegatronTrainer`` when ``cfg`` is a MegatronTrainerConfig, else
    ``TorchTrainer``).
    ``num_cpus`` / ``num_gpus`` are each actor's Ray resource request; ``backend`` is the
    process group's (None: NCCL where a rank sees CUDA, gloo elsewhere); ``scheduling`` is an
    optional list of one Ray scheduling strategy per rank (e.g. NodeAffinitySchedulingStrategy
    from a PlacedModel's ranks) and
    ``gpus`` the GPU index on its node each rank must use (its CUDA_VISIBLE_DEVICES);
    ``master_port`` the rendezvous port on rank 0's node (None: a free one).
    """

    def __init__(
        self,
        agent: str,
        model_path: str,
        optim,
        loss,
        cfg,
        total_steps: int,
        temperature: float = 1.0,
        seed: int = 0,
        world_size: int = 1,
        num_cpus: float = 0.0,
        num_gpus: float = 0.0,
        backend: str | None = None,
        scheduling: list | None = None,
        timeout_s: float = 1800.0,
        gpus: list[int] | None = None,
        master_port: int | None = None,
    ):
        import ray

        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if scheduling is not None and len(scheduling) != world_size:
            raise ValueError(f"scheduling has {len(scheduling)} entries, world_size {world_size}")
        if gpus is not None and len(gpus) != world_size:
            raise ValueError(f"gpus has {len(gpus)} entries, world_size {world_size}")
        if not ray.is_initialized():
            raise RuntimeError("RayTrainer needs Ray: call ray.init(...) first")
        self.agent, self.world_size, self.rank = agent, world_size, 0
        self.step = 0
        remote = ray.remote(TrainerRankActor)
        self.actors = [
            remote.options(
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                max_restarts=0,  # a dead rank breaks the process group: fail, do not restart
                **({"scheduling_strategy": scheduling[r]} if scheduling else {}),
            ).remote(r, world_size, gpus[r] if gpus else None)
            for r in range(world_size)
        ]
        try:
            (master,) = self._gather([self.actors[0].address.remote(master_port)], ranks=[0])
            args = (model_path, optim, loss, cfg, total_steps, temperature, seed)
            ranks = self._gather(
                [a.setup.remote(master, backend, timeout_s, *args) for a in self.actors]
            )
        except BaseException:
            self.close()
            raise
        self.pids = [pid for pid, _, _ in ranks]
        self.replicas = [(dp_rank, dp_size) for _, dp_rank, dp_size in ranks]

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
            except BaseException as e:
                # A rank whose peer died mid-collective fails first ("connection reset"): name
                # the dead peer if Ray reports one within a few seconds, not the survivor.
                dead = self._dead_rank(pending, rank_of)
                self.close()  # the other ranks may be stuck in a collective with this one
                if dead is not None:
                    raise TrainerDied(self.agent, dead, "a collective with it failed") from e
                raise
        return [results[r] for r in ranks]

    @staticmethod
    def _dead_rank(pending: list, rank_of: dict, wait_s: float = 5.0) -> int | None:
        """The rank of a call in ``pending`` whose actor is dead, if Ray says so in ``wait_s``."""
        import ray
        from ray.exceptions import RayActorError

        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=wait_s)
        for ref in ready:
            try:
                ray.get(ref)
            except RayActorError:
                return rank_of[ref]
            except BaseException:  # a survivor's own collective error
                continue
        return None

    def _all(self, method: str, *args) -> list:
        if not self.actors:
            raise RuntimeError(f"the trainer group of agent {self.agent!r} is closed")
        return self._gather([getattr(a, method).remote(*args) for a in self.actors])

    # ---------------------------------------------------------------- TorchTrainer's surface

    def train_step(self, samples: list[Sample], version: int | None = None) -> dict[str, float]:
        """Train on a global batch (TorchTrainer.train_step): each data-parallel replica trains
        on its shard (balanced by tokens); returns rank 0's metrics, which are global."""
        if not self.actors:
            raise RuntimeError(f"the trainer group of agent {self.agent!r} is closed")
        refs = [
            a.train_step.remote(shard_samples(samples, dp_rank, dp_size), version)
            for a, (dp_rank, dp_size) in zip(self.actors, self.replicas, strict=True)
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

    def weight_broadcaster(self) -> RayBroadcaster:
        """Rank 0 of the distributed weight sync: this group's rank 0 actor, so the weights go
        from its GPU to the engines and never through the driver."""
        return RayBroadcaster(self)

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


class RayBroadcaster:
    """``LocalBroadcaster``'s surface (kernel.sync.push), carried out by the group's actors:
    every rank gathers each bucket (gathering takes them all), rank 0 broadcasts it, and each
    rank shares its own copy (the shared transport: one payload per rank)."""

    def __init__(self, group: RayTrainer):
        self.group = group

    def _rank0(self, method: str, *args):
        (result,) = self.group._gather([getattr(self.group.actors[0], method).remote(*args)], [0])
        return result

    def rendezvous(self) -> tuple[str, int]:
        return self._rank0("weight_rendezvous")

    def backend(self) -> str:
        return self._rank0("weight_backend")

    def join(self, cfg) -> None:
        self._rank0("join_weight_group", cfg)

    def start(self, bucket_bytes: int, backend: str) -> None:
        self.group._all("start_weights", bucket_bytes, backend)

    def next(self):
        return self.group._all("next_weights")[0]  # every rank gathers; rank 0's bucket

    def broadcast(self) -> None:
        self._rank0("broadcast_weights")

    def share(self) -> list[str]:
        return self.group._all("share_weights")

    def release(self) -> None:
        if self.group.actors:
            self.group._all("release_weights")

    def leave(self) -> None:
        if self.group.actors:  # a stopped group has left with its processes
            self._rank0("leave_weight_group")
