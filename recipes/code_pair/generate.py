"""One episode of code_pair.

``pair`` (CoMLRL's cooperative code generation): the helper agent (``ctx.agents["helper"]``)
writes the helper function and the main agent (``ctx.agents["main"]``) the entry point, each
from the problem alone and at the same time (neither sees the other's reply; the reward runs
them together). One sample each. Every reply opens with ``recipe_args.code_prefix`` (given, out
of the loss), if any, and with ``stop_after_code`` ends at its code block's closing fence.

``single``: one coder (``ctx.agents["coder"]``) writes the function; reward.py's scoring runs
it, and while checks fail and tries remain, the result (status, checks passed, first error)
goes back to it as a user message, masked out of the loss, for another try. One sample for the
whole dialogue; its last try is scored (``metadata["outcome"]``, read by reward.py).
"""

from __future__ import annotations

import asyncio

from kernel.dialogue import Dialogue
from kernel.hooks import RolloutContext
from kernel.sample import Sample
from recipes.code_pair import prompts
from recipes.code_pair.config import CODER, HELPER, MAIN, as_config
from recipes.code_pair.reward import problem_of, score_single


def _opened(ctx: RolloutContext, name: str, text: str, sample: Sample) -> Dialogue:
    dialogue = Dialogue(ctx.agents[name], None, text)
    if not dialogue.fits:
        raise ValueError(
            f"sample {sample.key}: the {name} prompt does not fit "
            f"max_context_len={dialogue.conv.max_context_len}"
        )
    return dialogue


async def generate(ctx: RolloutContext, sample: Sample) -> list[Sample | None]:
    """The recipe's generate hook: one episode seeded by ``sample`` (a problem row)."""
    cfg = as_config(ctx.config)
    problem, tests, entry = problem_of(sample)
    if cfg.workflow == "single":
        return await _single(ctx, sample, problem, tests, entry)
    helper = _opened(ctx, HELPER, prompts.helper(problem, entry, cfg.helper_name), sample)
    main = _opened(ctx, MAIN, prompts.main(problem, entry, cfg.helper_name), sample)
    await asyncio.gather(
        helper.speak(cfg.sampling, prefix=cfg.prefix(cfg.helper_name)),
        main.speak(cfg.sampling, prefix=cfg.prefix(entry)),
    )
    return [helper.sample(sample), main.sample(sample)]


async def _single(
    ctx: RolloutContext, sample: Sample, problem: str, tests: str, entry: str
) -> list[Sample]:
    cfg = as_config(ctx.config)
    coder = _opened(ctx, CODER, prompts.coder(problem, entry), sample)
    outcome = None
    for turn in range(cfg.max_turns):
        reply = await coder.speak(cfg.sampling, prefix=cfg.prefix(entry))
        if reply is None:  # out of context budget
            break
        outcome = await score_single(cfg, problem, tests, entry, reply)
        done = outcome.total > 0 and outcome.passed == outcome.total
        if done or turn + 1 == cfg.max_turns:
            break
        message = prompts.feedback(outcome.status, outcome.passed, outcome.total, outcome.error)
        if not coder.say("user", message):
            break
    out = coder.sample(sample, outcome=outcome)
    if out is None or outcome is None:
        return []
    out.metadata.setdefault("metrics", {})["tries"] = float(coder.turns)
    return [out]
