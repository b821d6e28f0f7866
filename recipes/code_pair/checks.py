"""Running a problem's checks so that the program under test cannot game them.

A check of HumanEval's ``check(candidate)`` is turned into calls with an expected value
(``code.convert_check``), and each call is judged in the parent process, on plain data:

1. **Plan** (once per problem, cached): the problem's context (its imports and given functions)
   and the test module run in a sandboxed process that never sees the program under test; each
   converted assert there records its call's arguments, its comparison and the expected value
   instead of calling anything (the global ``random`` seeded per check, so HumanEval's random
   checks are fixed). Checks that never call the candidate (``assert True``) and checks of
   another shape are dropped and counted (``Plan.no_call``, ``Plan.unconvertible``).
2. **Run** (one sandboxed process per program): a driver executes the program, then calls the
   entry point with each call's arguments, written into the driver as literals, and prints
   each result as plain-data text (``plain.dump``: exact builtin types only) or the error it
   raised. Neither the driver nor any file in the process's directory holds an expected value.
3. **Judge** (in the parent): each printed result is read back with ``plain.load`` (a value
   of builtin types, built without evaluating anything) and compared there with the expected
   value by the check's own comparison (``==``, ``is``, truth, ``abs(...) < tol``,
   ``math.isclose``, after builtins like ``tuple`` or ``sorted`` the check applied). A check
   passes when every one of its calls' results was received and compared true.

The program can print anything, forge result lines, end its process or break the driver
(it runs in that interpreter); none of that passes a check, since the parent compares what it
reads with values the process never had: a forged line is no better than returning that
value. A run that ends early counts the checks whose results arrived, and is never ``passed``.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from kernel.sandbox import RunResult
from recipes.code_pair import code, plain
from recipes.code_pair.config import RecipeConfig

PLAIN_SOURCE = Path(plain.__file__).read_text()
# builtins a check may apply to the result before comparing (``tuple(candidate(x)) == ...``)
WRAPPERS = {f.__name__: f for f in (tuple, list, set, frozenset, sorted, len)}
ABS = {"abs": abs, "fabs": math.fabs}
_PLANS: dict[tuple[str, str, str], Plan] = {}
_PENDING: dict[tuple[int, tuple[str, str, str]], asyncio.Task] = {}
_MAX_PLANS = 4096

# The trusted process: the problem's context and test setup, then each converted check with
# the record function bound; prints the plan as one plain-data line.
_PLANNER = r"""
import builtins, math, os, random
_P = {"__name__": "plain"}
exec(_PLAIN, _P)
_WRAPPERS = {name: getattr(builtins, name) for name in _WRAPPER_NAMES}
_FUNCS = {"abs": abs, "fabs": math.fabs, "isclose": math.isclose}

def _short(exc):
    return f"{type(exc).__name__}: {exc}"[:300]

def _name(fn, allowed):
    for name in allowed:
        if fn is _FUNCS.get(name, _WRAPPERS.get(name)):
            return name
    raise TypeError(f"{fn!r} is not one of {sorted(allowed)}")

def _record(into, op, wrappers, negate, args, kwargs, expected, extra):
    names = [_name(w, _WRAPPERS) for w in wrappers]
    if op in ("is", "is not") and not any(expected is c for c in (None, True, False)):
        raise TypeError("'is' compares with None, True or False only")
    if op.startswith("abs"):
        tol, fn, side = extra
        if type(tol) not in (int, float):
            raise TypeError("the tolerance is not a number")
        extra = [tol, _name(fn, ("abs", "fabs")), side]
    elif op == "isclose":
        fn, kw, side = extra
        _name(fn, ("isclose",))
        if set(kw) - {"rel_tol", "abs_tol"}:
            raise TypeError("math.isclose takes rel_tol and abs_tol only")
        extra = [kw, side]
    call = [op, names, negate, list(args), kwargs, expected, extra]
    _P["dump"](call)  # TypeError: not plain data
    into.append(call)

def _refuse(*args, **kwargs):
    raise TypeError("the candidate is called outside a converted assert")

def _emit(text):
    data = ("\n" + _MARK + text + "\n").encode("utf-8", "backslashreplace")
    while data:
        data = data[os.write(1, data):]

_ns = {"__name__": "__main__"}
_plan = {"setup": None, "checks": []}
try:
    exec(compile(_CONTEXT, "context", "exec"), _ns)
    exec(compile(_SETUP, "setup", "exec"), _ns)
except BaseException as exc:
    _plan["setup"] = _short(exc)
else:
    for _i, _source in enumerate(_CHECKS):
        _calls = []
        _ns["candidate"] = _ns[_ENTRY] = _refuse
        _ns[_RECORD] = lambda *a, _into=_calls: _record(_into, *a)
        random.seed(_i)
        try:
            exec(compile(_source, f"check {_i + 1}", "exec"), _ns)
            _plan["checks"].append(_calls)
        except BaseException as exc:
            _plan["checks"].append(_short(exc))
_emit(_P["dump"](_plan))
"""

# The program's process: the program, then each call; prints one line per call.
_DRIVER = r"""
import os
_P = {"__name__": "plain"}
exec(_PLAIN, _P)
_dump = _P["dump"]

def _short(exc):
    try:
        return f"{type(exc).__name__}: {exc}"[:300]
    except BaseException:
        return "an exception that cannot be shown"

def _emit(text):
    data = ("\n" + _MARK + text + "\n").encode("utf-8", "backslashreplace")
    while data:
        data = data[os.write(1, data):]

_scope = {"__name__": "__main__"}
try:
    exec(compile(_PROGRAM, "solution.py", "exec"), _scope)
except BaseException as exc:
    _emit("module " + repr(_short(exc)))
else:
    _fn = _scope.get(_ENTRY)
    for _check, _call, _arguments in _CALLS:
        try:
            _args, _kwargs = _arguments()
            _line = "ok " + _dump(_fn(*_args, **_kwargs))
        except MemoryError as exc:
            _line = "memory " + repr(_short(exc))
        except BaseException as exc:
            _line = "error " + repr(_short(exc))
        _emit(f"{_check} {_call} {_line}")
    _emit("end")
"""


@dataclass(frozen=True)
class Call:
    """One call of the entry point and how its result is judged (the fields in the order the
    plan's process prints them)."""

    op: str  # "==", "!=", "is", "is not", "truth", "abs<", "abs<=", "isclose"
    wrappers: list[str]  # builtins applied to the result, outermost first
    negate: bool  # the assert's test was under ``not``
    args: list
    kwargs: dict
    expected: object
    extra: object = None  # abs: [tolerance, "abs" | "fabs", side]; isclose: [kwargs, side]

    def holds(self, value: object) -> bool:
        """Whether the check's comparison holds for ``value`` (plain data, from ``load``)."""
        for name in reversed(self.wrappers):
            value = WRAPPERS[name](value)
        other, op = self.expected, self.op
        if op == "==":
            ok = value == other
        elif op == "!=":
            ok = value != other
        elif op == "is":
            ok = value is other
        elif op == "is not":
            ok = value is not other
        elif op == "truth":
            ok = value
        elif op in ("abs<", "abs<="):
            tol, fn, side = self.extra
            diff = ABS[fn](value - other if side == 0 else other - value)
            ok = diff < tol if op == "abs<" else diff <= tol
        elif op == "isclose":
            kwargs, side = self.extra
            ok = math.isclose(*((value, other) if side == 0 else (other, value)), **kwargs)
        else:
            raise ValueError(f"unknown comparison {op!r}")
        return bool(ok) != self.negate

    def source(self) -> str:
        """The arguments as Python source (a literal) for the driver."""
        return plain.dump([tuple(self.args), self.kwargs])


@dataclass
class Plan:
    """A problem's checks as calls: ``checks[i]`` the calls of converted check i."""

    checks: list[list[Call]] = field(default_factory=list)
    no_call: int = 0  # checks that never call the candidate (``assert True``): dropped
    unconvertible: list[str] = field(default_factory=list)  # why each other dropped one was

    @property
    def total(self) -> int:
        return len(self.checks)


@dataclass
class Judged:
    """A program's run, judged: (status, checks passed, checks, first error)."""

    status: str
    passed: int
    total: int
    error: str | None


def _program(header: dict[str, object], body: str) -> str:
    return "".join(f"{k} = {v!r}\n" for k, v in header.items()) + body


def _mark() -> str:
    return f"@@tandem-{secrets.token_hex(8)}@@ "


def plan_program(context: str, tests: str, entry_point: str, mark: str) -> tuple[str, Plan]:
    """(the trusted process's program, the plan so far: the checks dropped before running)."""
    setup, checks = code.split_tests(tests)
    plan, sources = Plan(), []
    for check in checks:
        kind, text = code.convert_check(check, entry_point)
        if kind == code.CONVERTED:
            sources.append(text)
        elif kind == code.NO_CALL:
            plan.no_call += 1
        else:
            plan.unconvertible.append(text)
    header = {
        "_PLAIN": PLAIN_SOURCE,
        "_CONTEXT": context,
        "_SETUP": setup,
        "_CHECKS": sources,
        "_ENTRY": entry_point,
        "_RECORD": code.RECORD,
        "_WRAPPER_NAMES": sorted(WRAPPERS),
        "_MARK": mark,
    }
    return _program(header, _PLANNER), plan


def read_plan(plan: Plan, result: RunResult, mark: str, entry_point: str) -> Plan:
    """The plan from the trusted process's output; RuntimeError when the test code itself
    failed (a problem of the data, not of any program)."""
    lines = [line[len(mark) :] for line in result.stdout.split("\n") if line.startswith(mark)]
    if result.status != "passed" or len(lines) != 1:
        raise RuntimeError(
            f"code_pair: the checks of {entry_point!r} could not be prepared "
            f"({result.status}: {result.error or result.stderr[-500:]})"
        )
    data = plain.load(lines[0])
    if data["setup"] is not None:
        raise RuntimeError(f"code_pair: the test setup of {entry_point!r} fails: {data['setup']}")
    for recorded in data["checks"]:
        if isinstance(recorded, str):
            plan.unconvertible.append(recorded)
        elif not recorded:
            plan.no_call += 1  # e.g. a loop over nothing
        else:
            plan.checks.append([Call(*c) for c in recorded])
    return plan


async def plan_for(cfg: RecipeConfig, problem: str, tests: str, entry_point: str) -> Plan:
    """The problem's plan, made once per (context, tests, entry point) and shared by the
    concurrent runs of one event loop."""
    key = (code.context_of(problem, entry_point), tests, entry_point)
    if (plan := _PLANS.get(key)) is not None:
        return plan
    loop = asyncio.get_running_loop()
    pending = (id(loop), key)
    task = _PENDING.get(pending)
    if task is None or task.get_loop() is not loop:
        task = loop.create_task(_make_plan(cfg, *key))
        _PENDING[pending] = task
        task.add_done_callback(lambda _: _PENDING.pop(pending, None))
    plan = await asyncio.shield(task)
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


async def _make_plan(cfg: RecipeConfig, context: str, tests: str, entry_point: str) -> Plan:
    mark = _mark()
    program, plan = await asyncio.to_thread(plan_program, context, tests, entry_point, mark)
    result = await cfg.trusted_runner.run(program)
    return await asyncio.to_thread(read_plan, plan, result, mark, entry_point)


def driver(program: str, entry_point: str, plan: Plan, mark: str) -> str:
    """The program's process: ``program``, then each call of the plan (arguments only)."""
    calls = "".join(
        f"    ({i}, {j}, lambda: {call.source()}),\n"
        for i, check in enumerate(plan.checks)
        for j, call in enumerate(check)
    )
    header = {"_PLAIN": PLAIN_SOURCE, "_PROGRAM": program, "_ENTRY": entry_point, "_MARK": mark}
    return _program(header, f"_CALLS = [\n{calls}]\n" + _DRIVER)


def judge(plan: Plan, result: RunResult, mark: str) -> Judged:
    """The run's status and checks passed, from the result lines it printed (the first line
    for each call counts; anything else it printed is ignored)."""
    got: dict[tuple[int, int], tuple[str, str]] = {}
    module_error, ended = None, False
    for line in result.stdout.split("\n"):
        if not line.startswith(mark):
            continue
        rest = line[len(mark) :]
        if rest == "end":
            ended = True
        elif rest.startswith("module "):
            module_error = module_error or _text(rest[len("module ") :])
        else:
            parts = rest.split(" ", 3)
            if len(parts) == 4 and _small(parts[0]) and _small(parts[1]):
                got.setdefault((int(parts[0]), int(parts[1])), (parts[2], parts[3]))
    results, errors = [], []
    memory = any(kind == "memory" for kind, _ in got.values())
    for i, calls in enumerate(plan.checks):
        why = None
        for j, call in enumerate(calls):
            kind, payload = got.get((i, j), ("missing", ""))
            why = _verdict(call, kind, payload, i)
            if why:
                break
        results.append(why is None)
        if why:
            errors.append(why)
    passed = sum(results)
    status = result.status
    if module_error is not None:
        errors.insert(0, module_error)
    if status in ("timeout", "output_limit", "crashed", "syntax_error"):
        pass
    elif status == "memory" or memory or (module_error or "").startswith("MemoryError"):
        status = "memory"
    elif status == "passed" and ended and module_error is None and passed == plan.total:
        status = "passed"
    else:
        status = "failed"
    return Judged(status, passed, plan.total, (errors or [result.error])[0])


def _small(text: str) -> bool:
    """Whether ``text`` is an index as the driver prints it (ASCII digits, a few)."""
    return 0 < len(text) <= 9 and all("0" <= c <= "9" for c in text)


def _verdict(call: Call, kind: str, payload: str, check: int) -> str | None:
    """Why one call fails its check, or None when it holds."""
    if kind == "missing":
        return f"check {check + 1}: no result (the program stopped before it ran)"
    if kind in ("error", "memory"):
        return _text(payload)
    if kind != "ok":
        return f"check {check + 1}: an unreadable result"
    try:
        value = plain.load(payload)
    except ValueError as exc:
        return f"check {check + 1}: the result could not be read back ({exc})"
    try:
        holds = call.holds(value)
    except Exception as exc:  # the comparison itself raised: a wrong type, a deep nesting
        return f"AssertionError: check {check + 1} failed ({type(exc).__name__})"
    return None if holds else f"AssertionError: check {check + 1} failed"


def _text(payload: str) -> str:
    """An error message the process printed (a str literal), or the raw text."""
    try:
        value = plain.load(payload)
    except ValueError:
        return payload[:300]
    return value[:300] if isinstance(value, str) else payload[:300]


async def run_checks(cfg: RecipeConfig, program: str, entry_point: str, plan: Plan) -> Judged:
    """Run ``program`` against the plan's calls in the sandbox and judge it in the parent."""
    mark = _mark()
    source = await asyncio.to_thread(driver, program, entry_point, plan, mark)
    result = await cfg.runner.run(source)
    return await asyncio.to_thread(judge, plan, result, mark)
