"""The two-agent hooks of Tandem's side of ``scripts/bench_vs_peers.py`` (loaded by dotted path,
``--generate_fn tandem_duo.generate --reward_fn tandem_duo.reward``): the doctor and the patient
both answer the prompt, side by side (the joint action CoMLRL's MAGRPO trains on), and share one
team reward. The one-agent comparison needs no hooks of its own: it is the ``toy`` preset's task.
"""

from __future__ import annotations

import asyncio

from task import team_reward

from kernel.sample import Status


async def generate(ctx, sample):
    """One user turn (the prompt), one sampled answer per agent, concurrently."""
    names = list(ctx.agents)
    convs = []
    for name in names:
        conv = ctx.agents[name].conversation()
        conv.add_message("user", sample.prompt)
        convs.append(conv)
    results = await asyncio.gather(
        *(ctx.agents[n].generate_turn(c) for n, c in zip(names, convs, strict=True))
    )
    out = []
    for name, conv, result in zip(names, convs, results, strict=True):
        status = Status.COMPLETED if result.finish_type == "stop" else Status.TRUNCATED
        s = conv.to_sample(agent=name, status=status, **sample.seed_fields())
        s.metadata["text"] = ctx.agents[name].tokenizer.decode(
            result.output_ids, skip_special_tokens=True
        )
        out.append(s)
    return out


def reward(ctx, samples):
    """The team reward (the doctor's letter share and the patient's digit share, averaged),
    the same for both agents."""
    text = {s.agent: s.metadata["text"] for s in samples}
    return team_reward(text["doctor"], text["patient"])
