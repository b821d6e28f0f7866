"""One episode: the proposer writes a problem, the solver answers it ``attempts`` times.

Returns the proposer's sample (turn 0) and one solver sample per attempt (turns 0..K-1: two
samples of one agent in an episode need distinct turns). The attempts carry
``advantage_group=sample.index``, so GRPO compares them with each other (K answers to the
same problem) and not with answers to other episodes' problems. When the proposer writes no
problem, the solver does not speak and only the proposer's sample is returned.
"""

from __future__ import annotations

import asyncio
import re

from kernel.dialogue import Dialogue
from kernel.hooks import RolloutContext
from kernel.sample import Sample

from . import prompts
from .config import as_config

PROBLEM = re.compile(r"(-?\d+)\s*([+*-])\s*(-?\d+)")


def parse_problem(text: str, max_operand: int) -> tuple[str, int] | None:
    """The first 'A op B' in ``text`` as (its text, its value); None if there is none or an
    operand is larger than ``max_operand``."""
    m = PROBLEM.search(text)
    if m is None:
        return None
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    if max(abs(a), abs(b)) > max_operand:
        return None
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"{a} {op} {b}", value


async def generate(ctx: RolloutContext, sample: Sample) -> list[Sample | None]:
    cfg = as_config(ctx.config)
    proposer = Dialogue(
        ctx.agents["proposer"], prompts.PROPOSER_SYSTEM, prompts.proposer(sample.prompt)
    )
    text = await proposer.speak()
    problem = None if text is None else parse_problem(text, cfg.max_operand)
    if problem is None:
        return [proposer.sample(sample, problem=None, op=None, value=None)]
    question, value = problem
    solvers = [
        Dialogue(ctx.agents["solver"], prompts.SOLVER_SYSTEM, prompts.solver(question))
        for _ in range(cfg.attempts)
    ]
    await asyncio.gather(*(s.speak() for s in solvers))
    op = PROBLEM.search(question).group(2)
    return [
        proposer.sample(sample, problem=question, op=op, value=value),
        *(
            s.sample(sample, turn=i, problem=question, value=value, advantage_group=sample.index)
            for i, s in enumerate(solvers)
        ),
    ]
