"""Worker processes for the environment server: every reset, step and close of a hosted
environment runs in one of them, never on the server's event loop, under a deadline that kills
the worker and everything it started.

Why processes: an action is text a policy wrote, and scoring it can take CPU out of all
proportion to its size (a tower of powers in math-verify, a quadratic scan, a huge literal in
the calculator). On the event loop that work stalls every session and ``/health``; in a thread
it cannot be stopped. A worker is a separate process, so the server's loop only waits on a
pipe, and at the deadline the worker is killed (SIGKILL) with every process it started: the
kernel closes its descriptors, its memory goes back, and the next call gets a fresh worker.

``WorkerPool(size)`` starts workers as calls need them, at most ``size``, from a fork server
(``multiprocessing``'s ``forkserver``, with the environments' modules preloaded): a fresh
worker is a fork of a process that has imported them, not of the server, so it holds none of
the server's sockets or sessions. ``await pool.run(timeout_s, fn, *args)`` sends ``fn`` (a
module-level function, pickled by reference) and its arguments to an idle worker, which runs it
(awaiting it if it returns a coroutine, on the worker's own event loop) and sends back its result
or its error (``WorkerFailed``: the exception's type and message); ``WorkerTimeout`` when the
deadline passed (the worker killed), ``WorkerLost`` when the worker died without answering (out
of memory, a crash), a cancelled call (its client gone) kills its worker too. A worker is a
child subreaper (``PR_SET_CHILD_SUBREAPER``), so what its children leave behind stays in its
tree and is killed with it; it dies when the server does (its lifeline pipe closes).

``offload(fn, *args)`` is for an environment's blocking work: inside a worker it runs ``fn``
right there, on the main thread (its deadline bounds it, and SIGALRM-based limits such as
math-verify's work there); played in-process, it runs in a thread as before.

``BlockingWorker`` is the same boundary for synchronous callers outside the server (a scorer a
reward hook calls from any thread): ``worker.call(timeout_s, fn, *args)`` runs ``fn`` in one
worker process, one call at a time, and on ``WorkerTimeout`` or ``WorkerLost`` the next call
gets a fresh worker. Inside a worker (a hosted environment already under its deadline) it runs
``fn`` inline.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_IN_WORKER = False
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36


class WorkerFailed(RuntimeError):
    """The call raised in the worker: its exception's type name and message."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}" if message else kind)
        self.kind, self.message = kind, message


class WorkerTimeout(TimeoutError):
    """The call outlived its deadline: its worker and everything it started were killed."""


class WorkerLost(RuntimeError):
    """The worker died before it answered (killed for memory, crashed)."""


async def offload(fn, *args):
    """``fn(*args)``, blocking work of an environment: inline on a worker's main thread (its
    deadline bounds it), else in a thread (played in-process, the caller's loop stays free)."""
    if _IN_WORKER and threading.current_thread() is threading.main_thread():
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


def _children() -> dict[int, list[int]]:
    """Parent PID -> PIDs of its live (not zombie) children, from /proc."""
    table: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != b"Z":
            table.setdefault(int(fields[1]), []).append(int(name))
    return table


def descendants(pid: int) -> list[int]:
    """Live processes below ``pid`` (children, their children, ...)."""
    table, out, todo = _children(), [], [pid]
    while todo:
        kids = table.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def kill_tree(pid: int, rounds: int = 8) -> None:
    """SIGKILL everything below ``pid`` (again while anything is left: a killed parent's
    children move up to the subreaper, still below ``pid``), then ``pid`` itself."""
    for _ in range(rounds):
        found = descendants(pid)
        if not found:
            break
        for p in found:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _watch(lifeline) -> None:
    """A worker's thread: when the server is gone (its end of the lifeline closed), end the
    worker and what it started, even in the middle of a call."""
    with contextlib.suppress(BaseException):
        lifeline.recv_bytes()
    for _ in range(4):
        for p in descendants(os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
    os._exit(1)


def _serve(conn, lifeline, memory_mb: int) -> None:
    """A worker's main loop: run each call it is sent, answer ("ok", result) or ("err", type,
    message); end when the server closes the connection."""
    global _IN_WORKER
    _IN_WORKER = True
    # Ctrl-C is the server's to handle (a handler, not SIG_IGN: that would pass to the
    # sandboxed programs a worker starts, through exec)
    signal.signal(signal.SIGINT, lambda *_: None)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if memory_mb > 0:  # a soft limit: a runaway call gets MemoryError, not the OOM killer
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        soft = memory_mb * 2**20
        if hard == resource.RLIM_INFINITY or soft < hard:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    threading.Thread(target=_watch, args=(lifeline,), daemon=True).start()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return
        except BaseException as e:  # arguments this worker cannot unpickle
            conn.send(("err", type(e).__name__, str(e)[:2000]))
            continue
        try:
            result = fn(*args)
            if asyncio.iscoroutine(result):
                result = loop.run_until_complete(result)
            reply = ("ok", result)
        except BaseException as e:  # everything, RecursionError and MemoryError included
            reply = ("err", type(e).__name__, _message(e))
        _reap()
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return
        except BaseException as e:  # a result that cannot be pickled
            conn.send(("err", type(e).__name__, f"the result could not be sent back: {e}"[:2000]))


def _message(e: BaseException) -> str:
    try:
        return str(e)[:2000]
    except BaseException:
        return ""


def _reap() -> None:
    """Collect exited orphans that moved up to this (subreaper) worker."""
    with contextlib.suppress(ChildProcessError, OSError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


class _Worker:
    """One worker process and the server's end of its connection (blocking calls: the pool
    makes them from its threads)."""

    def __init__(self, ctx, lifeline, memory_mb: int) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_serve, args=(child, lifeline, memory_mb), name="tandem-env-worker", daemon=True
        )
        self.proc.start()
        child.close()

    def call(self, fn, args: tuple) -> tuple:
        self.conn.send((fn, args))
        return self.conn.recv()

    def kill(self) -> None:
        kill_tree(self.proc.pid)
        with contextlib.suppress(Exception):
            self.proc.join(5)
        with contextlib.suppress(OSError):
            self.conn.close()


class BlockingWorker:
    """One worker process for blocking callers (module docstring), started by the first call
    and again after a deadline or a crash, or in a child this process forked. A fresh
    interpreter, not a fork server's child: those re-run the caller's main script first, and a
    scorer is called from scripts that do not guard it. ``preload``: modules a new worker imports
    before its first call (not counted against that call's deadline); ``memory_mb``: its
    address-space (soft) limit, 0 for none."""

    START_S = 120.0  # a new worker's imports (sympy: seconds on a busy machine)

    def __init__(self, preload: tuple[str, ...] = (), memory_mb: int = 0) -> None:
        self.preload, self.memory_mb = preload, memory_mb
        self._lock = threading.Lock()
        self._conn = self._proc = None
        self._pid = os.getpid()
        self.killed = 0  # workers killed at a deadline

    def call(self, timeout_s: float | None, fn, *args) -> Any:
        """``fn(*args)`` in the worker within ``timeout_s`` seconds (None: no deadline);
        raises WorkerFailed, WorkerTimeout or WorkerLost (module docstring)."""
        if _IN_WORKER:
            return fn(*args)
        with self._lock:
            if self._pid != os.getpid():  # a fork of the process that started it: not ours
                self._conn = self._proc = None
                self._pid = os.getpid()
            if self._proc is not None and self._proc.poll() is not None:
                self.close()  # died between calls: start another, lose no call
            if self._proc is None:
                self._start()
            reply = self._exchange(timeout_s, fn, args)
        if reply[0] == "ok":
            return reply[1]
        raise WorkerFailed(reply[1], reply[2])

    def _start(self) -> None:
        ours, theirs = multiprocessing.Pipe()
        life_r, life_w = os.pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        cmd = [sys.executable, "-c", "import sys; from kernel.env.workers import serve_fds; "
               "serve_fds(*map(int, sys.argv[1:]))", str(theirs.fileno()), str(life_r),
               str(self.memory_mb)]  # fmt: skip
        try:  # started from a thread that lives as long as this process: the worker's
            # parent-death signal fires when the thread that started it ends
            self._proc = _launcher().submit(
                subprocess.Popen, cmd, pass_fds=(theirs.fileno(), life_r), env=env,
                stdin=subprocess.DEVNULL,
            ).result()  # fmt: skip
        finally:
            theirs.close()
            os.close(life_r)
        self._conn, self._life_w = ours, life_w
        for module in self.preload:
            reply = self._exchange(self.START_S, _import, (module,))
            if reply[0] != "ok":
                self.close()
                raise WorkerFailed(reply[1], reply[2])

    def _exchange(self, timeout_s: float | None, fn, args: tuple) -> tuple:
        try:
            self._conn.send((fn, args))
            if self._conn.poll(timeout_s):
                return self._conn.recv()
        except (EOFError, OSError) as e:
            self.close()
            raise WorkerLost(f"the worker died ({type(e).__name__})") from None
        self.killed += 1
        self.close()
        raise WorkerTimeout(f"the call took longer than {timeout_s} s")

    def close(self) -> None:
        """Kill the worker and what it started (the next call starts a new one)."""
        if self._proc is None:
            return
        kill_tree(self._proc.pid)
        with contextlib.suppress(Exception):
            self._proc.wait(5)
        for end in (self._conn.close, lambda: os.close(self._life_w)):
            with contextlib.suppress(OSError):
                end()
        self._conn = self._proc = None


def _import(module: str) -> None:
    importlib.import_module(module)


_LAUNCHERS: dict[int, ThreadPoolExecutor] = {}


def _launcher() -> ThreadPoolExecutor:
    """This process's one thread that starts BlockingWorkers (made again after a fork)."""
    pid = os.getpid()
    if pid not in _LAUNCHERS:
        _LAUNCHERS.clear()
        _LAUNCHERS[pid] = ThreadPoolExecutor(1, thread_name_prefix="tandem-worker-launcher")
    return _LAUNCHERS[pid]


def serve_fds(conn_fd: int, life_fd: int, memory_mb: int) -> None:
    """A BlockingWorker's main: serve calls on the connection ``conn_fd`` until it closes, and
    end when the read end of a pipe ``life_fd`` sees its caller gone."""
    from multiprocessing.connection import Connection

    _serve(Connection(conn_fd), Connection(life_fd, writable=False), memory_mb)


class WorkerPool:
    """At most ``size`` worker processes, started as calls need them (see the module
    docstring). ``preload``: modules the fork server imports once, so workers start warm;
    ``memory_mb``: each worker's address-space (soft) limit, 0 for none."""

    def __init__(self, size: int, preload: tuple[str, ...] = (), memory_mb: int = 0) -> None:
        if size < 1:
            raise ValueError(f"workers must be >= 1, got {size}")
        self.size, self.memory_mb = size, memory_mb
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(["kernel.env.workers", *preload])
        self._idle: list[_Worker] = []
        self._slots = asyncio.Semaphore(size)
        self._threads = ThreadPoolExecutor(2 * size + 1, thread_name_prefix="tandem-env-worker")
        self._lifeline = self._life_w = None  # made with the first worker
        self._all: set[_Worker] = set()
        self.killed = 0  # workers killed at a deadline or a cancelled call

    @property
    def started(self) -> int:
        """Workers alive now (busy or idle)."""
        return len(self._all)

    async def warm(self, n: int = 1) -> None:
        """Start ``n`` workers now (the first start launches the fork server: seconds)."""
        loop = asyncio.get_running_loop()
        for _ in range(min(n, self.size) - len(self._all)):
            worker = await loop.run_in_executor(self._threads, self._start)
            self._idle.append(worker)

    def _start(self) -> _Worker:
        if self._lifeline is None:  # its write end stays here: closed when this process ends
            self._lifeline, self._life_w = self._ctx.Pipe(duplex=False)
        worker = _Worker(self._ctx, self._lifeline, self.memory_mb)
        self._all.add(worker)
        return worker

    def _discard(self, worker: _Worker) -> None:
        self._all.discard(worker)
        worker.kill()

    async def run(self, timeout_s: float, fn, *args) -> Any:
        """``fn(*args)`` in a worker, within ``timeout_s`` seconds of the worker starting it
        (waiting for a free worker does not count). Raises WorkerFailed, WorkerTimeout or
        WorkerLost (module docstring)."""
        loop = asyncio.get_running_loop()
        async with self._slots:
            worker = self._idle.pop() if self._idle else None
            if worker is None:
                worker = await loop.run_in_executor(self._threads, self._start)
            call = loop.run_in_executor(self._threads, worker.call, fn, args)
            try:
                reply = await asyncio.wait_for(call, timeout_s)
            except TimeoutError:
                self.killed += 1
                await asyncio.shield(loop.run_in_executor(self._threads, self._discard, worker))
                raise WorkerTimeout(f"the call took longer than {timeout_s} s") from None
            except asyncio.CancelledError:
                self.killed += 1
                self._threads.submit(self._discard, worker)  # no await: we are being cancelled
                raise
            except (EOFError, OSError) as e:
                await loop.run_in_executor(self._threads, self._discard, worker)
                raise WorkerLost(f"the worker died ({type(e).__name__})") from None
            except BaseException as e:  # the arguments could not be pickled: worker unused
                self._idle.append(worker)
                raise WorkerFailed(type(e).__name__, _message(e)) from None
            self._idle.append(worker)
        if reply[0] == "ok":
            return reply[1]
        raise WorkerFailed(reply[1], reply[2])

    def close(self) -> None:
        """Kill every worker (blocking; the server's shutdown)."""
        for worker in list(self._all):
            self._discard(worker)
        self._idle.clear()
        self._threads.shutdown(wait=False, cancel_futures=True)
        for end in (self._life_w, self._lifeline):
            with contextlib.suppress(OSError, AttributeError):
                end.close()
        self._lifeline = self._life_w = None
