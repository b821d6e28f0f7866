"""Start a third-party server whose API key may only be given as a flag, without the key on
its command line.

SGLang's ``sglang.launch_server`` and ``sglang_router.launch_router`` take their key only as
``--api-key KEY``, and a command line is readable by every local user (``ps``,
``/proc/PID/cmdline``). ``python -m kernel.engine.keyed MODULE ARGS...`` reads the key from
``TANDEM_API_KEY`` instead, removes it from its environment (no process the server starts
inherits it), appends ``--api-key KEY`` to ``sys.argv`` -- what the module parses, not the
process's command line, which the kernel fixed at exec -- and runs MODULE as ``__main__``.
"""

from __future__ import annotations

import os
import runpy
import sys

from kernel.auth import API_KEY_ENV


def keyed_command(module: str, args: list[str]) -> list[str]:
    """The command line that runs ``python -m module args`` with the key of ``keyed_env``."""
    return [sys.executable, "-m", "kernel.engine.keyed", module, *args]


def keyed_env(api_key: str | None) -> dict[str, str]:
    """The environment of a ``keyed_command``: its key, set even when empty, so a key in the
    starting process's own environment never reaches a keyless server."""
    return {API_KEY_ENV: api_key or ""}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise SystemExit("usage: python -m kernel.engine.keyed MODULE [ARGS...]")
    module, args = argv[0], list(argv[1:])
    if "--api-key" in args or any(a.startswith("--api-key=") for a in args):
        raise SystemExit(f"{module}: give the API key in {API_KEY_ENV}, not on the command line")
    key = os.environ.pop(API_KEY_ENV, "")
    sys.argv = [module, *args, *(["--api-key", key] if key else [])]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
