"""template: the problem parser, the rewards against goldens, an episode with scripted replies
(real tokenizer and dialogues), and the tiny preset through the whole loop. Copy this file
with the recipe (recipes/template/README.md) and change ``template`` to your recipe's name."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kernel.cli import train_config
from kernel.hooks import RolloutContext
from kernel.run.loop import train
from kernel.sample import Sample
from recipes.template.config import RecipeConfig
from recipes.template.generate import generate, parse_problem
from recipes.template.reward import answer, reward

TINY = Path(__file__).resolve().parents[2] / "recipes" / "template" / "presets" / "tiny.yaml"


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("Problem: 12 + 7", ("12 + 7", 19)),
        ("How about 3*-4? Or 5 + 5.", ("3 * -4", -12)),
        ("Problem: 150 - 2", None),  # an operand above max_operand
        ("Add two numbers.", None),
    ],
)
def test_parse_problem(text, parsed):
    assert parse_problem(text, max_operand=99) == parsed


def test_answer_is_the_last_number():
    assert answer("3 + 4 = 7. Answer: 7") == 7 and answer("Answer: -2") == -2
    assert answer("no idea") is None


def _samples(label, op, value, texts):
    meta = {"value": value, "op": op}
    proposer = Sample(agent="proposer", label=label, metadata=dict(meta))
    return [proposer] + [Sample(agent="solver", metadata={**meta, "text": t}) for t in texts]


@pytest.mark.parametrize(
    ("label", "texts", "rewards"),
    [
        ("+", ["Answer: 7", "Answer: 8"], [1.0, 1.0, 0.0]),  # solved half the time: learnable
        ("+", ["Answer: 7", "7"], [0.0, 1.0, 1.0]),  # always solved: nothing to learn
        ("+", ["Answer: 1", "none"], [0.0, 0.0, 0.0]),  # never solved
        ("*", ["Answer: 7", "Answer: 8"], [0.0, 1.0, 0.0]),  # the wrong operation
    ],
)
def test_rewards_golden(label, texts, rewards):
    samples = _samples(label, "+", 7, texts)
    assert reward(RolloutContext(), samples) == rewards
    assert samples[0].metadata["metrics"]["wrote_problem"] == 1.0


def test_no_problem_pays_the_proposer_nothing():
    samples = _samples("+", None, None, [])
    assert reward(RolloutContext(), samples) == [0.0]
    assert samples[0].metadata["metrics"] == {"solved": 0.0, "wrote_problem": 0.0}


def test_an_episode_with_scripted_replies(smollm2_tokenizer, scripted_agent):
    tok = smollm2_tokenizer
    agents = {
        "proposer": scripted_agent("proposer", tok, ["Problem: 3 + 4"]),
        "solver": scripted_agent("solver", tok, ["3 + 4 = 7. Answer: 7", "Answer: 8"]),
    }
    ctx = RolloutContext(agents=agents, config=RecipeConfig(attempts=2).validate())
    seed = Sample(prompt="an addition problem with two one-digit numbers", label="+", index=3)
    samples = asyncio.run(generate(ctx, seed))
    assert [(s.agent, s.turn) for s in samples] == [("proposer", 0), ("solver", 0), ("solver", 1)]
    assert all(s.metadata["advantage_group"] == 3 for s in samples[1:])
    assert "What is 3 + 4?" in tok.decode(samples[1].prompt_ids)
    assert reward(ctx, samples) == [1.0, 1.0, 0.0]


def test_no_problem_means_no_solver_turn(smollm2_tokenizer, scripted_agent):
    agents = {"proposer": scripted_agent("proposer", smollm2_tokenizer, ["I like numbers."])}
    ctx = RolloutContext(agents=agents, config={"attempts": 2})
    samples = asyncio.run(generate(ctx, Sample(prompt="an addition problem", label="+")))
    assert [s.agent for s in samples] == ["proposer"]
    assert reward(ctx, samples) == [0.0]


@pytest.mark.parametrize(("args", "field"), [({"attempts": 0}, "attempts"), ({"x": 1}, "x")])
def test_config_errors_name_the_field(args, field):
    from kernel.hooks import HookError, load_recipe_config

    with pytest.raises((ValueError, HookError), match=field):
        load_recipe_config("recipes.template.config.RecipeConfig", args)


@pytest.mark.slow
def test_tiny_preset_runs_end_to_end(tmp_path):
    rows = train(train_config([f"--config={TINY}", f"--output_dir={tmp_path}"]))
    assert [r["step"] for r in rows] == [0, 1]
    assert all("proposer/reward" in r and "episode/wrote_problem" in r for r in rows)
