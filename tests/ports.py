"""Ports for a test's cluster plan: fixed ports, as a plan's are, yet free and the test's own.

A plan gives each service a base port plus its index (the second engine of a group serves on
``engine_base_port + 1``), and the service binds it seconds later, after Ray has started. A port
from ``free_port()`` is an ephemeral one: in that time any outgoing connection -- Ray's gRPC
opens hundreds -- can be handed the same number, and the engine then fails with "address
already in use" (it did, in CI). The ports here lie below the OS's ephemeral range, where only an
explicit bind lands, and are picked at random so that two test workers rarely meet.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def plan_ports(each: int = 4) -> dict[str, int]:
    """The base ports of a ``ClusterConfig`` (router, metrics, engine, master), ``each`` free
    ports apart, all below the ephemeral range and free now."""
    names = ("router", "metrics", "engine", "master")
    base = _free_run(each * len(names))
    return {f"{n}_base_port": base + i * each for i, n in enumerate(names)}


def rendezvous_port() -> int:
    """One port for a test's torch.distributed ranks, which bind it seconds later (after Python
    and torch start): below the ephemeral range for the same reason, and free now."""
    return _free_run(1)


def _free_run(span: int) -> int:
    """A port ``p`` below the ephemeral range with ``p .. p + span - 1`` free now."""
    top = _ephemeral_start() - span
    for _ in range(1000):
        p = random.randrange(20000, top)
        if all(_free(p + i) for i in range(span)):
            return p
    raise RuntimeError(f"no {span} consecutive free ports in 20000..{top}")
