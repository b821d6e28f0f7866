"""A toy generate hook with one straggler: the episodes of the first group a run hands out
(group_id 0) answer, then wait until the run has trained ``STRAGGLE_STEPS`` steps (as a slow
tool or a long partner turn would) -- only the first time each is rolled out in this process
(``straggled``; a test clears it), so a requeued or resumed roll of the group is quick. Read by
tests/test_partial.py."""

from __future__ import annotations

import asyncio

from kernel.toy import generate as toy_generate

STRAGGLE_STEPS = 3
straggled: set[int] = set()  # the indices of group 0's episodes that waited


async def generate(ctx, sample):
    samples = await toy_generate(ctx, sample)
    if sample.group_id == 0 and sample.index not in straggled:
        straggled.add(sample.index)
        while ctx.step < STRAGGLE_STEPS:
            await asyncio.sleep(0.02)
    return samples
