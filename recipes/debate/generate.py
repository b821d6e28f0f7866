"""One debate: the debaters answer a question, read each other's answers and answer again, for
``rounds`` rounds; with ``judge: model`` the judge agent then reads the question and the final
answers and states the verdict.

Each debater keeps its OWN token-exact dialogue: the question, its own turns (trained on) and,
between rounds, the others' last answers as a user message (loss mask 0). Within a round the
debaters speak at the same time, so none sees a same-round answer. A dialogue out of context
budget ends the debate there. Returns one sample per debater (``credit: turn``: one per debater
and round, each training only that round's turn, debater by debater in round order) and the
judge's, when it spoke;
the first carries the whole debate in ``metadata["debate"]`` ({debater: [turn texts]}) and the
verdict text in ``metadata["verdict"]`` for reward.py. ``style: procon`` debates a motion
instead, each debater on an assigned side (procon.py).
"""

from __future__ import annotations

import asyncio

from kernel.dialogue import Dialogue
from kernel.hooks import RolloutContext
from kernel.sample import Sample
from recipes.debate import procon, prompts
from recipes.debate.config import JUDGE, as_config


async def generate(ctx: RolloutContext, sample: Sample) -> list[Sample | None]:
    """The recipe's generate hook: one debate about ``sample``'s question."""
    cfg = as_config(ctx.config)
    if cfg.style == "procon":
        return await procon.generate(ctx, sample, cfg)
    question = str(sample.prompt)
    dialogues = {}
    for name in cfg.debaters:
        others = [o for o in cfg.debaters if o != name]
        system = prompts.debater_system(name, others, cfg.rounds)
        dialogues[name] = Dialogue(ctx.agents[name], system, question)
        if not dialogues[name].fits:
            raise ValueError(f"sample {sample.key}: the question does not fit {name}'s context")
    turns: dict[str, list[str]] = {name: [] for name in cfg.debaters}
    per_turn: list[Sample] = []  # credit turn: each round's turns as samples of their own
    for round_ in range(cfg.rounds):
        said = await asyncio.gather(*(d.speak() for d in dialogues.values()))
        if any(text is None for text in said):
            break  # a dialogue is out of budget: the debate ends with the last full round
        for name, text in zip(cfg.debaters, said, strict=True):
            turns[name].append(text)
            if cfg.credit == "turn":
                per_turn.append(dialogues[name].sample(sample, turn=round_, last_turn_only=True))
        if round_ + 1 == cfg.rounds:
            break
        fits = [
            dialogues[name].say(
                "user",
                prompts.others_said(
                    {o: turns[o][-1] for o in cfg.debaters if o != name}, cfg.max_quote_chars
                ),
            )
            for name in cfg.debaters
        ]
        if not all(fits):
            break
    if not all(turns.values()):
        raise ValueError(f"sample {sample.key}: a debater could not speak within its context")

    record = {"debate": turns}
    judge_sample = None
    if cfg.judge == "model":
        finals = {name: turns[name][-1] for name in cfg.debaters}
        view = prompts.judge_view(question, finals, cfg.max_quote_chars)
        judge = Dialogue(ctx.agents[JUDGE], prompts.judge_system(), view)
        record["verdict"] = await judge.speak() if judge.fits else None
        judge_sample = judge.sample(sample, **record)
    if cfg.credit == "turn":
        samples = sorted(per_turn, key=lambda s: (cfg.debaters.index(s.agent), s.turn))
        for s in samples:
            s.metadata.update(record)
    else:
        samples = [dialogues[name].sample(sample, **record) for name in cfg.debaters]
    samples.append(judge_sample)
    return samples
