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


class RecipeConfig:
    """A recipe config with one field and a check."""

    def __init__(self, turns: int = 2):
        self.turns = turns

    def validate(self):
        if self.turns < 1:
            raise ValueError(f"recipe_args.turns must be >= 1, got {self.turns}")
