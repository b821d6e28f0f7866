"""A torch.distributed process group of its own, next to (never instead of) the default one.

Weight sync joins processes that otherwise share nothing: a trainer (which may already run
its own default group for FSDP or Megatron) and inference servers (which have none). Like
SGLang's and verl's ``init_custom_process_group``, this builds a group from a TCP rendezvous
of its own and registers it with torch.distributed, so the usual collectives take it as
``group=``: ``dist.broadcast(tensor, src=0, group=pg)``. Ranks in the group are
0..world_size-1; by convention the trainer is rank 0 and engine ``i`` is ``rank_offset + i``.

It leans on two private torch.distributed helpers (``rendezvous`` and
``_new_process_group_helper``), exactly as SGLang and verl do; tests/engine/test_group.py
breaks first if a torch upgrade changes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

BACKENDS = ("gloo", "nccl")


@dataclass
class GroupConfig:
    """Where and how the weight-sync group meets."""

    master_address: str = "127.0.0.1"
    """Host of rank 0's rendezvous store (the trainer)."""
    master_port: int = 29600
    """TCP port of that store; one port per group."""
    world_size: int = 2
    """Processes in the group: the trainer plus every engine."""
    backend: str = "gloo"
    """gloo (CPU tensors) or nccl (CUDA tensors)."""
    group_name: str = "weight_update_group"
    """Name the engines know the group by (SGLang's group_name)."""
    timeout_s: float = 300.0
    """How long the rendezvous and each collective may wait."""

    def validate(self) -> GroupConfig:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port must be in 1..65535, got {self.master_port}")
        if self.world_size < 2:
            raise ValueError(f"world_size must be >= 2 (trainer + engines), got {self.world_size}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if not self.group_name:
            raise ValueError("group_name must not be empty")
        return self

    @property
    def init_method(self) -> str:
        return f"tcp://{self.master_address}:{self.master_port}"


def listen(host: str, port: int = 0, timeout_s: float = 300.0) -> dist.TCPStore:
    """Rank 0's rendezvous store, listening on ``host``:``port`` from now on (port 0: one the OS
    picks, read back as ``store.port``). Binding it before the port is handed to the other ranks
    leaves no moment in which another process can take the port -- a port that was merely free
    a moment ago can be gone by the time rank 0 listens (EADDRINUSE)."""
    timeout = timedelta(seconds=timeout_s)
    return dist.TCPStore(host, port, is_master=True, timeout=timeout, wait_for_workers=False)


def init_custom_process_group(
    config: GroupConfig, rank: int, store: dist.TCPStore | None = None
) -> dist.ProcessGroup:
    """Join the group as ``rank``; blocks until all ``world_size`` ranks have joined. Rank 0 may
    pass the store it already ``listen``s on (at ``config.master_port``); without one it opens
    the port itself."""
    config.validate()
    if not 0 <= rank < config.world_size:
        raise ValueError(f"rank must be in 0..{config.world_size - 1}, got {rank}")
    if config.backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend 'nccl' needs a CUDA device; use 'gloo' on CPU")
    timeout = timedelta(seconds=config.timeout_s)
    world_size = config.world_size
    if store is None:
        store, rank, world_size = next(
            c10d.rendezvous(config.init_method, rank, world_size, timeout=timeout)
        )
    store.set_timeout(timeout)
    group, _ = c10d._new_process_group_helper(
        world_size,
        rank,
        [],
        config.backend,
        store,
        group_name=config.group_name,
        timeout=timeout,
    )
    # Group rank == rank here; registering the map lets dist.* collectives accept the group.
    c10d._world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def destroy_custom_process_group(group: dist.ProcessGroup) -> None:
    """Leave the group and free its resources; the default group, if any, is untouched."""
    dist.destroy_process_group(group)
