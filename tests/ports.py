"""Ports for a test's cluster plan: fixed ports, as a plan's are, yet free and the test's own.

A plan gives each service a base port plus its index (the second engine of a group serves on
``engine_base_port + 1``), and the service binds it seconds later, after Ray has started. A port
the OS picks is an ephemeral one: in that time any outgoing connection -- Ray's gRPC opens
hundreds -- can be handed the same number, and the engine then fails with "address already in
use" (it did, in CI). The ports here lie below the OS's ephemeral range, where only an explicit
bind lands, and are picked at random so that two test workers rarely meet -- as one port from
``kernel.engine.launch.free_port`` is.
"""

from __future__ import annotations

import random

from kernel.engine.launch import LOWEST_PORT, bindable, ephemeral_start

_PICK = random.SystemRandom()  # a test may seed the module's generator


def plan_ports(each: int = 4) -> dict[str, int]:
    """The base ports of a ``ClusterConfig`` (router, metrics, engine, master), ``each`` free
    ports apart, all below the ephemeral range and free now."""
    names = ("router", "metrics", "engine", "master")
    base = _free_run(each * len(names))
    return {f"{n}_base_port": base + i * each for i, n in enumerate(names)}


def _free_run(span: int) -> int:
    """A port ``p`` below the ephemeral range with ``p .. p + span - 1`` free now."""
    top = ephemeral_start() - span
    for _ in range(1000):
        p = _PICK.randrange(LOWEST_PORT, top)
        if all(bindable("0.0.0.0", p + i) for i in range(span)):
            return p
    raise RuntimeError(f"no {span} consecutive free ports in {LOWEST_PORT}..{top}")
