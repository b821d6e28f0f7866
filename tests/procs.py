"""What the tests read of this machine's processes, from /proc: looked at, never signalled.

Tests run in parallel (pytest-xdist), so a test counts only processes it started itself: its
children, or its descendants (through Ray's raylet, say); another worker's are never seen.
"""

from __future__ import annotations

import os
from pathlib import Path


def _stat(pid: int | str) -> tuple[str, int]:
    """(state, parent PID) of ``pid``; OSError once it is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def _table() -> dict[int, tuple[str, int]]:
    """PID -> (state, parent PID) of every process now."""
    table = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                table[int(proc.name)] = _stat(proc.name)
            except OSError:
                continue
    return table


def _cmdline(pid: int | str) -> str:
    """``pid``'s command line, its arguments NUL-separated; OSError once it is gone."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        return _stat(pid)[0] != "Z"
    except OSError:
        return False


def children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid``."""
    return [p for p, (_, parent) in _table().items() if parent == pid]


def descendants_named(*names: str) -> list[int]:
    """PIDs of live processes this test process started (directly or through another process)
    whose command line holds one of ``names``."""
    table, me, found = _table(), os.getpid(), []
    for pid, (state, _) in table.items():
        p = pid
        while p in table and p not in (me, 0, 1):
            p = table[p][1]
        if p != me or state == "Z":
            continue
        try:
            cmd = _cmdline(pid)
        except OSError:
            continue
        if any(name in cmd for name in names):
            found.append(pid)
    return found


def engines_of(run_dir: Path) -> list[int]:
    """PIDs of embedded servers serving a model under ``run_dir`` (a run folder is one test's
    own, so whoever started them, no other test's are counted)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = _cmdline(proc.name) if proc.name.isdigit() else ""
        except OSError:
            continue
        if "\0kernel.engine\0" in cmd and str(run_dir) in cmd:
            pids.append(int(proc.name))
    return pids
