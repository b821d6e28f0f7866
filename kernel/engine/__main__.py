"""Start one embedded inference server: ``python -m kernel.engine --model PATH --port P``.

Every ``ServerConfig`` field is a flag (``--help`` lists them with their help text); the server
binds 127.0.0.1 unless ``--host`` says otherwise, reads its API key from the ``TANDEM_API_KEY``
environment variable or ``--api_key_file PATH`` (a file only its user may read; ``--api_key``
is refused: a command line is readable by every local user), and its port opens once the model
is loaded,
so ``GET /health`` answering 200 means ready. ``kernel.engine.launch.launch_server`` starts one
as a child process. A list is given as JSON or item by item: LoRA adapters loaded at start are
``--enable_lora true --lora_paths '["doctor=/ckpt/doctor", "patient=/ckpt/patient"]'``, or
``--lora_paths+ doctor=/ckpt/doctor --lora_paths+ patient=/ckpt/patient``.
"""

from __future__ import annotations

import dataclasses
import logging
import sys

from kernel.auth import refuse_key_flag, server_key
from kernel.engine.server import create_app
from kernel.engine.settings import ServerConfig


def parse_config(argv: list[str] | None = None) -> ServerConfig:
    """Flags -> a validated ServerConfig."""
    from jsonargparse import ArgumentParser, set_parsing_settings

    # Help text from the fields' docstrings only for --help: reading them parses this module's
    # source on every start (kernel.run.config.read_help_text does the same for the main CLI).
    args = sys.argv[1:] if argv is None else argv
    set_parsing_settings(docstring_parse_attribute_docstrings="-h" in args or "--help" in args)
    parser = ArgumentParser(prog="python -m kernel.engine", description=__doc__)
    parser.add_class_arguments(ServerConfig, None)
    parser.add_argument(
        "--api_key_file", type=str | None, default=None, help="A file holding the API key (600)."
    )
    try:
        refuse_key_flag(args)
    except ValueError as e:
        parser.error(str(e))
    ns = parser.parse_args(argv)
    values = {f.name: ns[f.name] for f in dataclasses.fields(ServerConfig)}
    try:
        values["api_key"] = server_key(ns["api_key_file"])
    except ValueError as e:
        parser.error(str(e))
    return ServerConfig(**values).validate()


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    config = parse_config(argv)
    logging.basicConfig(level=config.log_level.upper() if config.log_level != "trace" else "DEBUG")
    uvicorn.run(
        create_app(config),
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        access_log=config.log_level in ("info", "debug", "trace"),
        # Longer than the clients' keep-alive expiry (httpx: 5 s), so the server never closes
        # an idle pooled connection just as a client reuses it between training steps.
        timeout_keep_alive=75,
        # A stopped server (SIGTERM: its run ends, or its parent died) gives requests still in
        # flight 5 s; without a limit, requests held by a paused scheduler kept it alive for ever.
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
