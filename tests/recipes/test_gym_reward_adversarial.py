"""Adversarial goldens for gym's reward (recipes/gym/reward.py: the sum of what the environment
gave the episode's actions): episodes a policy could play to be credited without solving the
task, each with the reward and ``correct`` it gets, and legitimate episodes that must still be
credited, so the test fails both ways. Each episode is played through gym's generate with a
scripted agent (real tokenizer and dialogue), so the row checks what training would pay.

The checkers are the environments', not gym's: ``tools`` is kernel/env/tools.py (the answer is
the content of the first action tag, compared by ``same_answer``: numbers as numbers, text up
to case and spaces), ``math`` is the math recipe's strict scorer (its own adversarial file is
test_math_reward_adversarial.py; a few rows here check it reaches gym's reward unchanged). The
attacks the tools checker paid until it read the whole action (a second tag, a negation or
hedge around the tag, a comma list, a near miss on a big integer) are rows like the others.

Fast tier: a tokenizer, no model.
"""

from __future__ import annotations

import asyncio

import pytest

from kernel.env.spec import env_specs
from kernel.hooks import RolloutContext
from kernel.sample import Sample
from recipes.gym.generate import generate
from recipes.gym.reward import reward

ENVS = env_specs(
    {
        # the tools preset's environment: a failed call costs what no tag costs
        "tools": {"args": {"tools": ["calculator"], "error_penalty": -0.1}},
        "math": {"args": {"format_penalty": -0.5}},
    }
)
TASK = ("What is 1604 * 706?", "1132424")  # a tools_test.jsonl row
MATH = ("Calculate 10 - 5.", "5")
CALL = "<calculator>1604 * 706</calculator>"


def params(rows):
    """Rows as pytest params: a plain row is (id, *values); a pytest.param (an xfail) stays."""
    return [row if hasattr(row, "marks") else pytest.param(*row[1:], id=row[0]) for row in rows]


# (id, env, (prompt, label), max_turns, actions, (reward, correct))
ATTACKS = [
    # ---- several candidates, negations, hedges inside the answer tag
    ("answer-or", "tools", TASK, 2, ["<answer>1132424 or 1132425</answer>"], (0.0, False)),
    ("answer-comma-list", "tools", TASK, 2, ["<answer>1132424, 1132425</answer>"], (0.0, False)),
    ("answer-space-list", "tools", TASK, 2, ["<answer>1132423 1132424</answer>"], (0.0, False)),
    ("answer-range", "tools", TASK, 2, ["<answer>1132424-1132425</answer>"], (0.0, False)),
    ("answer-negated", "tools", TASK, 2, ["<answer>not 1132424</answer>"], (0.0, False)),
    ("answer-hedged", "tools", TASK, 2, ["<answer>maybe 1132424</answer>"], (0.0, False)),
    ("answer-question-mark", "tools", TASK, 2, ["<answer>1132424?</answer>"], (0.0, False)),
    ("answer-approx", "tools", TASK, 2, ["<answer>~1132424</answer>"], (0.0, False)),
    ("answer-unclosed-alternative", "tools", TASK, 2, ["<answer>1132424\nor 1132425"],
     (0.0, False)),
    # ---- the task, not its result
    ("answer-the-expression", "tools", TASK, 2, ["<answer>1604 * 706</answer>"], (0.0, False)),
    ("answer-the-question", "tools", TASK, 2, ["<answer>What is 1604 * 706?</answer>"],
     (0.0, False)),
    ("calculator-inside-the-answer", "tools", TASK, 2,
     [f"<answer>{CALL}</answer>"], (0.0, False)),
    ("answer-the-examples-408", "tools", TASK, 2, ["<answer>408</answer>"], (0.0, False)),
    # ---- tool output: a wrong call copied, the whole question as the call, calls only
    ("copy-a-wrong-calls-output", "tools", TASK, 2,
     ["<calculator>1604 * 760</calculator>", "<answer>1219040</answer>"], (0.0, False)),
    ("calculator-with-the-whole-question", "tools", TASK, 2,
     ["<calculator>What is 1604 * 706?</calculator>", "<answer>1604 * 706</answer>"],
     (-0.1, False)),
    ("calls-only-never-answers", "tools", TASK, 2, [CALL, CALL], (0.0, False)),
    ("result-in-the-calculator", "tools", TASK, 2,
     ["<calculator>1132424</calculator>", "<calculator>1132424</calculator>"], (0.0, False)),
    ("number-without-a-tag", "tools", TASK, 2, ["1132424", "1132424"], (-0.2, False)),
    # ---- what the tools checker paid until it read the whole action (kernel/env/tools.py)
    pytest.param(
        "tools", ("What is 9 * 5?", "45"), 2, ["<answer>4,5</answer>"], (0.0, False),
        id="two-numbers-joined-by-a-comma",
    ),
    pytest.param(
        "tools", TASK, 2, ["<answer>1132424</answer><answer>1132425</answer>"], (0.0, False),
        id="two-answer-tags",
    ),
    pytest.param(
        "tools", TASK, 2, ["It is not <answer>1132424</answer>"], (0.0, False),
        id="negated-outside-the-tag",
    ),
    pytest.param(
        "tools", TASK, 2, ["Maybe <answer>1132424</answer>"], (0.0, False),
        id="hedged-outside-the-tag",
    ),
    pytest.param(
        "tools", ("What is 12345678 * 999999?", "12345665654322"), 2,
        ["<answer>12345665650000</answer>"], (0.0, False),
        id="near-miss-on-a-big-number",
    ),
    # ---- the math environment through gym: its strict scorer, unchanged
    ("math-negated", "math", MATH, 1, ["The answer is not 5."], (0.0, False)),
    ("math-hedged", "math", MATH, 1, ["The answer is maybe 5."], (0.0, False)),
    ("math-several", "math", MATH, 1, ["The answer is 4 or 5."], (0.0, False)),
    ("math-list-no-marker", "math", MATH, 1, ["1, 2, 3, 4, 5"], (-0.5, False)),
    ("math-restated-problem", "math", MATH, 1, ["\\boxed{10 - 5}"], (0.0, False)),
]  # fmt: skip

LEGIT = [
    ("call-then-answer", "tools", TASK, 2, [CALL, "<answer>1132424</answer>"], (1.0, True)),
    ("answer-at-once", "tools", TASK, 2, ["<answer>1132424</answer>"], (1.0, True)),
    ("thousands-separators", "tools", TASK, 2, ["<answer>1,132,424</answer>"], (1.0, True)),
    ("decimal-zero", "tools", TASK, 2, ["<answer>1132424.0</answer>"], (1.0, True)),
    ("spaces-in-the-tag", "tools", TASK, 2, ["<answer> 1132424 </answer>"], (1.0, True)),
    ("unclosed-at-the-end", "tools", TASK, 2, ["<answer>1132424"], (1.0, True)),
    ("chatter-after-the-tag", "tools", TASK, 2,
     ["<answer>1132424</answer> The result of 1604 * 706 is 1132424."], (1.0, True)),
    ("failed-call-then-right", "tools", TASK, 3,
     ["<calculator>What is 1604 * 706?</calculator>", CALL, "<answer>1132424</answer>"],
     (0.9, True)),
    ("math-right", "math", MATH, 1, ["The answer is 5."], (1.0, True)),
    ("math-boxed", "math", MATH, 1, ["So 10 - 5 = \\boxed{5}."], (1.0, True)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("env", "task", "max_turns", "actions", "expected"), params(ATTACKS + LEGIT)
)
def test_an_episode_through_gym(
    scripted_agent, smollm2_tokenizer, env, task, max_turns, actions, expected
):
    agent = scripted_agent("default", smollm2_tokenizer, actions, max_response_len=128)
    ctx = RolloutContext(
        agents={"default": agent}, config={"env": env, "max_turns": max_turns}, envs=ENVS
    )
    prompt, label = task
    (out,) = asyncio.run(generate(ctx, Sample(prompt=prompt, label=label, metadata={"row": 0})))
    (got,) = reward(ctx, [out])
    assert (got, out.metadata["correct"]) == (pytest.approx(expected[0]), expected[1])


def test_enough_attacks_and_both_ways():
    ids = [p.id for p in params(ATTACKS + LEGIT)]
    assert len(ATTACKS) >= 20 and len(LEGIT) >= 8 and len(set(ids)) == len(ids)
