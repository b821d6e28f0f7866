"""The toy task: a recipe-shaped pair of hooks the kernel uses to prove that it learns.

The reward of a response is the share of its characters that are digits. A freshly
initialised tiny model with the 100-token character tokenizer (``kernel.models``, model name
``tiny-char``) samples close to uniformly, so the reward starts near 0.1; a policy that learns
moves it towards 1. The task needs no labels and gives a dense signal, so a 2-layer model
learns it in about a minute on CPU through the full path (embedded engine generation ->
reward -> advantages -> train -> weight sync), and a flipped sign or a lost weight update
shows at once. ``python -m kernel train --preset toy`` runs it.

Two variants: ``toy_duo`` (a doctor and a patient, each its own model) and ``toy_steps``
(episodes of 3 steps, each a sample with its observation as GiGPO's anchor state).
"""

from __future__ import annotations

import json
from pathlib import Path

from kernel.hooks import RolloutContext
from kernel.sample import Sample, Status

AGENT = "default"


def toy_reward(ctx: RolloutContext, samples: list[Sample]) -> float:
    """Share of digits in the response text (``metadata["text"]``), 0.0 if empty."""
    text = "".join(s.metadata.get("text", "") for s in samples)
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


reward = toy_reward


async def _answer(ctx: RolloutContext, sample: Sample, user: str, turn: int = 0) -> Sample:
    """The single agent's sampled answer to one user message, as a sample of ``sample``'s
    episode; its decoded text in ``metadata["text"]``."""
    agent = ctx.agents[AGENT]
    conv = agent.conversation()
    conv.add_message("user", user)
    result = await agent.generate_turn(conv)
    status = Status.COMPLETED if result and result.finish_type == "stop" else Status.TRUNCATED
    out = conv.to_sample(agent=AGENT, turn=turn, status=status, **sample.seed_fields())
    sampled = [t for t, m in zip(out.response_ids, out.loss_mask, strict=True) if m]
    out.metadata["text"] = agent.tokenizer.decode(sampled, skip_special_tokens=True)
    return out


async def generate(ctx: RolloutContext, sample: Sample) -> list[Sample]:
    """One user turn (the prompt), one sampled answer of the single agent."""
    return [await _answer(ctx, sample, sample.prompt)]


def write_toy_prompts(path: Path, n: int = 64) -> Path:
    """A JSONL file of n distinct short prompts (the toy reward ignores their content)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"Write a short line of text, number {i}."}) + "\n")
    return path


# ---------------------------------------------------------------- the two-agent toy

DOCTOR, PATIENT = "doctor", "patient"


def _share(text: str, predicate) -> float:
    return sum(map(predicate, text)) / len(text) if text else 0.0


def duo_reward(ctx: RolloutContext, samples: list[Sample]) -> dict[str, float]:
    """Bilateral rewards of the two-agent toy. The patient answers faithfully when it answers
    with facts: its reward is the share of digits in its answer. The doctor asks well when its
    question is words (share of letters) AND gets facts back: its reward is the mean of the two,
    so it depends on how well the patient has learned to answer."""
    text = {s.agent: s.metadata.get("text", "") for s in samples}
    ask = _share(text.get(DOCTOR, ""), str.isalpha)
    info = _share(text.get(PATIENT, ""), str.isdigit)
    return {DOCTOR: (ask + info) / 2, PATIENT: info}


async def duo_generate(ctx: RolloutContext, sample: Sample) -> list[Sample]:
    """The doctor asks (one turn), the patient answers; each speaks with its own model and keeps
    its own dialogue, in which the other's words are a masked user message. Both samples carry
    the exchange as ``metadata["global_state"]`` (for MAPPO's centralized critics)."""
    doctor, patient = ctx.agents[DOCTOR], ctx.agents[PATIENT]
    d_conv, p_conv = doctor.conversation(), patient.conversation()
    d_conv.add_message("user", sample.prompt)
    asked = await doctor.generate_turn(d_conv)
    question = doctor.tokenizer.decode(asked.output_ids, skip_special_tokens=True)
    p_conv.add_message("user", question)
    answered = await patient.generate_turn(p_conv)
    answer = patient.tokenizer.decode(answered.output_ids, skip_special_tokens=True)
    d_conv.add_message("user", answer)  # the doctor hears the answer: context, not trained on

    out = []
    for agent, conv, result, text in (
        (DOCTOR, d_conv, asked, question),
        (PATIENT, p_conv, answered, answer),
    ):
        status = Status.COMPLETED if result.finish_type == "stop" else Status.TRUNCATED
        s = conv.to_sample(agent=agent, status=status, **sample.seed_fields())
        # the whole exchange, what a centralized critic reads (critic.centralized, MAPPO)
        s.metadata |= {"text": text, "global_state": f"Q: {question}\nA: {answer}"}
        out.append(s)
    return out


# ---------------------------------------------------------------- the multi-step toy (GiGPO)

STEPS = 3


def steps_observation(step: int, last_text: str | None) -> str:
    """What the agent sees at ``step`` (0-based): the step number and whether its last reply
    was mostly digits. It is the anchor state of GiGPO's step-level groups: episodes of a group
    that reach the same observation at the same step share one."""
    if last_text is None:
        return f"Step 1 of {STEPS}. Begin."
    last = "digits" if _share(last_text, str.isdigit) >= 0.5 else "words"
    return f"Step {step + 1} of {STEPS}. Your last reply was {last}."


def steps_reward(ctx: RolloutContext, samples: list[Sample]) -> list[float]:
    """One reward per step: the share of digits in that step's reply."""
    return [_share(s.metadata.get("text", ""), str.isdigit) for s in samples]


async def steps_generate(ctx: RolloutContext, sample: Sample) -> list[Sample]:
    """An episode of ``STEPS`` steps, each a separate sample (``turn`` = the step) whose prompt
    is the prompt plus the current observation (``metadata["anchor"]``); the observation
    depends on the previous reply, so a group's episodes meet in a few distinct states."""
    out, last = [], None
    for step in range(STEPS):
        observation = steps_observation(step, last)
        s = await _answer(ctx, sample, f"{sample.prompt}\n{observation}", turn=step)
        s.metadata["anchor"] = observation
        last = s.metadata["text"]
        out.append(s)
    return out
