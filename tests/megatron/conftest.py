"""Helpers of the Megatron tests: run a test file as gloo ranks, each its own process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from kernel.engine.launch import free_port

ROOT = Path(__file__).resolve().parents[2]


def run_ranks(
    script: str, argv: Callable[[int, int], list[str]], world: int = 2, env: dict | None = None
) -> None:
    """Run ``python script *argv(rank, port)`` for every rank at once, with one free rendezvous
    port; fails with the tail of every rank's log unless all of them exit 0."""
    port = free_port()
    environ = os.environ | {"PYTHONPATH": str(ROOT)} | (env or {})
    procs = [
        subprocess.Popen(
            [sys.executable, script, *argv(rank, port)],
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(world)
    ]
    logs = [p.communicate(timeout=120)[0].decode(errors="replace")[-3000:] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
