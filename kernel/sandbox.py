"""Run untrusted Python -- model-written code and its tests -- without letting it harm the machine.

``await Sandbox(SandboxConfig()).run(code, tests)`` runs ``code`` and then each test (an
``assert`` or a small block) in one fresh interpreter and returns a ``RunResult``: a status,
pass/fail per test, the output. It never raises for what the code does; bad code is a status.

The boundary is the kernel's, set up in the child before the interpreter starts (``_enter``):

- **its own file system view** (a mount namespace): a fresh root holding only the system's
  directories (``/usr``, ``/etc``, ...) and the interpreter's installation, all read-only, a few
  device files, a writable home (``/sandbox``) and a private ``/tmp`` (each a small tmpfs of
  its own). The old root is detached: the parent's files, the repository, the virtualenv (and
  any data in it) and other runs' folders are not there to open;
- **its own processes** (a PID namespace): PID 1 is a ``sleep`` that holds nothing of the
  parent's, the interpreter is PID 2, and ``/proc`` is remounted to show only the namespace's
  processes, so no other process's command line or environment is in reach; when the run ends,
  or is killed on timeout, PID 1 is killed and with it everything the run started, even a child
  in a session of its own;
- **one cap across all its processes** (a cgroup per run, v1 ``pids`` + ``memory`` or v2):
  ``max_processes`` tasks and ``memory_mb`` of memory for the run and all its children
  together; a run the kernel killed for memory is ``memory``; the cgroup is emptied and removed
  before ``run`` returns;
- **no network**: a fresh network namespace, where not even loopback reaches a service;
- **no privilege**: user ``nobody``, no supplementary groups, ``no_new_privs`` (no set-uid
  program raises it); hard ``setrlimit`` limits per process (CPU seconds, address space, file
  size, open files); an environment of ``PATH`` and ``HOME`` only;
- inside the interpreter (``python -I -S``: no site-packages, no user paths, standard library
  only) an audit hook (PEP 578) refuses sockets, subprocesses, forks, signals, ``ctypes`` and
  file changes outside its folder. It is a second layer that gives clear errors, not the
  boundary: code that steps around it meets the kernel's limits above.

What the machine allows is probed once per ``Sandbox`` (a real confined start) and reported in
``isolation`` (``mountns``, ``pidns``, ``cgroup``, ``netns``, ``nobody``); ``missing`` says why a
promise is not kept. Most need root. Where any is missing the sandbox refuses to start
(``SandboxUnavailable`` names what is missing) unless ``allow_weak_isolation=True`` asks it to run
with what remains -- without a mount namespace, a throwaway folder under the temp dir as user
nobody, as before. docs/reliability.md ("The sandbox's boundary") lists each promise, its
mechanism and the test that proves it. What it does not protect is the reward: code run with its
tests can end the process early or print anything, so a recipe that fears reward hacking keeps
some tests hidden or checks outputs in the parent.

Statuses: ``passed`` (every test passed; no tests: it ran to the end), ``failed`` (a test
failed or the code raised), ``syntax_error``, ``timeout`` (wall clock or CPU limit),
``memory`` (MemoryError, the address-space limit, or the run's cgroup ran out of memory),
``output_limit`` and ``crashed`` (killed by another signal, or it exited without a report).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import ctypes
import dataclasses
import functools
import itertools
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field

NOBODY = 65534
HOME = "/sandbox"  # the run's folder, in its own file system view
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x08000000,
    0x10000000,
    0x20000000,
    0x40000000,
)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 0x1, 0x2, 0x4, 0x8, 0x20
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
# Resolved here, in the parent: the child between fork and exec must not load anything (another
# thread may hold the loader's lock at the fork).
_LIBC = ctypes.CDLL(None, use_errno=True)
_UNSHARE, _PRCTL = getattr(_LIBC, "unshare", None), getattr(_LIBC, "prctl", None)  # Linux
_MOUNT, _UMOUNT2 = getattr(_LIBC, "mount", None), getattr(_LIBC, "umount2", None)
_PIVOT_ROOT, _SETNS = getattr(_LIBC, "pivot_root", None), getattr(_LIBC, "setns", None)
if _MOUNT is not None:
    _MOUNT.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
STATUSES = ("passed", "failed", "syntax_error", "timeout", "memory", "output_limit", "crashed")
PROMISES = ("mountns", "pidns", "cgroup", "netns", "nobody")
"""What ``Sandbox.isolation`` reports; each is kept or named in ``Sandbox.missing``."""
# The system's directories shown (read-only) in a run's view, and the device files it may use.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
DEV_LINKS = (
    ("/dev/fd", "/proc/self/fd"),
    ("/dev/stdin", "/proc/self/fd/0"),
    ("/dev/stdout", "/proc/self/fd/1"),
    ("/dev/stderr", "/proc/self/fd/2"),
)
REPORT_LIMIT = 16 * 2**20  # the harness's report is a few KiB; anything past this is garbage
_RUNS = itertools.count()

# Runs in the sandboxed interpreter: the audit hook, then the code, then each test; the report
# goes to the file descriptor named in argv[1], which only the parent reads.
_HARNESS = r"""
import json, os, sys
REPORT, HOME = int(sys.argv[1]), os.getcwd() + os.sep
BLOCKED = {
    "socket.__new__", "socket.connect", "socket.bind", "subprocess.Popen", "os.system",
    "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
    "signal.pthread_kill", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "sys.addaudithook",
    "os.setuid", "os.setgid", "os.chroot", "os.putenv", "os.unsetenv", "mmap.__new__",
}
PATHS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.chmod",
         "os.chown", "os.truncate", "os.utime", "shutil.rmtree", "os.listxattr", "os.setxattr"}
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

def outside(path):
    if isinstance(path, int):
        return False
    return not (os.path.realpath(os.fsdecode(path)) + os.sep).startswith(HOME)

def guard(event, args):
    if event in BLOCKED or (event == "import" and args[0] in ("ctypes", "_ctypes")):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open":
        path, mode, flags = args
        writes = any(c in (mode or "") for c in "wax+") or (flags or 0) & WRITE
        if writes and path is not None and outside(path):
            raise PermissionError(f"sandbox: writing {path!r} is not allowed")
    elif event in PATHS and any(outside(a) for a in args if isinstance(a, (str, bytes))):
        raise PermissionError(f"sandbox: {event} outside the working directory is not allowed")

def short(exc):
    return f"{type(exc).__name__}: {exc}"[:300]

report = {"syntax_error": None, "error": None, "memory": False, "tests": []}
with open("solution.py") as f:
    source = f.read()
with open("tests.json") as f:
    tests = json.load(f)
out = os.fdopen(REPORT, "w")
sys.addaudithook(guard)
try:
    code = compile(source, "solution.py", "exec")
except (SyntaxError, ValueError) as exc:
    report["syntax_error"] = short(exc)
else:
    scope = {"__name__": "__main__"}
    try:
        exec(code, scope)
    except MemoryError as exc:
        report["memory"], report["error"] = True, short(exc)
    except BaseException as exc:
        report["error"] = short(exc)
    if report["error"] is None:
        for test in tests:
            try:
                exec(compile(test, "test", "exec"), scope)
                report["tests"].append([True, None])
            except MemoryError as exc:
                report["memory"] = True
                report["tests"].append([False, short(exc)])
            except BaseException as exc:
                report["tests"].append([False, short(exc)])
out.write(json.dumps(report))
out.flush()
"""


PARSE_LOCK = threading.Lock()
"""Held by every parse of model-written Python in this process (``parse_python``); a caller
whose library parses Python itself (math-verify's sympy ``parse_expr``) holds it around that."""


def parse_python(source: str, mode: str = "exec") -> ast.AST:
    """``ast.parse(source, mode=mode)``, safe to call from several threads at once.

    CPython before 3.11.8 / 3.12.2 keeps the AST builder's recursion depth in state shared by
    all threads (gh-106905): when a garbage collection inside one thread's parse runs Python
    code and another thread parses meanwhile, the parse fails with ``SystemError: AST
    constructor recursion depth mismatch``. Scorers and tools parse model-written code in
    worker threads (``asyncio.to_thread``), so every parse of it goes through this one lock;
    tests/test_sandbox.py::test_parsing_from_many_threads_never_fails reproduces the race."""
    with PARSE_LOCK:
        return ast.parse(source, mode=mode)


class SandboxUnavailable(RuntimeError):
    """This machine cannot keep the sandbox's promises (the message names the missing ones),
    and the config did not opt out with ``allow_weak_isolation=True``."""


class SandboxError(RuntimeError):
    """A run could not be set up (the machine changed since the probe); not the code's fault."""


@dataclass
class SandboxConfig:
    """Limits of each sandboxed run and how many run at once."""

    timeout_s: float = 10.0
    """Wall-clock limit of one run; then it and every process it started are killed."""
    cpu_s: int = 10
    """CPU seconds of each process of a run (RLIMIT_CPU)."""
    memory_mb: int = 1024
    """Memory of one run in MiB: of all its processes together (a memory cgroup: over it the
    kernel kills, status ``memory``) and the address space of each (RLIMIT_AS: a larger
    allocation is a MemoryError)."""
    output_kb: int = 64
    """stdout and stderr kept, each, in KiB; a run that writes more is stopped (output_limit)."""
    file_mb: int = 16
    """Largest file a run may write, in MiB (RLIMIT_FSIZE); its folder and /tmp are in memory
    and count towards ``memory_mb``."""
    max_processes: int = 64
    """Processes and threads of one run, all its children included (a pids cgroup; without
    one, RLIMIT_NPROC of the sandbox user)."""
    concurrency: int = field(default_factory=lambda: os.cpu_count() or 1)
    """Runs at once (a pool); more wait their turn."""
    python: str | None = None
    """Interpreter of the runs (standard library only); default: this one (its installation is
    shown read-only in the run's view). Without a mount namespace: this one if user nobody can
    run it, else the system's ``python3``."""
    allow_weak_isolation: bool = False
    """Run even where the machine cannot keep every promise of the sandbox (not root, no
    cgroup, a namespace refused): with what remains, reported in ``Sandbox.isolation`` and
    ``Sandbox.missing``. Off: such a machine raises SandboxUnavailable, naming what is missing."""

    def validate(self) -> SandboxConfig:
        for name in ("timeout_s", "cpu_s", "memory_mb", "output_kb", "file_mb", "max_processes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sandbox.{name} must be > 0, got {getattr(self, name)!r}")
        if self.concurrency < 1:
            raise ValueError(f"sandbox.concurrency must be >= 1, got {self.concurrency}")
        return self


@dataclass
class TestResult:
    passed: bool
    error: str | None = None


@dataclass
class RunResult:
    """What one sandboxed run did."""

    status: str
    tests: list[TestResult] = field(default_factory=list)
    error: str | None = None  # the code's own exception, or the syntax error
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    duration_s: float = 0.0

    @property
    def passed_fraction(self) -> float:
        """Share of tests passed (CoMLRL-style partial credit); 0.0 with no tests."""
        return sum(t.passed for t in self.tests) / len(self.tests) if self.tests else 0.0


@dataclass(frozen=True)
class _Plan:
    """How a run is confined: the promises to keep and what they need (see ``_enter``)."""

    python: str
    netns: bool
    mountns: bool
    pidns: bool
    nobody: bool
    view: tuple[tuple[str, str, str], ...] = ()  # (host path, "dir" | "link" | "dev", link target)
    stage: str = "/tmp"  # where the new root is built before pivot_root
    sleeper: str = "/bin/sleep"  # PID 1 of the run's PID namespace
    init_s: int = 3600  # how long PID 1 lives if nothing kills it (past the run's time limit)
    cgroups: tuple[str, ...] = ()  # this run's cgroup folders
    limits: tuple[tuple[int, int], ...] = ()
    tmpfs_mb: int = 64


@dataclass
class _Machine:
    """What ``_probe`` found: the promises this machine keeps, why the others are missing, the
    interpreter, the file system view, and where per-run cgroups go."""

    python: str
    isolation: dict[str, bool]
    missing: dict[str, str]
    view: tuple[tuple[str, str, str], ...] = ()
    cgroups: _Cgroups | None = None
    sleeper: str = ""

    def without(self, promise: str, reason: str) -> _Machine:
        """This machine with ``promise`` missing (tests simulate a weaker machine this way)."""
        isolation, missing = dict(self.isolation), dict(self.missing)
        isolation[promise], missing[promise] = False, reason
        if promise == "mountns" and isolation["pidns"]:
            isolation["pidns"], missing["pidns"] = False, _PIDNS_NEEDS_MOUNTNS
        cgroups = None if promise == "cgroup" else self.cgroups
        return dataclasses.replace(self, isolation=isolation, missing=missing, cgroups=cgroups)


_PIDNS_NEEDS_MOUNTNS = "needs the run's own mount namespace (to remount /proc)"


class Sandbox:
    """A pool of sandboxed runs (see the module docstring)."""

    def __init__(self, cfg: SandboxConfig | None = None) -> None:
        self.cfg = (cfg or SandboxConfig()).validate()
        # One semaphore per event loop: an asyncio primitive belongs to the loop that first
        # waits on it, and a sandbox may serve several (asyncio.run per call, a thread each).
        self._slots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        machine = _probe(self.cfg.python)
        self.isolation: dict[str, bool] = machine.isolation
        """The promises kept on this machine (PROMISES)."""
        self.missing: dict[str, str] = machine.missing
        """Each promise not kept, and why."""
        if self.missing and not self.cfg.allow_weak_isolation:
            what = "; ".join(f"{k}: {why}" for k, why in self.missing.items())
            raise SandboxUnavailable(
                f"kernel.sandbox: this machine cannot confine untrusted code ({what}). Run as "
                "root on Linux with namespaces and cgroups, or set "
                "SandboxConfig(allow_weak_isolation=True) to run with what remains."
            )
        self._cgroups = machine.cgroups if self.isolation["cgroup"] else None
        if self.isolation["mountns"]:
            self.python = machine.python
        else:
            self.python = _host_python(self.cfg.python, self.isolation["nobody"])
        self._plan = _Plan(
            python=self.python,
            netns=self.isolation["netns"],
            mountns=self.isolation["mountns"],
            pidns=self.isolation["pidns"],
            nobody=self.isolation["nobody"],
            view=machine.view,
            stage=tempfile.gettempdir(),
            sleeper=machine.sleeper,
            init_s=int(self.cfg.timeout_s) + 60,
            limits=_limits(self.cfg, cap_processes=self._cgroups is None),
            tmpfs_mb=self.cfg.memory_mb,
        )

    async def run(self, code: str, tests: list[str] | tuple[str, ...] = ()) -> RunResult:
        """Run ``code``, then each of ``tests`` in its scope; never raises for what they do.
        At most ``concurrency`` runs at once per event loop."""
        loop = asyncio.get_running_loop()
        if loop not in self._slots:
            self._slots[loop] = asyncio.Semaphore(self.cfg.concurrency)
        async with self._slots[loop]:
            files = {"solution.py": code, "tests.json": json.dumps(list(tests))}
            files["_harness.py"] = _HARNESS
            home, cgroups = None, ()
            try:
                if not self._plan.mountns:  # a folder under the temp dir, owned by the run
                    home = tempfile.mkdtemp(prefix="tandem-sandbox-")
                    _write_files(home, files, NOBODY if self._plan.nobody else None)
                if self._cgroups is not None:
                    cgroups = self._cgroups.make(self.cfg)
                plan = dataclasses.replace(self._plan, cgroups=cgroups)
                return await self._run(plan, home, files)
            finally:
                if cgroups:
                    await self._cgroups.remove(cgroups)
                if home is not None:
                    shutil.rmtree(home, ignore_errors=True)

    async def _run(self, plan: _Plan, home: str | None, files: dict[str, str]) -> RunResult:
        cfg, loop = self.cfg, asyncio.get_running_loop()
        read_fd, write_fd = os.pipe()
        env = {"PATH": "/usr/bin:/bin", "HOME": home or HOME, "PYTHONDONTWRITEBYTECODE": "1"}
        argv = [plan.python, "-I", "-S", "_harness.py", str(write_fd)]
        start = time.perf_counter()
        try:
            proc, init = _spawn(
                plan,
                argv,
                files if home is None else {},
                write_fd,
                cwd=home,  # with its own view, _enter moves it to HOME
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except (OSError, subprocess.SubprocessError, _Refused) as exc:
            os.close(write_fd)
            why = _read_all(read_fd)
            raise SandboxError(f"kernel.sandbox: a run could not start: {why or exc}") from exc
        except BaseException:
            os.close(read_fd)
            os.close(write_fd)
            raise
        os.close(write_fd)
        readers, pipes = [], []
        for pipe in (proc.stdout, proc.stderr, os.fdopen(read_fd, "rb", 0)):
            reader = asyncio.StreamReader(limit=2**16)
            transport, _ = await loop.connect_read_pipe(
                functools.partial(asyncio.StreamReaderProtocol, reader), pipe
            )
            readers.append(reader)
            pipes.append(transport)
        limit = cfg.output_kb * 1024
        outputs, report = [bytearray(), bytearray()], bytearray()
        over = asyncio.Event()

        async def drain(stream, buf: bytearray, cap: int, flood: bool) -> None:
            seen = 0
            while chunk := await stream.read(65536):
                seen += len(chunk)
                buf.extend(chunk[: max(cap - len(buf), 0)])
                if flood and seen > cap:
                    over.set()

        pumps = asyncio.ensure_future(
            asyncio.gather(
                drain(readers[0], outputs[0], limit, True),
                drain(readers[1], outputs[1], limit, True),
                drain(readers[2], report, REPORT_LIMIT, False),
            )
        )
        waiter = asyncio.ensure_future(_wait(proc))
        stopper = asyncio.ensure_future(over.wait())
        try:
            done, _ = await asyncio.wait(
                {waiter, stopper}, timeout=cfg.timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            timed_out, flooded = not done, stopper in done and waiter not in done
            if timed_out or flooded:
                _kill_run(proc.pid, init)
            returncode = await waiter
            # Anything it left behind: its group; with a PID namespace, PID 1, and so everything
            # in the namespace, which the kernel has killed and reaped once PID 1 is reaped.
            _kill_run(proc.pid, init)
            if init is not None:
                await _wait(init)
                init = None
            if plan.cgroups:  # and anything anywhere else: the pipes close when all are gone
                await self._cgroups.kill(plan.cgroups)
            # With a PID namespace or a cgroup everything that held the pipes is dead by now;
            # without, a child in a session of its own may hold them: stop reading after a while.
            await asyncio.wait({pumps}, timeout=1.0)
        finally:
            if not waiter.done() or init is not None:  # cancelled: the run goes too
                _kill_run(proc.pid, init)
                _reap_later(proc, init)
            waiter.cancel()
            stopper.cancel()
            pumps.cancel()
            for transport in pipes:
                transport.close()
        oom = self._cgroups is not None and self._cgroups.oom_killed(plan.cgroups)
        result = RunResult(
            status="crashed",
            stdout=outputs[0].decode(errors="replace"),
            stderr=outputs[1].decode(errors="replace"),
            returncode=returncode,
            duration_s=time.perf_counter() - start,
        )
        return _judge(result, report.decode(errors="replace"), timed_out, flooded, oom)


def _judge(
    result: RunResult, report: str, timed_out: bool, flooded: bool, oom: bool = False
) -> RunResult:
    """The status from how the process ended, what its harness reported and whether the
    kernel killed any of its processes for memory."""
    rc = result.returncode
    if flooded or (rc == -signal.SIGXFSZ and not timed_out):
        result.status = "output_limit"
        return result
    if oom:
        result.status = "memory"
    elif timed_out or (rc in (-signal.SIGXCPU, -signal.SIGKILL) and not report):
        result.status = "timeout"
        return result
    try:
        data = json.loads(report)
    except ValueError:
        if result.status != "memory":
            result.status = "memory" if "MemoryError" in result.stderr else "crashed"
        return result
    result.tests = [TestResult(bool(p), e) for p, e in data["tests"]]
    result.error = data["syntax_error"] or data["error"]
    if result.status == "memory":
        pass
    elif data["syntax_error"]:
        result.status = "syntax_error"
    elif data["memory"]:
        result.status = "memory"
    elif data["error"] or not all(t.passed for t in result.tests):
        result.status = "failed"
    else:
        result.status = "passed"
    return result


def _read_all(fd: int) -> str:
    with os.fdopen(fd, "rb") as f:
        return f.read().decode(errors="replace").strip()


def _write_files(folder: str, files: dict[str, str], owner: int | None) -> None:
    for name, text in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    if owner is not None:
        os.chown(folder, owner, owner)  # its own folder is the one it may write in


def _kill_run(pid: int, init: int | None) -> None:
    """SIGKILL the run's process group and, with a PID namespace, its PID 1."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    if init is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(init, signal.SIGKILL)


async def _wait(child: subprocess.Popen | int) -> int:
    """Wait, without blocking the event loop, for a child (a Popen, or the pid of PID 1) to
    end; its return code (a Popen's) or wait status. A pidfd tells the loop when it ended."""
    pid = child.pid if isinstance(child, subprocess.Popen) else child
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # before Linux 5.3: a thread waits
        fd = None
    if fd is not None:
        loop = asyncio.get_running_loop()
        ended = loop.create_future()
        loop.add_reader(fd, lambda: ended.done() or ended.set_result(None))
        try:
            await ended
        finally:
            loop.remove_reader(fd)
            os.close(fd)
    if isinstance(child, subprocess.Popen):
        return child.wait() if fd is not None else await asyncio.to_thread(child.wait)
    if fd is not None:
        return os.waitpid(pid, 0)[1]
    return (await asyncio.to_thread(os.waitpid, pid, 0))[1]


def _reap_later(proc: subprocess.Popen, init: int | None) -> None:
    """Reap a killed run in the background (its wait was cancelled): no zombie is left."""

    def reap() -> None:
        with contextlib.suppress(ChildProcessError):
            proc.wait()
            if init is not None:
                os.waitpid(init, 0)

    threading.Thread(target=reap, daemon=True).start()


def _limits(cfg: SandboxConfig, cap_processes: bool) -> tuple[tuple[int, int], ...]:
    limits = {
        resource.RLIMIT_CPU: cfg.cpu_s,
        resource.RLIMIT_AS: cfg.memory_mb * 2**20,
        resource.RLIMIT_FSIZE: cfg.file_mb * 2**20,
        resource.RLIMIT_NOFILE: 64,
        resource.RLIMIT_CORE: 0,
    }
    if cap_processes:  # per user, across runs: only where no pids cgroup caps each run
        limits[resource.RLIMIT_NPROC] = cfg.max_processes
    return tuple(limits.items())


# ---- in the child, between fork and exec ------------------------------------------------------


class _Refused(Exception):
    """A promise the kernel refused while a run was being set up: (promise, reason)."""


def _check(result: int, promise: str, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise _Refused(promise, f"{what}: {os.strerror(err)} (errno {err})")


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    _check(
        _MOUNT(enc(source), enc(target), enc(fstype), flags, enc(data)),
        "mountns",
        f"mount {target}",
    )


def _enter(plan: _Plan, files: dict[str, str], report_fd: int) -> None:
    """``preexec_fn`` of a run: confine the child (already PID 2 of its PID namespace, see
    ``_spawn``). In this order: the namespaces; the cgroup, so that everything after counts; the
    new root; limits; user nobody. A refusal is written to ``report_fd`` as ``promise<TAB>why``
    for the parent (the probe names the promise from it) and raised."""
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if plan.pidns or plan.mountns:
            flags = CLONE_NEWNS | (CLONE_NEWIPC | CLONE_NEWUTS if plan.pidns else 0)
            flags |= CLONE_NEWNET if plan.netns else 0
            if _UNSHARE(flags) != 0:
                _name_refusal(flags)
        elif plan.netns and _UNSHARE is not None:
            # Not root: a user namespace makes the network namespace possible (old behaviour).
            _UNSHARE(CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET)
        for folder in plan.cgroups:
            # "0" is this process; its children follow. In v1 through ``tasks``: moving only the
            # calling thread (this process has one) skips the lock whose taking waits an RCU
            # grace period (~10 ms) that ``cgroup.procs`` costs.
            entry = "tasks" if os.path.exists(os.path.join(folder, "tasks")) else "cgroup.procs"
            try:
                with open(os.path.join(folder, entry), "w") as f:
                    f.write("0")
            except OSError as exc:
                raise _Refused("cgroup", f"joining {folder}: {exc}") from None
        if plan.cgroups:
            _check(_UNSHARE(CLONE_NEWCGROUP), "cgroup", "unshare(CLONE_NEWCGROUP)")
        if plan.mountns:
            try:
                _new_root(plan, files)
            except OSError as exc:
                raise _Refused("mountns", f"building the run's root: {exc}") from None
        for which, value in plan.limits:
            resource.setrlimit(which, (value, value))
        if _PRCTL is not None:
            _check(_PRCTL(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "nobody", "prctl(PR_SET_NO_NEW_PRIVS)")
        if plan.nobody:
            try:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            except OSError as exc:
                raise _Refused("nobody", f"becoming user nobody: {exc}") from None
        if _PRCTL is not None:  # after setuid, which clears it: die with the parent
            _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
    except _Refused as exc:
        with contextlib.suppress(OSError):
            os.write(report_fd, f"{exc.args[0]}\t{exc.args[1]}".encode())
        raise
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(report_fd, f"setup\t{type(exc).__name__}: {exc}".encode())
        raise


def _name_refusal(flags: int) -> None:
    """unshare(flags) failed: try each namespace alone to name the one refused."""
    err = ctypes.get_errno()
    for promise, bits, names in (
        ("mountns", CLONE_NEWNS, "CLONE_NEWNS"),
        ("pidns", CLONE_NEWIPC | CLONE_NEWUTS, "CLONE_NEWIPC|CLONE_NEWUTS"),
        ("netns", CLONE_NEWNET, "CLONE_NEWNET"),
    ):
        if flags & bits:
            _check(_UNSHARE(bits), promise, f"unshare({names})")
    raise _Refused("mountns", f"unshare: {os.strerror(err)} (errno {err})")


def _spawn(
    plan: _Plan, argv: list[str], files: dict[str, str], report_fd: int, **popen
) -> tuple[subprocess.Popen, int | None]:
    """Start a run: (its process, the pid of its PID namespace's init or None). With a PID
    namespace, this thread (only this one: the namespace of a thread's children is the
    thread's) first makes its next children start in a new one; the first is PID 1, ``sleep``
    (``posix_spawn``: vfork and exec, so no copy of this process's memory, command line or
    environment; no descriptor of ours; ends by itself after the run's time limit if nothing
    kills it), the second is the run, PID 2, with the normal signal semantics that PID 1 lacks;
    then this thread's children are back in its own namespace. Killing PID 1 kills everything
    else in the namespace. As before, the run is the one fork of this process."""
    kwargs = dict(
        preexec_fn=functools.partial(_enter, plan, files, report_fd),
        pass_fds=(report_fd,),
        start_new_session=True,
        **popen,
    )
    if not plan.pidns:
        return subprocess.Popen(argv, **kwargs), None
    ours = os.open("/proc/thread-self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_UNSHARE(CLONE_NEWPID), "pidns", "unshare(CLONE_NEWPID)")
        try:
            init = os.posix_spawn(
                plan.sleeper,
                [plan.sleeper, str(plan.init_s)],
                {},
                file_actions=[(os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable()],
                setsid=True,
            )
        except OSError as exc:
            raise _Refused("pidns", f"its init ({plan.sleeper}) did not start: {exc}") from None
        try:
            return subprocess.Popen(argv, **kwargs), init
        except BaseException:
            os.kill(init, signal.SIGKILL)
            os.waitpid(init, 0)
            raise
    finally:
        if _SETNS(ours, CLONE_NEWPID) != 0:  # never as root: the active namespace is allowed
            err = ctypes.get_errno()
            raise SandboxError(f"kernel.sandbox: setns back to our PID namespace: errno {err}")
        os.close(ours)


def _inheritable() -> list[int]:
    """This process's descriptors that a child would inherit (0, 1, 2 and any other)."""
    fds = []
    for name in os.listdir("/proc/thread-self/fd"):
        with contextlib.suppress(OSError):
            if os.get_inheritable(int(name)):
                fds.append(int(name))
    return fds


def _new_root(plan: _Plan, files: dict[str, str]) -> None:
    """Build the run's root on a tmpfs at ``plan.stage``, pivot into it and detach the old one:
    the system's directories bound read-only, device files, /proc of its PID namespace, a
    writable HOME and /tmp (tmpfs each, in the run's memory cgroup), the root itself read-only."""
    os.umask(0o022)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here shows outside
    new = plan.stage
    _mount("tandem-sandbox", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=755")
    for sub in (".old", "proc", "dev", "tmp", HOME.lstrip("/")):
        os.mkdir(os.path.join(new, sub))
    for path, kind, target in plan.view:
        dst = new + path
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if kind == "link":
            os.symlink(target, dst)
        elif kind == "dir":
            os.mkdir(dst)
        else:
            os.close(os.open(dst, os.O_CREAT | os.O_WRONLY, 0o644))
    for link, target in DEV_LINKS:
        os.symlink(target, new + link)
    _check(_PIVOT_ROOT(os.fsencode(new), os.fsencode(new + "/.old")), "mountns", "pivot_root")
    os.chdir("/")
    for path, kind, _ in plan.view:
        if kind == "link":
            continue
        _mount("/.old" + path, path, None, MS_BIND)
        if kind == "dir":
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    if plan.pidns:
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        except _Refused as exc:
            raise _Refused("pidns", exc.args[1]) from None
    size = f"size={plan.tmpfs_mb}m,nr_inodes=16384"
    owner = f",uid={NOBODY},gid={NOBODY}" if plan.nobody else ""
    _mount("tmp", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777")
    _mount("home", HOME, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=700{owner}")
    _write_files(HOME, files, None)
    _check(_UMOUNT2(b"/.old", MNT_DETACH), "mountns", "umount2 the old root")
    os.rmdir("/.old")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(HOME)


# ---- per-run cgroups ---------------------------------------------------------------------------


class _Cgroups:
    """Where this process makes a cgroup per run: beside nothing else, under its own cgroup in
    the v1 ``pids`` and ``memory`` hierarchies, or in the v2 one where both controllers are
    delegated to it. A run's cgroup caps tasks and memory; afterwards it is emptied and removed."""

    def __init__(self, version: int, bases: tuple[str, ...]) -> None:
        self.version, self.bases = version, bases  # v1: (pids, memory); v2: (one folder,)

    @classmethod
    def find(cls) -> tuple[_Cgroups | None, str]:
        """(the cgroups, "") or (None, why there are none)."""
        try:
            with open("/proc/self/mountinfo") as f:
                mounts = [line.split() for line in f]
            with open("/proc/self/cgroup") as f:
                member = [line.rstrip("\n").split(":", 2) for line in f]
        except OSError as exc:
            return None, f"cannot read this process's cgroups: {exc}"
        v1, v2 = {}, None
        for fields in mounts:
            sep = fields.index("-")
            fstype, root, point = fields[sep + 1], fields[3], fields[4]
            if fstype == "cgroup":
                for ctl in ("pids", "memory"):
                    if ctl in fields[sep + 3].split(","):
                        v1[ctl] = (root, point)
            elif fstype == "cgroup2":
                v2 = (root, point)

        def folder(root: str, point: str, path: str) -> str:
            rel = os.path.relpath(path, root) if path.startswith(root) else path.lstrip("/")
            return os.path.normpath(os.path.join(point, rel))

        paths = {}
        for _, controllers, path in member:
            for ctl in controllers.split(","):
                paths[ctl] = path
            if controllers == "":
                paths["v2"] = path
        if "pids" in v1 and "memory" in v1 and "pids" in paths and "memory" in paths:
            bases = tuple(folder(*v1[c], paths[c]) for c in ("pids", "memory"))
            if all(os.access(b, os.W_OK) for b in bases):
                found = cls(1, bases)
                found.sweep()
                return found, ""
            return None, f"cannot make cgroups in {' or '.join(bases)}"
        if v2 is not None and "v2" in paths:
            base = folder(*v2, paths["v2"])
            try:
                with open(os.path.join(base, "cgroup.subtree_control")) as f:
                    enabled = f.read().split()
            except OSError as exc:
                return None, f"cgroup v2 at {base}: {exc}"
            if not {"pids", "memory"} <= set(enabled):
                try:  # allowed where no process sits in this cgroup itself (or at the root)
                    _write(base, "cgroup.subtree_control", "+pids +memory")
                except OSError as exc:
                    return None, (
                        f"the pids and memory controllers are not enabled below {base} ({exc}); "
                        "run it in a cgroup of its own with both delegated (systemd: Delegate=yes)"
                    )
            found = cls(2, (base,))
            found.sweep()
            return found, ""
        return None, "no pids and memory cgroup controllers are mounted"

    def sweep(self) -> None:
        """Remove the empty cgroups of runs whose process is gone (it was killed mid-run)."""
        for base in self.bases:
            with contextlib.suppress(OSError):
                for name in os.listdir(base):
                    parts = name.split("-")  # tandem-sandbox-<pid>-<n>
                    ours = name.startswith("tandem-sandbox-") and len(parts) == 4
                    if ours and parts[2].isdigit() and not os.path.exists(f"/proc/{parts[2]}"):
                        with contextlib.suppress(OSError):
                            os.rmdir(os.path.join(base, name))

    def make(self, cfg: SandboxConfig) -> tuple[str, ...]:
        name = f"tandem-sandbox-{os.getpid()}-{next(_RUNS)}"
        folders = tuple(os.path.join(b, name) for b in self.bases)
        made: list[str] = []
        try:
            for folder in folders:
                os.mkdir(folder, 0o700)
                made.append(folder)
            memory = str(cfg.memory_mb * 2**20)
            if self.version == 1:
                _write(folders[0], "pids.max", str(cfg.max_processes))
                _write(folders[1], "memory.limit_in_bytes", memory)
                with contextlib.suppress(OSError):  # swap accounting may be off: then no swap
                    _write(folders[1], "memory.memsw.limit_in_bytes", memory)
            else:
                _write(folders[0], "pids.max", str(cfg.max_processes))
                _write(folders[0], "memory.max", memory)
                with contextlib.suppress(OSError):
                    _write(folders[0], "memory.swap.max", "0")
                with contextlib.suppress(OSError):
                    _write(folders[0], "memory.oom.group", "1")  # an OOM kills the whole run
        except OSError as exc:
            for folder in made:
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
            raise SandboxError(f"kernel.sandbox: cannot make the run's cgroup: {exc}") from exc
        return folders

    def oom_killed(self, folders: tuple[str, ...]) -> bool:
        """Whether the kernel killed a process of this run for memory."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            with open(os.path.join(folders[-1], name)) as f:
                counts = dict(line.split() for line in f if line.strip())
        except (OSError, ValueError):
            return False
        return int(counts.get("oom_kill", 0)) > 0

    @staticmethod
    def _kill_once(folders: tuple[str, ...]) -> bool:
        """SIGKILL every process in the run's cgroups; whether there was none."""
        pids = set()
        for folder in folders:
            with contextlib.suppress(OSError), open(os.path.join(folder, "cgroup.procs")) as f:
                pids.update(int(p) for p in f.read().split())
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return not pids

    @staticmethod
    def _rmdir(folder: str) -> bool:
        try:
            os.rmdir(folder)
        except FileNotFoundError:
            pass
        except OSError:  # EBUSY while the last ones are being reaped
            return False
        return True

    async def kill(self, folders: tuple[str, ...], patience_s: float = 10.0) -> None:
        """Kill every process left in the run's cgroups, until none is left."""
        deadline = time.monotonic() + patience_s
        while not self._kill_once(folders) and time.monotonic() < deadline:
            await asyncio.sleep(0.002)

    async def remove(self, folders: tuple[str, ...]) -> None:
        """Kill what is left and remove the run's cgroups."""
        await self.kill(folders)
        for folder in folders:
            for _ in range(200):
                if self._rmdir(folder):
                    break
                await asyncio.sleep(0.005)

    def remove_now(self, folders: tuple[str, ...]) -> None:
        """``remove``, blocking (the probe runs outside any event loop's control)."""
        for _ in range(1000):
            if self._kill_once(folders):
                break
            time.sleep(0.002)
        for folder in folders:
            for _ in range(200):
                if self._rmdir(folder):
                    break
                time.sleep(0.005)


def _write(folder: str, name: str, value: str) -> None:
    with open(os.path.join(folder, name), "w") as f:
        f.write(value)


# ---- the probe ---------------------------------------------------------------------------------

_PROBE = (
    "import os\n"
    "print(os.getuid(), os.getpid())\n"
    "ns = lambda n: os.readlink('/proc/self/ns/' + n) if os.path.exists('/proc/self') else '-'\n"
    "print(*(ns(n) for n in ('net', 'mnt', 'pid')))\n"
    "print(*sorted(os.listdir('/')))\n"
)


def _probe(python: str | None) -> _Machine:
    """The promises this machine keeps, found by confining a real child the way a run is
    confined (a promise the kernel refuses is dropped, with its reason, and the rest tried
    again), and the interpreter and file system view a run gets."""
    exe = os.path.realpath(python or sys.executable)
    isolation = dict.fromkeys(PROMISES, True)
    missing: dict[str, str] = {}
    if (
        not sys.platform.startswith("linux")
        or _UNSHARE is None
        or _MOUNT is None
        or _PIVOT_ROOT is None
        or _SETNS is None
    ):
        why = "not Linux (namespaces and cgroups are Linux's)"
        return _Machine(exe, dict.fromkeys(PROMISES, False), dict.fromkeys(PROMISES, why))
    if os.geteuid() != 0:
        why = "not root"
        for promise in ("mountns", "pidns", "cgroup", "nobody"):
            isolation[promise], missing[promise] = False, why
        if not _weak_netns(exe):
            isolation["netns"], missing["netns"] = (
                False,
                "unshare(CLONE_NEWUSER|CLONE_NEWNET) refused",
            )
        return _Machine(exe, isolation, missing)
    cgroups, why = _Cgroups.find()
    if cgroups is None:
        isolation["cgroup"], missing["cgroup"] = False, why
    view = _view(exe)
    sleeper = shutil.which("sleep", path="/usr/bin:/bin") or ""
    if not sleeper:
        isolation["pidns"], missing["pidns"] = False, "no sleep program to be its init (PID 1)"
    for _ in PROMISES:
        machine = _Machine(exe, isolation, missing, view, cgroups, sleeper)
        failed = _try_confined(machine)
        if failed is None:
            return machine
        promise, why = failed
        if promise not in PROMISES or not isolation[promise]:
            raise SandboxError(f"kernel.sandbox: probing the sandbox failed: {why}")
        isolation[promise], missing[promise] = False, why
        if promise == "cgroup":
            cgroups = None
        if not isolation["mountns"] and isolation["pidns"]:
            isolation["pidns"], missing["pidns"] = False, _PIDNS_NEEDS_MOUNTNS
    return _Machine(exe, isolation, missing, view, cgroups, sleeper)


def _view(exe: str) -> tuple[tuple[str, str, str], ...]:
    """What a run's root shows of the host: the system's directories, the interpreter's
    installation (the folder above its bin/), the device files."""
    prefix = os.path.dirname(os.path.dirname(exe))
    entries: list[tuple[str, str, str]] = []
    for path in (*SYSTEM_DIRS, prefix):
        if any(
            path == p or path.startswith(p.rstrip("/") + "/")
            for p, kind, _ in entries
            if kind == "dir"
        ):
            continue  # already shown
        if os.path.islink(path):
            entries.append((path, "link", os.readlink(path)))
        elif os.path.isdir(path):
            entries.append((path, "dir", ""))
    entries += [(dev, "dev", "") for dev in DEVICES if os.path.exists(dev)]
    return tuple(entries)


def _try_confined(machine: _Machine) -> tuple[str, str] | None:
    """Start the probe program confined as ``machine`` says; None if every promise held, else
    (the promise that failed, why)."""
    iso, cfg = machine.isolation, SandboxConfig()
    cgroups: tuple[str, ...] = ()
    if machine.cgroups is not None and iso["cgroup"]:
        try:
            cgroups = machine.cgroups.make(cfg)
        except SandboxError as exc:
            return "cgroup", str(exc)
    plan = _Plan(
        python=machine.python,
        netns=iso["netns"],
        mountns=iso["mountns"],
        pidns=iso["pidns"],
        nobody=iso["nobody"],
        view=machine.view,
        stage=tempfile.gettempdir(),
        sleeper=machine.sleeper,
        init_s=60,
        cgroups=cgroups,
        limits=_limits(cfg, cap_processes=not cgroups),
    )
    read_fd, write_fd = os.pipe()
    try:
        proc, init = _spawn(
            plan,
            [machine.python, "-I", "-S", "-c", _PROBE],
            {},
            write_fd,
            env={"PATH": "/usr/bin:/bin"},
            cwd=None if plan.mountns else "/",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    except (OSError, subprocess.SubprocessError, _Refused) as exc:
        os.close(write_fd)
        promise, _, why = _read_all(read_fd).partition("\t")
        if isinstance(exc, _Refused):
            promise, why = exc.args
        if cgroups:
            machine.cgroups.remove_now(cgroups)
        if not promise and isinstance(exc, OSError) and plan.mountns:
            return "mountns", f"the interpreter cannot start in the run's view: {exc}"
        return (promise, why) if promise else ("setup", str(exc))
    os.close(write_fd)
    os.close(read_fd)
    try:
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        stdout, stderr = "", "the probe did not end within 60 s"
    finally:
        _kill_run(proc.pid, init)
        proc.wait()
        if init is not None:
            os.waitpid(init, 0)
        if cgroups:
            machine.cgroups.remove_now(cgroups)
    return _probe_verdict(machine, plan, proc.returncode, stdout, stderr)


def _probe_verdict(
    machine: _Machine, plan: _Plan, returncode: int, stdout: str, stderr: str
) -> tuple[str, str] | None:
    """What the confined probe said of itself, checked against this process: None if every
    promise held, else (the promise that failed, why)."""
    iso = machine.isolation
    if returncode != 0:
        tail = stderr.strip()[-300:]
        if plan.mountns:
            return "mountns", f"the interpreter failed in the run's view: {tail}"
        return "setup", f"the interpreter failed: {tail}"
    try:
        ids, namespaces, listing = stdout.splitlines()
        uid, pid = map(int, ids.split())
        net, mnt, pidns = namespaces.split()
    except ValueError:
        return "setup", f"unexpected probe output {stdout!r}"
    ours = {n: os.readlink(f"/proc/self/ns/{n}") for n in ("net", "mnt", "pid")}
    shown = {path.strip("/").split("/")[0] for path, _, _ in machine.view}
    if iso["netns"] and net == ours["net"]:
        return "netns", "the network namespace did not change"
    if iso["mountns"] and (
        mnt == ours["mnt"] or not set(listing.split()) <= shown | {"proc", "tmp", "sandbox"}
    ):
        return "mountns", f"the run's root shows {listing!r}"
    if iso["pidns"] and (pidns == ours["pid"] or pid != 2):
        return "pidns", "the PID namespace did not change"
    if iso["nobody"] and uid != NOBODY:
        return "nobody", f"the run is uid {uid}"
    return None


def _weak_netns(exe: str) -> bool:
    """Whether a network namespace (with a user namespace, as not root) is allowed here."""
    ours = os.readlink("/proc/self/ns/net")

    def isolate() -> None:
        _UNSHARE(CLONE_NEWUSER | CLONE_NEWNET)

    try:
        run = subprocess.run(
            [exe, "-I", "-S", "-c", "import os; print(os.readlink('/proc/self/ns/net'))"],
            preexec_fn=isolate,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return run.returncode == 0 and run.stdout.strip() not in ("", ours)


def _host_python(python: str | None, nobody: bool) -> str:
    """Without the run's own view: the interpreter must be one the run's user can start on the
    host (a virtualenv under /root is not one nobody can): this one if it can, else the
    system's python3."""
    if not nobody:
        return python or sys.executable
    system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    for exe in [python] if python else [sys.executable, system]:
        if not exe:
            continue
        try:
            run = subprocess.run(
                [exe, "-I", "-S", "-c", "pass"],
                preexec_fn=_as_nobody,
                capture_output=True,
                timeout=60,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if run.returncode == 0:
            return exe
    raise SandboxError(f"kernel.sandbox: user nobody cannot run {python or sys.executable}")


def _as_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
