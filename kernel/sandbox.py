"""Run untrusted Python -- model-written code and its tests -- without letting it harm the machine.

``await Sandbox(SandboxConfig()).run(code, tests)`` runs ``code`` and then each test (an
``assert`` or a small block) in one fresh interpreter and returns a ``RunResult``: a status,
pass/fail per test, the output. It never raises for what the code does; bad code is a status.

Every run is its own process, set up before it starts (``_confine``, in the child):

- a throwaway working directory (removed afterwards) and an environment of PATH and HOME only,
  so no secret of the training process is in reach;
- hard limits (``setrlimit``): CPU seconds, address space (memory), size of any file written,
  open files, processes;
- no network: a fresh network namespace (``unshare(CLONE_NEWNET)``; with a new user namespace
  when not root) where the kernel allows it, so not even loopback reaches a service;
- run as root, it drops to user ``nobody``: the file system's permissions then stop it writing
  outside its directory and signalling any process not its own;
- its own session: on timeout the whole process group is killed, and it dies with its parent;
- inside the interpreter (``python -I -S``: no site-packages, no user paths, standard library
  only) an audit hook (PEP 578) refuses sockets, subprocesses, forks, signals, ``ctypes`` and
  any file change outside its directory. The hook is a second line, not a boundary (C code
  could step around it); the limits above are.

What ``isolation`` says is in effect (``netns``, ``nobody``) is reported, so a run on a machine
that allows less is visible. What it does not protect is the reward: code run with its tests
can end the process early or print anything, so a recipe that fears reward hacking keeps some
tests hidden or checks outputs in the parent.

Statuses: ``passed`` (every test passed; no tests: it ran to the end), ``failed`` (a test
failed or the code raised), ``syntax_error``, ``timeout`` (wall clock or CPU limit),
``memory`` (MemoryError or the address-space limit), ``output_limit`` and ``crashed`` (killed
by another signal, or it exited without a report).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field

NOBODY = 65534
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
# Resolved here, in the parent: the child between fork and exec must not load anything (another
# thread may hold the loader's lock at the fork).
_LIBC = ctypes.CDLL(None, use_errno=True)
_UNSHARE, _PRCTL = getattr(_LIBC, "unshare", None), getattr(_LIBC, "prctl", None)  # Linux
PR_SET_PDEATHSIG = 1
STATUSES = ("passed", "failed", "syntax_error", "timeout", "memory", "output_limit", "crashed")

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
    return not os.path.realpath(os.fsdecode(path)).startswith(HOME)

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


@dataclass
class SandboxConfig:
    """Limits of each sandboxed run and how many run at once."""

    timeout_s: float = 10.0
    """Wall-clock limit of one run; then its whole process group is killed."""
    cpu_s: int = 10
    """CPU seconds of one run (RLIMIT_CPU)."""
    memory_mb: int = 1024
    """Address space of one run in MiB (RLIMIT_AS): a larger allocation is a MemoryError."""
    output_kb: int = 64
    """stdout and stderr kept, each, in KiB; a run that writes more is stopped (output_limit)."""
    file_mb: int = 16
    """Largest file a run may write, in MiB (RLIMIT_FSIZE)."""
    max_processes: int = 64
    """Processes and threads of the sandbox user (RLIMIT_NPROC)."""
    concurrency: int = field(default_factory=lambda: os.cpu_count() or 1)
    """Runs at once (a pool); more wait their turn."""
    python: str | None = None
    """Interpreter of the runs (standard library only); default: this one, or else the first
    ``python3`` on PATH that user nobody can run."""

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


def _confine(cfg: SandboxConfig, nobody: bool) -> None:
    """In the child, before exec: limits, no network, user nobody, death with the parent."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)  # die with the parent
    limits = {
        resource.RLIMIT_CPU: cfg.cpu_s,
        resource.RLIMIT_AS: cfg.memory_mb * 2**20,
        resource.RLIMIT_FSIZE: cfg.file_mb * 2**20,
        resource.RLIMIT_NOFILE: 64,
        resource.RLIMIT_NPROC: cfg.max_processes,
        resource.RLIMIT_CORE: 0,
    }
    _isolate(nobody)
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))


class Sandbox:
    """A pool of sandboxed runs (see the module docstring)."""

    def __init__(self, cfg: SandboxConfig | None = None) -> None:
        self.cfg = (cfg or SandboxConfig()).validate()
        # One semaphore per event loop: an asyncio primitive belongs to the loop that first
        # waits on it, and a sandbox may serve several (asyncio.run per call, a thread each).
        self._slots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.python, self.isolation = _probe(self.cfg.python)

    async def run(self, code: str, tests: list[str] | tuple[str, ...] = ()) -> RunResult:
        """Run ``code``, then each of ``tests`` in its scope; never raises for what they do.
        At most ``concurrency`` runs at once per event loop."""
        loop = asyncio.get_running_loop()
        if loop not in self._slots:
            self._slots[loop] = asyncio.Semaphore(self.cfg.concurrency)
        async with self._slots[loop]:
            home = tempfile.mkdtemp(prefix="tandem-sandbox-")
            try:
                return await self._run(home, code, list(tests))
            finally:
                shutil.rmtree(home, ignore_errors=True)

    async def _run(self, home: str, code: str, tests: list[str]) -> RunResult:
        cfg = self.cfg
        for name, text in (("solution.py", code), ("tests.json", json.dumps(tests))):
            with open(os.path.join(home, name), "w") as f:
                f.write(text)
        with open(os.path.join(home, "_harness.py"), "w") as f:
            f.write(_HARNESS)
        nobody = self.isolation["nobody"]
        if nobody:
            os.chown(home, NOBODY, NOBODY)  # its own directory is the one it may write in
        read_fd, write_fd = os.pipe()
        env = {"PATH": "/usr/bin:/bin", "HOME": home, "PYTHONDONTWRITEBYTECODE": "1"}
        start = time.perf_counter()
        try:
            proc = await asyncio.create_subprocess_exec(
                self.python,
                "-I",
                "-S",
                "_harness.py",
                str(write_fd),
                cwd=home,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(write_fd,),
                start_new_session=True,
                preexec_fn=lambda: _confine(cfg, nobody),
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        limit = cfg.output_kb * 1024
        outputs = [bytearray(), bytearray()]
        over = asyncio.Event()

        async def drain(stream, buf: bytearray) -> None:
            seen = 0
            while chunk := await stream.read(65536):
                seen += len(chunk)
                buf.extend(chunk[: max(limit - len(buf), 0)])
                if seen > limit:
                    over.set()

        pumps = asyncio.gather(drain(proc.stdout, outputs[0]), drain(proc.stderr, outputs[1]))
        waiter = asyncio.ensure_future(proc.wait())
        stopper = asyncio.ensure_future(over.wait())
        done, _ = await asyncio.wait(
            {waiter, stopper}, timeout=cfg.timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        timed_out, flooded = not done, stopper in done and waiter not in done
        if timed_out or flooded:
            _kill_group(proc.pid)
        returncode = await waiter
        _kill_group(proc.pid)  # anything it left behind in its group, before reading its pipes
        stopper.cancel()
        await pumps
        report = await asyncio.to_thread(_read_all, read_fd)
        result = RunResult(
            status="crashed",
            stdout=outputs[0].decode(errors="replace"),
            stderr=outputs[1].decode(errors="replace"),
            returncode=returncode,
            duration_s=time.perf_counter() - start,
        )
        return _judge(result, report, timed_out, flooded)


def _judge(result: RunResult, report: str, timed_out: bool, flooded: bool) -> RunResult:
    """The status from how the process ended and what its harness reported."""
    rc = result.returncode
    if timed_out or (rc in (-signal.SIGXCPU, -signal.SIGKILL) and not flooded and not report):
        result.status = "timeout"
        return result
    if flooded or rc == -signal.SIGXFSZ:
        result.status = "output_limit"
        return result
    try:
        data = json.loads(report)
    except ValueError:
        oom = "MemoryError" in result.stderr
        result.status = "memory" if oom else "crashed"
        return result
    result.tests = [TestResult(bool(p), e) for p, e in data["tests"]]
    result.error = data["syntax_error"] or data["error"]
    if data["syntax_error"]:
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
        return f.read().decode(errors="replace")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _as_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _isolate(nobody: bool) -> None:
    """A network namespace of its own (with a user namespace when not root), then user nobody
    if asked; where the kernel refuses the namespace (see ``Sandbox.isolation``), the audit
    hook still refuses sockets."""
    if _UNSHARE is not None:
        _UNSHARE(CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET)
    if nobody:
        _as_nobody()


def _probe(python: str | None) -> tuple[str, dict[str, bool]]:
    """(the interpreter, the confinement this machine allows: a network namespace, running as
    nobody), found by starting a child the way ``_confine`` does. As root, the interpreter must
    be one nobody can run (a virtualenv under /root is not): this one if it can, else the
    system's python3; failing both, runs stay root."""
    root = os.geteuid() == 0
    ours = os.readlink("/proc/self/ns/net") if os.path.exists("/proc/self/ns/net") else None
    code = "import os; print(os.readlink('/proc/self/ns/net'))"

    def start(exe: str, nobody: bool) -> str | None:
        try:
            run = subprocess.run(
                [exe, "-I", "-S", "-c", code],
                preexec_fn=lambda: _isolate(nobody),
                capture_output=True,
                text=True,
            )
        except OSError:  # nobody may not execute it
            return None
        return run.stdout.strip() if run.returncode == 0 else None

    system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    candidates = [python] if python else [sys.executable, system]
    for exe in [c for c in candidates if c] if root else []:
        if (ns := start(exe, nobody=True)) is not None:
            return exe, {"netns": ns != ours, "nobody": True}
    exe = python or sys.executable
    return exe, {"netns": start(exe, nobody=False) not in (None, ours), "nobody": False}
