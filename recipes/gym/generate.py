"""One episode: the agent and the environment its row names take turns until the environment
says done (or ``max_turns`` actions, or the agent's context budget, run out).

The row (prompt, label and metadata) resets the environment; its first observation is the
agent's first user message, each later one (a tool's output, test feedback) the next. The
agent's one sample covers every turn (the observations out of its loss); its metadata carry
the environment's name, the summed reward of its actions (``env_reward``), whether it ended
(``env_done``), the last ``info``, whose numbers become the step's metrics as ``<env>/<key>``
(per environment, so a run mixing environments reports each apart), and every ``transitions``
(observation, action, next observation: what ``kernel collect --collect.keep transitions``
writes as world-model data).
"""

from __future__ import annotations

from kernel.dialogue import Dialogue
from kernel.hooks import RolloutContext
from kernel.sample import Sample

from .config import as_config


def env_of(ctx: RolloutContext, sample: Sample) -> str:
    """The environment of ``sample``'s row: its ``env`` column, else recipe_args.env."""
    name = sample.metadata.get("env") or as_config(ctx.config).env
    if name not in ctx.envs:
        raise ValueError(
            f"row {sample.metadata.get('row')}: environment {name!r} is not among the run's "
            f"environments {sorted(ctx.envs)} (set environments.{name} or recipe_args.env)"
        )
    return name


async def generate(ctx: RolloutContext, sample: Sample) -> list[Sample | None]:
    cfg = as_config(ctx.config)
    name = env_of(ctx, sample)
    item = {**sample.metadata, "prompt": sample.prompt, "label": sample.label}
    rewards: list[float] = []
    transitions: list[dict] = []  # (observation, action) -> next observation: world-model data
    async with ctx.envs[name].session() as env:
        obs = await env.reset(item)
        player = Dialogue(ctx.agents[cfg.agent], cfg.system, obs.text)
        while player.fits and player.turns < cfg.max_turns:
            action = await player.speak(prefix=cfg.action_prefix)
            if action is None:  # out of context budget
                break
            seen, obs = obs, await env.step(action)
            rewards.append(obs.reward or 0.0)
            transitions.append(
                {"observation": seen.text, "action": action, "next_observation": obs.text}
            )
            if obs.done or not player.say("user", obs.text):
                break
    numbers = {f"{name}/{k}": float(v) for k, v in obs.info.items() if isinstance(v, (int, float))}
    metrics = {**numbers, f"{name}/reward": sum(rewards), f"{name}/turns": float(player.turns)}
    out = player.sample(
        sample,
        env=name,
        env_reward=sum(rewards),
        env_done=obs.done,
        info=obs.info,
        transitions=transitions,
        metrics=metrics,
        correct=bool(obs.info.get("correct", False)),
    )
    return [out]
