"""A two-agent episode in which the second agent speaks only in some episodes: the doctor
speaks, the patient answers in even-numbered episodes of a group and stays silent in the odd
ones, and gets a reward-only sample there (``Dialogue.sample(reward_only=True)``)."""

from __future__ import annotations

from kernel.dialogue import Dialogue
from kernel.hooks import RolloutContext
from kernel.sample import Sample
from kernel.toy import DOCTOR, PATIENT


async def generate(ctx: RolloutContext, sample: Sample) -> list[Sample]:
    doctor = Dialogue(ctx.agents[DOCTOR], first=sample.prompt)
    patient = Dialogue(ctx.agents[PATIENT], first=sample.prompt)
    question = await doctor.speak()
    if sample.index % 2 == 0:
        patient.say("user", question or "")
        await patient.speak()
    return [doctor.sample(sample), patient.sample(sample, reward_only=True)]


def reward(ctx: RolloutContext, samples: list[Sample]) -> dict[str, float]:
    """The doctor: share of letters; the patient: 1 when silent, its share of digits when it
    spoke (so its spoken episodes fall below the silent ones' baseline)."""
    text = {s.agent: s.metadata["text"] for s in samples}
    letters = sum(map(str.isalpha, text[DOCTOR])) / max(len(text[DOCTOR]), 1)
    spoke = text[PATIENT]
    digits = sum(map(str.isdigit, spoke)) / len(spoke) if spoke else 1.0
    return {DOCTOR: letters, PATIENT: digits}
