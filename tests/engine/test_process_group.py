"""kernel.engine.process_group: a process group beside the default one, checked with a real
second process (rank 1) and gloo."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

from kernel.engine.launch import free_port
from kernel.engine.process_group import (
    GroupConfig,
    destroy_custom_process_group,
    init_custom_process_group,
)

RANK1 = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist
    from kernel.engine.process_group import (
        GroupConfig, destroy_custom_process_group, init_custom_process_group
    )
    cfg = GroupConfig(master_port=int(sys.argv[1]), group_name="g", timeout_s=60)
    group = init_custom_process_group(cfg, rank=1)
    t = torch.zeros(3)
    dist.broadcast(t, src=0, group=group)              # receive from rank 0
    dist.broadcast(t * 10, src=1, group=group)         # send back, scaled
    dist.barrier(group=group)                          # both done with the pair
    destroy_custom_process_group(group)
    print("left the group", flush=True)
    # Leave without the interpreter's teardown: gloo's threads met at process exit, in C++
    # static destructors, while the other rank still holds its end of the pair, can abort
    # ("terminate called without an active exception": CI on 2026-11-26, then a fresh clone
    # in issue 65, though a barrier came first). That exit path is torch's, not this
    # module's, and no engine takes it (an engine leaves a group and keeps serving). What
    # the test checks is the line above.
    os._exit(0)
    """
)


def test_broadcast_both_ways_without_a_default_group():
    config = GroupConfig(master_port=free_port(), group_name="g", timeout_s=60)
    peer = subprocess.Popen(
        [sys.executable, "-c", RANK1, str(config.master_port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        group = init_custom_process_group(config, rank=0)
        dist.broadcast(torch.tensor([1.0, 2.0, 3.0]), src=0, group=group)
        back = torch.zeros(3)
        dist.broadcast(back, src=1, group=group)
        assert back.tolist() == [10.0, 20.0, 30.0]
        assert not dist.is_initialized()  # only the custom group exists
        dist.barrier(group=group)
        # The peer leaves first; rank 0 keeps its end until the peer has destroyed its group.
        out, err = peer.communicate(timeout=60)
        assert (peer.returncode, out) == (0, "left the group\n"), err[-2000:]
        destroy_custom_process_group(group)
        assert group not in dist.distributed_c10d._world.pg_map
    finally:
        if peer.poll() is None:
            peer.kill()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"backend": "mpi"}, "backend"),
        ({"master_port": 0}, "master_port"),
        ({"world_size": 1}, "world_size"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"group_name": ""}, "group_name"),
    ],
)
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        GroupConfig(**kwargs).validate()


def test_rank_outside_the_group_is_refused():
    with pytest.raises(ValueError, match="rank"):
        init_custom_process_group(GroupConfig(world_size=2), rank=2)
