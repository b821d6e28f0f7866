"""The toy tasks: the digit-share reward (golden values), the multi-step toy's observations
(GiGPO's anchor states) on a real engine, and GiGPO learning it end to end."""

import asyncio
import json
from pathlib import Path

import pytest

from kernel.cli import train_config
from kernel.engine.client import EngineClient
from kernel.hooks import RolloutContext, load_generate, load_reward
from kernel.run.agents import AgentHandle
from kernel.run.loop import train
from kernel.sample import Sample
from kernel.toy import STEPS, steps_generate, steps_observation, steps_reward, toy_reward

TOY_STEPS = Path(__file__).resolve().parent.parent / "kernel" / "presets" / "toy_steps.yaml"


def test_toy_reward_goldens():
    ctx = RolloutContext()
    assert toy_reward(ctx, [Sample(metadata={"text": "a1b2"})]) == 0.5  # 2 digits / 4 chars
    assert toy_reward(ctx, [Sample(metadata={"text": "123"})]) == 1.0
    assert toy_reward(ctx, [Sample(metadata={"text": ""})]) == 0.0


def test_toy_hooks_load_by_dotted_path():
    assert load_generate("kernel.toy.generate")
    assert load_reward("kernel.toy.reward") is toy_reward


def test_steps_observations_and_per_step_rewards():
    assert steps_observation(0, None) == "Step 1 of 3. Begin."
    assert steps_observation(1, "12ab") == "Step 2 of 3. Your last reply was digits."  # half
    assert steps_observation(2, "1abc") == "Step 3 of 3. Your last reply was words."
    samples = [Sample(metadata={"text": t}) for t in ("a1b2", "", "999")]
    assert steps_reward(RolloutContext(), samples) == [0.5, 0.0, 1.0]


def test_a_steps_episode_is_one_sample_per_step_with_its_observation(tiny_engine):
    url, tok = tiny_engine
    agent = AgentHandle("default", [EngineClient(url)], tok, {"temperature": 1.0}, 8, 128)
    seed = Sample(prompt="Write digits.", group_id=3, index=2)

    async def go():
        try:
            return await steps_generate(RolloutContext(agents={"default": agent}), seed)
        finally:
            await agent.clients[0].aclose()

    samples = asyncio.run(go())
    assert [s.turn for s in samples] == list(range(STEPS))
    assert all((s.group_id, s.index, s.agent) == (3, 2, "default") for s in samples)
    last = None
    for step, s in enumerate(samples):
        s.validate()
        assert s.metadata["anchor"] == steps_observation(step, last)
        assert s.metadata["anchor"] in tok.decode(s.prompt_ids)  # what the agent saw
        sampled = [t for t, m in zip(s.response_ids, s.loss_mask, strict=True) if m]
        assert s.metadata["text"] == tok.decode(sampled, skip_special_tokens=True)
        last = s.metadata["text"]


@pytest.mark.slow
def test_gigpo_learns_the_multi_step_toy(tmp_path):
    """GiGPO (episode-level GRPO plus step-level groups by anchor state) through the full path:
    the steps' mean reward rises from about 0.13 to at least 0.8 in 40 steps (measured 0.13 ->
    0.95; plain GRPO over the same steps 0.14 -> 0.98)."""
    rows = train(train_config([f"--config={TOY_STEPS}", f"--output_dir={tmp_path}"]))
    assert sum(r["reward"] for r in rows[:5]) / 5 <= 0.3
    assert sum(r["reward"] for r in rows[-5:]) / 5 >= 0.8
    logged = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["adv/n_samples"] == 4 * 8 * STEPS for r in logged if r["step"] >= 0)


def test_kernel_train_resolves_the_run_once(tmp_path, monkeypatch):
    """``kernel train`` resolves the run in one place, once: the plan the CLI makes is what
    the loop and the runtime start from (issue 65: it was resolved three times)."""
    from kernel.cli import main
    from kernel.run.config import TrainConfig

    calls = []
    resolve = TrainConfig.plan
    monkeypatch.setattr(TrainConfig, "plan", lambda self: calls.append(1) or resolve(self))
    main(["train", "--preset", "toy", "--num_steps", "1", f"--output_dir={tmp_path}"])
    assert len(calls) == 1
    (row,) = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # its start-up profile: each phase's seconds, in order, adding up to the process's age at
    # the first weights (time/startup_s is taken a moment later, at the first rollout)
    # (kernel train spawns the engines first, while the training stack imports)
    phases = ["engines_spawn", "imports", "hooks_and_data", "trainers", "engines_wait"]
    phases = [f"time/startup/{name}_s" for name in [*phases, "first_weights"]]
    assert [k for k in row if k.startswith("time/startup/")] == phases
    assert all(row[k] >= 0 for k in phases) and row[phases[0]] > 0
    assert 0 <= row["time/startup_s"] - sum(row[k] for k in phases) < 1.0


def test_a_turns_own_max_new_tokens_caps_it_below_its_budget(tiny_engine):
    """``speak(sampling={"max_new_tokens": 3})`` samples at most 3 tokens (it was overridden by
    the turn's budget, silently); a cap above the budget leaves the budget in force."""
    from kernel.dialogue import Dialogue

    url, tok = tiny_engine
    agent = AgentHandle("a", [EngineClient(url)], tok, {"temperature": 1.0}, 12, 768)

    async def turn(sampling) -> int:
        d = Dialogue(agent, first="Count to ten.")
        await d.speak(sampling)
        return d.sample(Sample(prompt="p", label=None)).response_length

    async def lengths(cap: int) -> list[int]:
        return list(await asyncio.gather(*(turn({"max_new_tokens": cap}) for _ in range(8))))

    async def both() -> tuple[list[int], list[int]]:
        return await lengths(3), await lengths(1000)

    capped, uncapped = asyncio.run(both())  # one loop: the client's connections live in it
    # + the end-of-turn tokens the template closes an unfinished turn with
    assert max(capped) <= 3 + 2 and max(uncapped) > 5, (capped, uncapped)
    assert max(uncapped) <= 12 + 2


def test_kernel_train_stops_its_early_engines_when_the_run_fails_to_open(
    tmp_path, monkeypatch, capfd
):
    """``kernel train`` spawns the engines before it imports the training stack
    (``kernel.run.engines.early_pools``; a data file that is not there fails before:
    tests/test_errors.py): a data file with a broken row still fails naming the file, and the
    engines already loading are stopped, none left behind."""
    from kernel.cli import main
    from kernel.run import engines

    started, pids = [], []
    early = engines.early_pools

    def spy(plan):
        started.extend(early(plan))
        pids.extend(p.pid for pool in started for p in pool.processes)
        return started

    monkeypatch.setattr(engines, "early_pools", spy)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "a", "label": 1}\n{"prompt": \n')
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--preset", "toy", f"--data.path={broken}", f"--output_dir={tmp_path}"])
    assert exit_.value.code == 2 and "broken.jsonl" in capfd.readouterr().err
    assert started and all(pool.launched_at for pool in started)  # spawned before the data
    assert pids and all(not Path(f"/proc/{pid}").exists() for pid in pids)  # none left
    assert list((tmp_path / "logs").glob("*/engine0.log"))  # they did start


def test_only_a_run_this_process_places_spawns_its_engines_early(tmp_path):
    """Engines given as URLs, or placed by Ray, are not started early ([])."""
    import dataclasses

    from kernel.run.engines import early_pools

    cfg = train_config(["--preset", "toy", f"--output_dir={tmp_path}"])
    given = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, urls=["http://x"]))
    assert early_pools(given.plan()) == []
    on_ray = dataclasses.replace(cfg, ray=dataclasses.replace(cfg.ray, enabled=True))
    assert early_pools(on_ray.plan()) == []


def test_early_engines_stop_when_the_output_folder_refuses_the_run(tmp_path, monkeypatch, capfd):
    """A folder holding another run's checkpoints (no --resume) is refused in Runtime.open,
    after the early engines were spawned: they are stopped too, none left behind."""
    from kernel.cli import main
    from kernel.run import engines

    (tmp_path / "checkpoints" / "step_3").mkdir(parents=True)
    pids = []
    early = engines.early_pools

    def spy(plan):
        pools = early(plan)
        pids.extend(p.pid for pool in pools for p in pool.processes)
        return pools

    monkeypatch.setattr(engines, "early_pools", spy)
    with pytest.raises(SystemExit):
        main(["train", "--preset", "toy", f"--output_dir={tmp_path}"])
    assert "already holds checkpoints" in capfd.readouterr().err
    assert pids and all(not Path(f"/proc/{pid}").exists() for pid in pids)
