"""The writer-critic episode of ``program.py`` written as a recipe (Tandem's Dialogue API): the
same turns, prompts and score. Kept to measure what the gateway costs against a recipe
(``scripts/bench_gateway.py``): ``--agent_program null`` trains this instead of the program."""

from __future__ import annotations

from kernel.dialogue import Dialogue
from kernel.hooks import RolloutContext
from kernel.sample import Sample

from .program import CRITIC, WRITER


async def generate(ctx: RolloutContext, sample: Sample) -> list[Sample | None]:
    task = sample.prompt
    writer = Dialogue(ctx.agents["writer"], WRITER, task)
    draft = await writer.speak() or ""
    critic = Dialogue(ctx.agents["critic"], CRITIC, f"Task: {task}\nDraft: {draft}")
    review = await critic.speak() or ""
    writer.say("user", f"Review: {review}\nWrite the final version.")
    final = await writer.speak()
    return [writer.sample(sample, final=final or ""), critic.sample(sample)]
