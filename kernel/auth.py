"""The edge of Tandem's three HTTP services -- the embedded engine (``python -m kernel.engine``),
the retriever (``python -m retriever serve``) and the environment server (``python -m kernel env
serve``) -- so they check a key the same way and refuse it with the same answer: HTTP 401
``{"error": {"message": "missing or wrong Authorization: Bearer key"}}``.

- ``bearer_ok`` compares the raw header bytes with ``Bearer <key>`` in constant time; it never
  raises, whatever bytes a client sends (``hmac.compare_digest`` on two ``str`` raises on any
  non-ASCII character, which made a non-ASCII header a 500).
- ``BearerAuth`` is the ASGI middleware that applies it to every route but the open ones
  (``/health``), before any route or body parsing runs.
- ``BodyGuard`` is the ASGI middleware that refuses a POST that is not JSON (415) and a body
  over its limit (413), whether it declares its length or streams, before a route parses it.
- ``server_key`` is where a server's key comes from: the ``TANDEM_API_KEY`` environment
  variable, or ``--api_key_file PATH``, a file only the server's user may read. Never the
  command line: any local user -- and untrusted code the server runs -- can read a process's
  arguments (``ps``, ``/proc/PID/cmdline``), so ``refuse_key_flag`` turns ``--api_key`` away.

Standard library only: the retriever, which imports nothing else of the kernel, uses it too.
"""

from __future__ import annotations

import hmac
import json
import os
import stat
from collections.abc import Iterable, Mapping, Sequence

API_KEY_ENV = "TANDEM_API_KEY"
"""The environment variable every Tandem server reads its key from (and clients send)."""
UNAUTHORIZED = "missing or wrong Authorization: Bearer key"
KEY_FLAG_REFUSED = (
    "--api_key on the command line is refused: any local user (and code a server runs) can read "
    "a process's command line (ps, /proc/PID/cmdline). Give the key in the "
    f"{API_KEY_ENV} environment variable, or in a file only this user can read: "
    "--api_key_file PATH (chmod 600 PATH)."
)


def bearer_ok(header: bytes | str | None, key: str | None) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <key>`` (True when there is no key).
    Constant-time in the header's content; never raises: the header is compared as bytes
    (a ``str`` header, as Starlette decodes it, is turned back into its latin-1 bytes)."""
    if not key:
        return True
    if header is None:
        header = b""
    elif isinstance(header, str):
        header = header.encode("latin-1", errors="replace")
    return hmac.compare_digest(bytes(header), b"Bearer " + key.encode("utf-8"))


def error_body(message: str, kind: str | None = None) -> bytes:
    """``{"error": {"message": ...}}`` (and its ``type``, as OpenAI's errors have, when
    ``kind`` is given) as JSON bytes, whatever characters the message holds (a lone surrogate
    is escaped, never an encoding error)."""
    error = {"message": message} | ({"type": kind} if kind else {})
    return json.dumps({"error": error}, ensure_ascii=True).encode("ascii")


async def send_error(send, status: int, message: str, headers: Iterable = ()) -> None:
    """Answer an ASGI request with ``status`` (a 4xx) and ``error_body(message)``."""
    body = error_body(message, "invalid_request_error")
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BearerAuth:
    """ASGI middleware: with a key, every HTTP route but ``open_paths`` needs ``Authorization:
    Bearer <key>``; any other request gets 401 (``UNAUTHORIZED``) before a route runs."""

    def __init__(self, app, api_key: str | None, open_paths: Sequence[str] = ("/health",)) -> None:
        self.app, self.api_key, self.open_paths = app, api_key, tuple(open_paths)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and self.api_key and scope["path"] not in self.open_paths:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not bearer_ok(given, self.api_key):
                headers = [(b"www-authenticate", b"Bearer")]
                return await send_error(send, 401, UNAUTHORIZED, headers)
        return await self.app(scope, receive, send)


class _TooLarge(Exception):
    pass


class BodyGuard:
    """ASGI middleware: a POST, PUT or PATCH must say ``Content-Type: application/json`` (415:
    a browser sends that only after a CORS preflight, which no Tandem server grants, so no web
    page can drive one: no CSRF), and a body over ``limit`` bytes gets 413 (``too_large``, the
    message naming the server's flag), whether it declares its Content-Length or streams
    (counted as it arrives, before a route parses it)."""

    def __init__(self, app, limit: int, too_large: str) -> None:
        self.app, self.limit, self.too_large = app, limit, too_large

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if scope["method"] in ("POST", "PUT", "PATCH"):
            kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if kind != b"application/json":
                message = f"Content-Type must be application/json, got {kind[:80]!r}"
                return await send_error(send, 415, message)
        declared = headers.get(b"content-length", b"0")
        if not declared.isdigit():
            return await send_error(send, 400, f"Content-Length {declared[:40]!r} is no number")
        if int(declared) > self.limit:
            return await send_error(send, 413, self.too_large)
        seen, started = 0, False

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge
            return message

        async def watched(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except _TooLarge:
            if not started:
                await send_error(send, 413, self.too_large)


def refuse_key_flag(argv: Iterable[str]) -> None:
    """ValueError (``KEY_FLAG_REFUSED``) if ``argv`` gives ``--api_key`` / ``--api-key``."""
    for arg in argv:
        name = arg.split("=", 1)[0]
        if name in ("--api_key", "--api-key"):
            raise ValueError(KEY_FLAG_REFUSED)


def read_key_file(path: str | os.PathLike) -> str:
    """The key in ``path`` (surrounding whitespace stripped). ValueError, naming what to do,
    unless it is a regular file of this user that no one else may read or write (mode 600 or
    400), and holds a key."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise ValueError(f"--api_key_file {path}: cannot open it ({e.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"--api_key_file {path}: not a regular file")
        if info.st_uid != os.geteuid():
            raise ValueError(f"--api_key_file {path}: owned by another user (uid {info.st_uid})")
        if info.st_mode & 0o077:
            mode = stat.filemode(info.st_mode)
            raise ValueError(
                f"--api_key_file {path}: group or others may read or write it ({mode}); "
                f"only the server's user may: chmod 600 {path}"
            )
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(65537)
    finally:
        os.close(fd)
    try:
        key = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError(f"--api_key_file {path}: not UTF-8 text") from None
    if not key or len(raw) > 65536:
        raise ValueError(f"--api_key_file {path}: holds no key (or more than 64 KiB)")
    return key


def server_key(
    key_file: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """A server's key: from ``key_file`` when given (``read_key_file``), else the
    ``TANDEM_API_KEY`` environment variable, else None (no key: every route is open)."""
    if key_file:
        return read_key_file(key_file)
    return (os.environ if environ is None else environ).get(API_KEY_ENV) or None
