"""Hook functions with good and bad signatures, loaded by dotted path in test_hooks.py."""

from kernel.sample import Sample

NOT_A_FUNCTION = 3


async def generate(ctx, sample: Sample) -> list[Sample]:
    return [sample]


def sync_generate(ctx, sample):
    return [sample]


async def generate_one_arg(sample):
    return [sample]


def reward(ctx, samples) -> float:
    return float(len(samples))


async def async_reward(ctx, samples) -> dict:
    return {s.agent: 1.0 for s in samples}
