"""math_solver_verifier's generate: both workflows against a real embedded engine serving a
tiny model; parsing and metric goldens; short CPU training runs that log every metric."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kernel.cli import train_config
from kernel.engine.pool import EngineConfig, EnginePool
from kernel.hooks import RolloutContext
from kernel.run.agents import AgentHandle
from kernel.run.loop import train
from kernel.sample import Sample, Status
from recipes.math_solver_verifier.config import RecipeConfig
from recipes.math_solver_verifier.generate import (
    generate,
    parse_judgment,
    parse_verdict,
    srs_metrics,
    verifier_metrics,
)
from recipes.math_solver_verifier.reward import is_equivalent

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "math_solver_verifier" / "presets" / "tiny.yaml"


@pytest.mark.parametrize(
    ("text", "n", "expected"),
    [
        ("Judgment: 2", 3, 1),
        ("judgment: **3** ... so, Judgment: 03", 3, 2),  # repeated, markdown allowed
        ("judgment:1 ... Judgment: **3**", 3, None),  # two picks: a list, no judgment
        ("Judgment: 4", 3, None),  # out of range
        ("Judgment: 0", 3, None),
        ("I pick the second one", 3, None),
    ],
)
def test_parse_judgment(text, n, expected):
    assert parse_judgment(text, n) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Yes, the final answer is correct.", True),
        ("no. 5 - 3 is 2, not 1.", False),
        ("**No**, it is 2.", False),
        ("\nYes.", True),
        ("Not quite: it is 2.", None),  # 'Not' is no verdict
        ("The final answer is correct. Yes.", None),  # the verdict must open the reply
        # replies of a verifier trained 32 steps to end with 'Verdict: approve|reject', the last
        # one stated counting (1be2e57): under the first-word rule, none is a verdict
        ("Verdict: \nVerdict: approve\nVerdict: reject", None),
        ("Verdict: \nVerdict: approve", None),
        ("", None),
    ],
)
def test_parse_verdict(text, expected):
    assert parse_verdict(text) == expected


def test_episode_metric_goldens():
    # 2 solvers (second right), 2 rewrites (first right), selector picked the first: solved
    m = srs_metrics(2, 0, [True, False], [False, True], rewritten=True)
    assert m == {
        "turns": 5.0,
        "selector_format_ok": 1.0,
        "selector_accuracy": 1.0,
        "solver_pass@k": 1.0,
        "solver_accuracy": 0.5,
        "rewrite_accuracy": 0.5,
        "solved": 1.0,
    }
    m3 = srs_metrics(3, 2, [True, True, True], [False, False, True], rewritten=True)
    assert m3["solver_accuracy"] == 1 / 3
    # no correct rewrite: selector accuracy is undefined, not 0
    assert srs_metrics(2, 1, [False, False], [False, False], True)["selector_accuracy"] is None
    assert srs_metrics(2, None, [True, False], [True, True], True)["selector_format_ok"] == 0.0
    # solver_selector: the selector is offered the solutions themselves (no rewrite figure)
    m = srs_metrics(2, 1, [False, True], [False, True], rewritten=False)
    assert m == {
        "turns": 3.0,
        "selector_format_ok": 1.0,
        "selector_accuracy": 1.0,
        "solver_pass@k": 1.0,
        "solver_accuracy": 0.5,
        "solved": 1.0,
    }
    # approved at the 2nd of 3 loops: early termination; one malformed verdict of two
    v = verifier_metrics([None, True], True, 3)
    assert v == {
        "turns": 4.0,
        "early_termination": 1.0,
        "verifier_format_ok": 0.5,
        "approved_correct": 1.0,
        "solved": 1.0,
    }
    assert verifier_metrics([False, False, False], False, 3)["early_termination"] == 0.0


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from kernel.models import materialize_model

    work = tmp_path_factory.mktemp("math")
    model = materialize_model("tiny-smollm2", work)
    with EnginePool(EngineConfig(num_threads=1), model, work / "logs") as pool:
        yield model, pool.urls


def _context(engine, workflow: str, roles: tuple[str, ...]) -> RolloutContext:
    from kernel.engine.client import EngineClient
    from kernel.models import load_tokenizer

    model, urls = engine
    tok = load_tokenizer(model)
    agents = {
        r: AgentHandle(r, [EngineClient(urls[0])], tok, {"temperature": 1.0}, 24, 512)
        for r in roles
    }
    config = RecipeConfig(workflow=workflow, num_parallel=2, max_loops=2).validate()
    return RolloutContext(agents=agents, config=config)


def _seed() -> Sample:
    return Sample(prompt="Calculate 5 - 3.", label="2", group_id=3, index=1, metadata={"row": 9})


def _own_text(sample: Sample, tok) -> str:
    return tok.decode([t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m])


@pytest.mark.parametrize(
    ("workflow", "roles"),
    [
        ("solver_rewriter_selector", ("solver", "rewriter", "selector")),
        ("solver_selector", ("solver", "selector")),
        ("solver_verifier", ("solver", "verifier")),
        ("solver", ("solver",)),
    ],
)
def test_generate_against_the_embedded_engine(engine, workflow, roles):
    ctx = _context(engine, workflow, roles)
    samples = asyncio.run(_generate_and_close(ctx))
    tok = ctx.agents[roles[0]].tokenizer
    counts = {r: sum(s.agent == r for s in samples) for r in roles}
    if workflow == "solver_rewriter_selector":
        assert counts == {"solver": 2, "rewriter": 2, "selector": 1}
    elif workflow == "solver_selector":
        assert counts == {"solver": 2, "selector": 1}
    elif workflow == "solver":  # each answer is its own sample's outcome
        assert counts == {"solver": 2}
        for s in samples:
            assert s.metadata["correct"] == is_equivalent(s.metadata["answer"], "2")
    else:
        assert counts["solver"] == 1 and counts["verifier"] == 1
    for s in samples:
        s.validate()
        assert s.status in (Status.COMPLETED, Status.TRUNCATED)
        assert (s.group_id, s.index, s.metadata["row"]) == (3, 1, 9)
        assert s.metadata["role"] == s.agent and isinstance(s.metadata["correct"], bool)
        # each role trains only on what it sampled: its masked tokens decode to its own turns,
        # never to the problem or the solutions of other roles quoted in its prompt
        own = _own_text(s, tok)
        assert s.metadata["text"] in own
        assert "Calculate 5 - 3." not in own and "Solution 1" not in own
        assert len(s.rollout_logprobs) == s.response_length
        assert all(lp <= 0 for lp in s.rollout_logprobs)


async def _generate_and_close(ctx):
    try:
        return await generate(ctx, _seed())
    finally:
        for agent in ctx.agents.values():
            for c in agent.clients:
                await c.aclose()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workflow", "roles", "episode_keys"),
    [
        (
            "solver_rewriter_selector",
            ["solver", "rewriter", "selector"],
            ["turns", "selector_format_ok", "solver_pass@k", "solver_accuracy", "solved", "tokens"],
        ),
        (
            "solver_verifier",
            ["solver", "verifier"],
            ["turns", "early_termination", "solved", "tokens"],
        ),
        (
            "solver_selector",
            ["solver", "selector"],
            ["turns", "selector_format_ok", "solver_pass@k", "solver_accuracy", "solved"],
        ),
        ("solver", ["solver"], ["turns", "solver_pass@k", "solved", "tokens"]),
    ],
)
def test_short_cpu_training_run_logs_every_metric(tmp_path, workflow, roles, episode_keys):
    cfg = train_config(
        [
            f"--config={TINY}",
            f"--output_dir={tmp_path}",
            f"--agents={roles}",
            f'--recipe_args={{"workflow": "{workflow}", "num_parallel": 2, "max_loops": 2}}',
        ]
    )
    rows = train(cfg)
    assert [r["step"] for r in rows] == [0, 1]
    for row in rows:
        for role in roles:
            for key in ("reward", "response_length", "truncated", "mask_share", "samples"):
                assert f"{role}/{key}" in row, (role, key)
        for key in episode_keys:
            assert f"episode/{key}" in row, key
        assert row["train/n_samples"] > 0 and "train/logprob_diff" in row
    assert rows[-1]["train/logprob_diff"] < 1e-4
    assert any(k.startswith("eval/solver/pass@2") for k in rows[-1])


def test_a_selector_prefix_is_given_not_trained_and_the_pick_follows_it(
    scripted_agent, smollm2_tokenizer
):
    tok = smollm2_tokenizer
    agents = {
        "solver": scripted_agent("solver", tok, ["5 - 3 = 1", "5 - 3 = 2"]),
        "rewriter": scripted_agent("rewriter", tok, ["The answer is 1.", "The answer is 2."]),
        "selector": scripted_agent("selector", tok, ["2, the second one."]),
    }
    config = RecipeConfig(num_parallel=2, selector_prefix="Judgment: ").validate()
    samples = asyncio.run(generate(RolloutContext(agents=agents, config=config), _seed()))
    (sel,) = [s for s in samples if s.agent == "selector"]
    assert sel.metadata["text"] == "Judgment: 2, the second one."
    assert sel.metadata["picked"] == 1 and sel.metadata["correct"] is True
    assert sel.metadata["metrics"]["selector_format_ok"] == 1.0
    own = _own_text(sel, tok)  # the prefix is context: the selector trains on its pick only
    assert own.startswith("2, the second one.") and "Judgment" not in own


def test_solver_selector_picks_among_the_solutions_and_its_pick_is_the_outcome(
    scripted_agent, smollm2_tokenizer
):
    tok = smollm2_tokenizer
    agents = {
        # the strict rule: an equation alone states no answer ("5 - 3 = 2" has three numbers)
        "solver": scripted_agent("solver", tok, ["5 - 3 = 1. So 1", "5 - 3 = 2. So 2"] * 2),
        "selector": scripted_agent("selector", tok, ["1", "2"]),
    }
    config = RecipeConfig(
        workflow="solver_selector", num_parallel=2, selector_prefix="Judgment: "
    ).validate()
    ctx = RolloutContext(agents=agents, config=config)
    for picked, right in ((0, False), (1, True)):
        samples = asyncio.run(generate(ctx, _seed()))
        assert [s.agent for s in samples] == ["solver", "solver", "selector"]
        sel = samples[-1]
        shown = tok.decode(sel.prompt_ids)  # the solutions themselves, numbered
        assert "Solution 1:\n5 - 3 = 1" in shown and "Solution 2:\n5 - 3 = 2" in shown
        assert sel.metadata["picked"] == picked
        # every sample carries the pick's outcome; the solvers are scored on their own answer
        assert {s.metadata["correct"] for s in samples} == {right}
        assert [s.metadata["answer"] for s in samples[:2]] == ["1", "2"]
        assert sel.metadata["metrics"]["turns"] == 3.0
        assert "rewrite_accuracy" not in sel.metadata["metrics"]


def test_the_verdict_opens_the_verifiers_reply_and_the_solver_revises_on_no(
    scripted_agent, smollm2_tokenizer
):
    tok = smollm2_tokenizer
    agents = {
        "solver": scripted_agent("solver", tok, ["5 - 3 = 1. So 1", "Sorry: 5 - 3 = 2. So 2"]),
        "verifier": scripted_agent("verifier", tok, ["No, 5 - 3 is not 1.", "Yes."]),
    }
    config = RecipeConfig(workflow="solver_verifier", max_loops=3).validate()
    samples = asyncio.run(generate(RolloutContext(agents=agents, config=config), _seed()))
    sol, ver = samples
    assert ver.metadata["verdicts"] == [False, True] and ver.metadata["correct"] is True
    assert "No, 5 - 3 is not 1." in tok.decode(sol.prompt_ids + sol.response_ids)
    assert sol.metadata["metrics"]["early_termination"] == 1.0
