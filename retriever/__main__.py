"""Command line of the retriever: build an index, serve it.

    python -m retriever build --corpus corpus.jsonl --out DIR [--index-type flat|ivf|hnsw]
    python -m retriever serve --index DIR --host 127.0.0.1 --port 8000 [--api_key_file PATH]

``serve`` reads its key from the ``TANDEM_API_KEY`` environment variable or ``--api_key_file``
(a file only its user may read); ``--api_key`` is refused (a command line is readable by every
local user).

Every field of ``BuildConfig`` / ``RetrieverSettings`` is a flag (``--help`` lists them with
their help text). Flags may be spelt with dashes or underscores (``--id-key`` = ``--id_key``).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from kernel.auth import API_KEY_ENV, refuse_key_flag, server_key
from retriever.app import RetrieverSettings
from retriever.index import BuildConfig

PROG = "python -m retriever"


def _underscored(argv: list[str]) -> list[str]:
    """``--id-key=x`` -> ``--id_key=x``: jsonargparse names flags after the dataclass fields."""
    out = []
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg[2:].partition("=")
            arg = "--" + name.replace("-", "_") + eq + value
        out.append(arg)
    return out


def parse(argv: list[str]) -> tuple[str, BuildConfig | RetrieverSettings]:
    """Flags -> (subcommand, its validated config)."""
    from jsonargparse import ArgumentParser, set_parsing_settings

    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = parser.add_subcommands(dest="command")
    classes = {"build": BuildConfig, "serve": RetrieverSettings}
    helps = {"build": "JSONL corpus -> faiss index folder.", "serve": "Serve an index over HTTP."}
    for name, cls in classes.items():
        p = ArgumentParser(prog=f"{PROG} {name}", description=cls.__doc__)
        p.add_class_arguments(cls, None)
        if cls is RetrieverSettings:
            key_file = "A file holding the API key, readable by this user only (chmod 600)."
            p.add_argument("--api_key_file", type=str | None, default=None, help=key_file)
        sub.add_subcommand(name, p, help=helps[name])
    argv = _underscored(argv)
    refuse_key_flag(argv)
    ns = parser.parse_args(argv)
    cls = classes[ns.command]
    values = {f.name: ns[ns.command][f.name] for f in dataclasses.fields(cls)}
    if cls is RetrieverSettings:
        values["api_key"] = server_key(ns[ns.command]["api_key_file"])
    return ns.command, cls(**values).validate()


def serve_command(settings: RetrieverSettings) -> tuple[list[str], dict[str, str]]:
    """The command line that starts a server with these settings, and its environment: the API
    key goes there (set even when empty, so an inherited one never reaches a keyless server)."""
    cmd = [sys.executable, "-m", "retriever", "serve"]
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if value is not None and f.name != "api_key":
            cmd += [f"--{f.name}", str(value)]
    return cmd, {API_KEY_ENV: settings.api_key or ""}


def main(argv: list[str] | None = None) -> None:
    try:
        command, config = parse(sys.argv[1:] if argv is None else argv)
        if command == "build":
            from retriever.index import build_index

            out = build_index(config)
            print(f"index written to {Path(out).resolve()}")
            return
    except ValueError as e:  # bad flags or corpus rows: the message says it all, no traceback
        sys.exit(f"error: {e}")
    import uvicorn

    from retriever.app import create_app

    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level=config.log_level)


if __name__ == "__main__":
    main()
